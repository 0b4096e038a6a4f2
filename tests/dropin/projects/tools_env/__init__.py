"""A tool environment written against upstream OpenEnv's API, as its ``echo_env`` is shaped (a test fixture).

Its code is openenv's own; its shape is upstream's: an ``MCPEnvironment`` over a FastMCP
server holding its tools, served by ``create_app`` with upstream's MCP action and
observation classes.
"""

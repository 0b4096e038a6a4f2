"""The app's HTTP routes that are OpenEnv's: ``/reset``, ``/step``, ``/state``, ``/mcp``, the Task API.

- `openenv_http`: OpenEnv's plain HTTP routes and ``/openapi.json``.
- `task_api`: the task specs an environment offers, by split.
- `_mcp_sessions`: MCP sessions made over ``POST /mcp`` (OpenEnv 0.10's production mode).
"""

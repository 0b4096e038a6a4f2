"""How FastMCP (in a reference venv) describes the tools of ``tool_docstrings.py``; prints them as JSON.

python reference_tools.py
"""

from __future__ import annotations

import asyncio
import json

from fastmcp import FastMCP
from tool_docstrings import NAMES, DocumentedTools


async def main() -> None:
    server = FastMCP("docstrings")
    tools = DocumentedTools()
    for name in NAMES:
        server.tool(getattr(tools, name))
    listed = {tool.name: tool for tool in await server.list_tools()}
    described = [
        {"name": name, "description": listed[name].description, "parameters": listed[name].parameters} for name in NAMES
    ]
    print(json.dumps(described))


if __name__ == "__main__":
    asyncio.run(main())

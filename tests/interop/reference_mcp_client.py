"""Drive an MCP tool environment with the *reference* ``MCPToolClient`` (openenv-core 0.3.0).

Run with the reference venv's python (see reference_venv.py), never ours:

    python reference_mcp_client.py URL

Prints one JSON object per operation: reset, list_tools, two call_tool, a
step with a ``CallToolAction``, a call of an unknown tool (an error), state,
and close.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

# As in reference_server.py: keep the gradio web UI from being imported.
sys.modules.setdefault("openenv.core.env_server.web_interface", None)  # type: ignore[arg-type]

import openenv  # noqa: E402 - after keeping gradio out

if not os.path.realpath(openenv.__file__).startswith(os.path.realpath(sys.prefix)):
    sys.exit(f"refusing to run: 'openenv' resolves to {openenv.__file__}, not the reference venv ({sys.prefix})")

from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402


def emit(**fields: object) -> None:
    print(json.dumps(fields, sort_keys=True, default=repr), flush=True)


async def main(url: str) -> None:
    async with MCPToolClient(base_url=url) as env:
        result = await env.reset()
        emit(op="reset", observation=type(result.observation).__name__, reward=result.reward, done=result.done)
        tools = await env.list_tools()
        emit(
            op="list_tools",
            tools=[{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools],
        )
        emit(op="call_tool", result=await env.call_tool("echo_message", message="Hello!"))
        emit(op="call_tool", result=await env.call_tool("echo_with_length", message="abc"))
        step = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "stepped"}))
        observation = step.observation
        emit(
            op="step",
            observation=type(observation).__name__,
            tool_name=getattr(observation, "tool_name", None),
            result=getattr(observation, "result", None),
            reward=step.reward,
        )
        try:
            await env.call_tool("no_such_tool", message="x")
        except Exception as exc:
            emit(op="call_tool", ok=False, error_type=type(exc).__name__, error=str(exc))
        else:
            emit(op="call_tool", ok=True)
        emit(op="state", state=(await env.state()).model_dump())
    emit(op="close")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))

"""Drive an MCP tool environment with the *reference* ``MCPToolClient`` (openenv 0.10.0 or openenv-core 0.3.0).

Run with the reference venv's python (see reference_venv.py), never ours:

    python reference_mcp_client.py URL [--mode production|simulation] [--sync]

Prints one JSON object per operation: reset, list_tools, two call_tool, a
step with a ``CallToolAction``, a call of an unknown tool (an error), state,
and close.

``--mode``: 0.10.0's client runs in production mode by default (a session made
over ``POST /mcp``, a WebSocket attached to it, tools called over HTTP);
``simulation`` sets its ``use_production_mode`` to ``False`` before connecting,
so that tools are called with steps over the WebSocket, as 0.3.0's always are.
``--sync`` drives the client through its ``.sync()`` wrapper.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from reference_import import import_reference_openenv

import_reference_openenv()

from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402


def emit(**fields: object) -> None:
    print(json.dumps(fields, sort_keys=True, default=repr), flush=True)


def client_for(url: str, mode: str) -> MCPToolClient:
    env = MCPToolClient(base_url=url)
    if mode == "simulation":
        env.use_production_mode = False  # 0.3.0's has no such flag: it is step-based always
    return env


def report_step(step: Any) -> None:
    observation = step.observation
    emit(
        op="step",
        observation=type(observation).__name__,
        tool_name=getattr(observation, "tool_name", None),
        result=getattr(observation, "result", None),
        reward=step.reward,
        metadata=getattr(step, "metadata", None),
    )


def report_tools(tools: list[Any]) -> None:
    emit(
        op="list_tools",
        tools=[{"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in tools],
    )


def report_error(exc: Exception | None) -> None:
    if exc is None:
        emit(op="call_tool", ok=True)
    else:
        emit(op="call_tool", ok=False, error_type=type(exc).__name__, error=str(exc))


async def run_async(url: str, mode: str) -> None:
    async with client_for(url, mode) as env:
        result = await env.reset()
        emit(op="reset", observation=type(result.observation).__name__, reward=result.reward, done=result.done)
        report_tools(await env.list_tools())
        emit(op="call_tool", result=await env.call_tool("echo_message", message="Hello!"))
        emit(op="call_tool", result=await env.call_tool("echo_with_length", message="abc"))
        report_step(await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "stepped"})))
        failure = None
        try:
            await env.call_tool("no_such_tool", message="x")
        except Exception as exc:
            failure = exc
        report_error(failure)
        emit(op="state", state=(await env.state()).model_dump())
    emit(op="close")


def run_sync(url: str, mode: str) -> None:
    with client_for(url, mode).sync() as env:
        result = env.reset()
        emit(op="reset", observation=type(result.observation).__name__, reward=result.reward, done=result.done)
        report_tools(env.list_tools())
        emit(op="call_tool", result=env.call_tool("echo_message", message="Hello!"))
        emit(op="call_tool", result=env.call_tool("echo_with_length", message="abc"))
        report_step(env.step(CallToolAction(tool_name="echo_message", arguments={"message": "stepped"})))
        failure = None
        try:
            env.call_tool("no_such_tool", message="x")
        except Exception as exc:
            failure = exc
        report_error(failure)
        emit(op="state", state=env.state().model_dump())
    emit(op="close")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--mode", choices=["production", "simulation"], default="production")
    parser.add_argument("--sync", action="store_true")
    args = parser.parse_args()
    if args.sync:
        run_sync(args.url, args.mode)
    else:
        asyncio.run(run_async(args.url, args.mode))


if __name__ == "__main__":
    main()

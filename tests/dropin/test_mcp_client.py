"""Upstream's ``MCPToolClient`` on openenv: the tools of an MCP environment listed and called, async and blocking."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

import openenv
from openenv.core import MCPToolClient
from openenv.core.env_server import CallToolAction, CallToolObservation, Tool
from openenv.examples.echo import EchoEnvironment

pytestmark = pytest.mark.anyio

LIMIT = 30


async def test_tools_are_listed_called_and_refused_as_upstreams_client_does() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(EchoEnvironment) as server, MCPToolClient(base_url=server.url) as env:
            tools = await env.list_tools()
            assert all(isinstance(tool, Tool) for tool in tools)
            assert {tool.name for tool in tools} >= {"echo_message", "echo_with_length"}
            assert await env.list_tools() is tools  # kept
            assert await env.has_tool("echo_message")
            assert await env.get_tool("nothing") is None
            assert await env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}
            with pytest.raises(RuntimeError, match="Tool 'nothing' failed") as caught:
                await env.call_tool("nothing")
            assert isinstance(caught.value.__cause__, openenv.ToolCallError)
            # A step still goes through the environment's step, parsed into upstream's observation.
            await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
            assert isinstance(result.observation, CallToolObservation)
            assert result.observation.tool_name == "echo_message"


async def test_the_blocking_view_calls_tools_too() -> None:
    def use(url: str) -> object:
        with MCPToolClient(base_url=url).sync() as env:
            return env.call_tool("echo_message", message="plain")

    with anyio.fail_after(LIMIT):
        async with openenv.serve(EchoEnvironment) as server:
            assert await anyio.to_thread.run_sync(use, server.url) == "plain"


def test_only_production_mode() -> None:
    with pytest.raises(ValueError, match="only supports 'production' mode"):
        MCPToolClient(base_url="http://127.0.0.1:1", mode="simulation")

"""An MCP tool environment written for upstream (``MCPEnvironment`` over FastMCP), served by openenv.

``test_against_upstream.py`` compares its replies with upstream 0.10.0's own server's.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from tools_env.server import app as tools_apps
from tools_env.server.environment import CounterToolsEnvironment

import openenv
from openenv.core import GenericEnvClient, MCPToolClient
from openenv.core.env_server import CallToolAction, CallToolObservation, ListToolsAction, ListToolsObservation

pytestmark = pytest.mark.anyio

LIMIT = 30


@asynccontextmanager
async def tools_server() -> AsyncIterator[Any]:
    async with openenv.serve(importlib.reload(tools_apps).app) as server:
        yield server


async def test_tools_are_listed_and_called_through_fastmcp() -> None:
    with anyio.fail_after(LIMIT):
        async with tools_server() as server, MCPToolClient(base_url=server.url) as env:
            assert [tool.name for tool in await env.list_tools()] == ["add", "total", "fail"]
            assert await env.call_tool("add", amount=3) == {"added": 3, "total": 3}
            assert await env.call_tool("add", amount=4) == {"added": 4, "total": 7}
            assert await env.call_tool("total") == 7
            with pytest.raises(RuntimeError, match="boom"):
                await env.call_tool("fail", reason="boom")
            with pytest.raises(RuntimeError, match="Tool 'nothing' failed"):
                await env.call_tool("nothing")


async def test_tool_actions_step_the_environment_and_come_back_as_upstreams_observations() -> None:
    with anyio.fail_after(LIMIT):
        async with tools_server() as server, GenericEnvClient(base_url=server.url) as env:
            assert (await env.reset()).metadata == {"status": "ready"}
            listed = await env.step({"type": "list_tools"})
            assert [tool["name"] for tool in listed.observation["tools"]] == ["add", "total", "fail"]
            added = (await env.step({"type": "call_tool", "tool_name": "add", "arguments": {"amount": 2}})).observation
            assert (added["tool_name"], added["error"], added["result"]["data"]) == (
                "add",
                None,
                {"added": 2, "total": 2},
            )
            assert added["result"]["structured_content"] == {"added": 2, "total": 2}
            failed = (
                await env.step({"type": "call_tool", "tool_name": "fail", "arguments": {"reason": "x"}})
            ).observation
            assert failed["result"] is None
            assert failed["error"]["error_type"] == "execution_error"
            with pytest.raises(RuntimeError, match="VALIDATION_ERROR"):
                await env.step({"type": "call_tool"})  # no tool_name: pydantic refuses it


def test_the_environment_in_plain_code_as_upstreams_tests_use_it() -> None:
    env = CounterToolsEnvironment()
    env.reset()
    listed = env.step(ListToolsAction())
    assert isinstance(listed, ListToolsObservation)
    assert [tool.name for tool in listed.tools] == ["add", "total", "fail"]
    called = env.step(CallToolAction(tool_name="add", arguments={"amount": 5}))
    assert isinstance(called, CallToolObservation)
    assert called.result.data == {"added": 5, "total": 5}
    env.close()
    assert env.mcp_client is None


def test_a_tool_with_a_reserved_name_is_refused() -> None:
    from fastmcp import FastMCP

    from openenv.core.env_server.mcp_environment import MCPEnvironment

    server = FastMCP("bad")

    @server.tool
    def reset() -> str:
        return "no"

    class Bad(MCPEnvironment):
        def reset(self, seed: Any = None, episode_id: Any = None, **kwargs: Any) -> Any:
            raise NotImplementedError

        def _step_impl(self, action: Any, timeout_s: Any = None, **kwargs: Any) -> Any:
            raise NotImplementedError

        @property
        def state(self) -> Any:
            raise NotImplementedError

    with pytest.raises(ValueError, match="reserved names"):
        Bad(server)


async def test_fastmcp_session_state_lasts_as_long_as_the_session(anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve(importlib.reload(tools_apps).notes_app) as server,
            MCPToolClient(base_url=server.url) as env,
        ):
            assert await env.call_tool("remember", note="kept") == "kept"
            recalled = await env.call_tool("recall")
            async with MCPToolClient(base_url=server.url) as other:
                assert await other.call_tool("recall") == ""  # each session's state is its own
    # On asyncio one MCP session lasts the whole session, as upstream's server holds one. FastMCP's
    # client runs on asyncio only: on trio each call has a session of its own, and the note is gone.
    assert recalled == ("kept" if anyio_backend == "asyncio" else "")

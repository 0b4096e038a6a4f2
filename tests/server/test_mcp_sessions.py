"""MCP sessions made over ``POST /mcp`` (OpenEnv 0.10's production mode), against a real server.

The reference's own client drives them in ``tests/interop/test_interop.py``; here each
rule is checked on its own with plain HTTP and a raw WebSocket: the session's
lifetime, its bounds, what a WebSocket attached to it may do, and its errors.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest

import openenv
from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment
from tests.envs import AsyncCounterEnv
from tests.helpers import wait_until
from tests.server.test_server_app import RawWebSocket, WebSocketClosed
from transports.admission._sessions import SessionRegistry
from transports.inprocess import InProcessTransport
from transports.mcp_session import MCPSessionTransport
from transports.server.runner import RunningServer
from transports.shared._wrapping import WrappingTransport

pytestmark = pytest.mark.anyio

LIMIT = 30


class MCP:
    """``POST /mcp`` for one server: JSON-RPC requests in, responses out."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http = http
        self.url = f"{url}/mcp"
        self.ids = 0

    async def __call__(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        response = await self.http.post(
            self.url, json={"jsonrpc": "2.0", "method": method, "params": params, "id": self.ids}
        )
        assert response.status_code == 200
        reply: dict[str, Any] = response.json()
        assert reply["id"] == self.ids
        return reply

    async def create(self) -> str:
        reply = await self("openenv/session/create")
        session_id: str = reply["result"]["session_id"]
        return session_id


@asynccontextmanager
async def mcp_server(factory: Any = EchoEnvironment, **options: Any) -> AsyncIterator[tuple[RunningServer, MCP]]:
    async with openenv.serve(factory, **options) as server, httpx.AsyncClient() as http:
        yield server, MCP(http, server.url)


def registry_of(server: RunningServer) -> SessionRegistry:
    registry = server.app.state.sessions
    assert isinstance(registry, SessionRegistry)
    return registry


def attach_url(server: RunningServer, session_id: str) -> str:
    return f"{server.ws_url}?session_id={session_id}"


async def test_a_session_made_over_http_is_shared_by_its_websocket_and_http_calls() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            assert registry_of(server).active == 1
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                assert ws.subprotocol is None  # plain OpenEnv frames
                reset = await ws.request('{"type": "reset", "data": {"episode_id": "shared"}}')
                assert reset["type"] == "observation"
                listing = await mcp("tools/list", session_id=session_id)
                assert [tool["name"] for tool in listing["result"]["tools"]] == ["echo_message", "echo_with_length"]
                call = await mcp("tools/call", name="echo_message", arguments={"message": "hi"}, session_id=session_id)
                assert call["result"]["data"] == "hi"
                step = await ws.request('{"type": "step", "data": {"tool_name": "echo_message", "arguments": {}}}')
                assert step["data"]["observation"]["tool_name"] == "echo_message"
                state = await ws.request('{"type": "state"}')
                # The same environment: the episode the WebSocket reset; HTTP calls bypass step.
                assert state["data"] == {"episode_id": "shared", "step_count": 1}
                # A close request detaches the WebSocket; the session stays.
                await ws.send_text('{"type": "close"}')
                await ws.close()
            await wait_until(lambda: server.app.state.mcp_sessions.attached_count == 0, "the WebSocket detaches")
            call = await mcp("tools/call", name="echo_message", arguments={"message": "still"}, session_id=session_id)
            assert call["result"]["data"] == "still"
            assert (await mcp("openenv/session/close", session_id=session_id))["result"] == {
                "session_id": session_id,
                "closed": True,
            }
            assert registry_of(server).active == 0
            gone = await mcp("tools/list", session_id=session_id)
            assert gone["error"]["code"] == -32602
            assert gone["error"]["message"] == f"Unknown session_id: {session_id}"


async def test_a_session_closed_while_attached_ends_with_its_websocket() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                await ws.request('{"type": "reset"}')
                closing = await mcp("openenv/session/close", session_id=session_id)
                assert closing["result"] == {"session_id": session_id, "closed": False, "closing": True}
                assert registry_of(server).active == 1
                await ws.send_text('{"type": "close"}')
                await ws.close()
            await wait_until(lambda: registry_of(server).active == 0, "the session ends with its WebSocket")
            assert not server.app.state.mcp_sessions


async def test_a_websocket_that_drops_leaves_the_session_open() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                await ws.request('{"type": "reset", "data": {"episode_id": "kept"}}')
            await wait_until(lambda: server.app.state.mcp_sessions.attached_count == 0, "the drop is noticed")
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                assert (await ws.request('{"type": "state"}'))["data"]["episode_id"] == "kept"
                await ws.close()
            await mcp("openenv/session/close", session_id=session_id)


@pytest.mark.parametrize("case", ["unknown", "taken"])
async def test_a_websocket_that_cannot_attach_gets_a_session_error(case: str) -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as holder:
                target = "no-such-session" if case == "unknown" else session_id
                async with RawWebSocket.connect(attach_url(server, target)) as ws:
                    error = await ws.receive_json()
                    assert error["type"] == "error"
                    assert error["data"]["code"] == "SESSION_ERROR"
                    expected = (
                        "Unknown session_id: no-such-session"
                        if case == "unknown"
                        else f"Session {session_id} already has an attached WebSocket"
                    )
                    assert error["data"]["message"] == expected
                    await ws.send_text('{"type": "reset"}')
                    assert (await ws.expect_close()).code == 1000
                # The session and its own WebSocket are unharmed.
                assert (await holder.request('{"type": "reset"}'))["type"] == "observation"
                await holder.close()


async def test_sessions_made_over_http_count_against_the_limit() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server(max_sessions=1) as (server, mcp):
            session_id = await mcp.create()
            refused = await mcp("openenv/session/create")
            assert refused["error"]["code"] == -32000
            assert refused["error"]["message"] == (
                "Server at capacity: 1/1 sessions active. Cannot accept new connections."
            )
            assert refused["error"]["data"] == {"active_sessions": 1, "max_sessions": 1}
            async with RawWebSocket.connect(server.ws_url) as ws:  # a plain session is turned away too
                assert (await ws.receive_json())["data"]["code"] == "CAPACITY_REACHED"
            await mcp("openenv/session/close", session_id=session_id)
            await mcp("openenv/session/close", session_id=await mcp.create())


async def test_sessions_made_over_http_count_toward_their_clients_quota() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server(max_sessions=4, max_sessions_per_client=1) as (server, mcp):
            held = await mcp.create()
            refused = await mcp("openenv/session/create")
            assert refused["error"]["code"] == -32000
            assert "quota" in refused["error"]["message"]
            assert registry_of(server).active == 1  # the server had room: only this client is at its bound
            await mcp("openenv/session/close", session_id=held)
            await mcp("openenv/session/close", session_id=await mcp.create())


async def test_an_attached_session_is_never_idle_and_a_detached_one_is() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server(session_idle_timeout=60) as (server, mcp):
            registry = registry_of(server)
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                await ws.request('{"type": "reset"}')
                # An hour on, the attached session is still not idle: its client is there.
                assert registry.expire_idle(registry.clock.now() + 3600) == []
                await ws.ping()
                await ws.close()
            await wait_until(lambda: server.app.state.mcp_sessions.attached_count == 0, "the WebSocket detaches")
            assert registry.expire_idle(registry.clock.now() + 30) == []  # idle from the detach, not from before
            [expired] = registry.expire_idle(registry.clock.now() + 61)
            assert expired.transport == "mcp"
            await wait_until(lambda: registry.active == 0, "the idle session ends")
            gone = await mcp("tools/list", session_id=session_id)
            assert gone["error"]["message"] == f"Unknown session_id: {session_id}"


async def test_a_plain_websocket_session_is_never_idle_while_connected() -> None:
    """Item 4 of issue 22: OpenEnv 0.10's client reconnects silently, so a live session must not be reaped."""
    with anyio.fail_after(LIMIT):
        async with mcp_server(session_idle_timeout=60) as (server, _):
            registry = registry_of(server)
            async with RawWebSocket.connect(server.ws_url) as ws:
                await ws.request('{"type": "reset", "data": {"episode_id": "long"}}')
                assert registry.expire_idle(registry.clock.now() + 24 * 3600) == []
                assert (await ws.request('{"type": "state"}'))["data"]["episode_id"] == "long"
                await ws.close()


async def test_a_stopping_server_ends_an_attached_session() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            idle_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                await ws.request('{"type": "reset"}')
                registry_of(server).close_all("server shutting down")
                closed = await ws.expect_close()
                assert (closed.code, closed.reason) == (1001, "server shutting down")
            await wait_until(lambda: registry_of(server).active == 0, "both sessions end")
            for ended in (session_id, idle_id):
                assert (await mcp("tools/list", session_id=ended))["error"]["code"] == -32602


async def test_session_requests_that_do_not_fit() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (_, mcp):
            missing = await mcp("openenv/session/close")
            assert (missing["error"]["code"], missing["error"]["message"]) == (
                -32602,
                "Invalid params - 'session_id' is required",
            )
            unknown = await mcp("tools/call", name="echo_message", arguments={}, session_id="nope")
            assert unknown["error"]["message"] == "Unknown session_id: nope"
            session_id = await mcp.create()
            no_name = await mcp("tools/call", arguments={}, session_id=session_id)
            assert (no_name["error"]["code"], no_name["error"]["message"]) == (-32602, "Missing 'name' in params")
            await mcp("openenv/session/close", session_id=session_id)


class BrokenFactoryEnv(EchoEnvironment):
    def __init__(self) -> None:
        raise RuntimeError("no environment today")


async def test_a_factory_that_fails_is_a_server_error() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server(BrokenFactoryEnv) as (server, mcp):
            refused = await mcp("openenv/session/create")
            assert refused["error"]["code"] == -32000
            assert refused["error"]["message"] == "Failed to create environment: RuntimeError: no environment today"
            assert refused["error"]["data"]["factory_name"].endswith("BrokenFactoryEnv")
            assert registry_of(server).active == 0


async def test_an_attached_websocket_gets_errors_and_keeps_its_session() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                assert (await ws.request("not json"))["data"]["code"] == "INVALID_JSON"
                await ws.send_bytes(b'{"type": "state"}')
                assert (await ws.receive_json())["data"]["code"] == "INVALID_JSON"
                assert (await ws.request('{"type": "step", "data": {"bad": 1}}'))["data"]["code"] == "VALIDATION_ERROR"
                assert (await ws.request('{"type": "state"}'))["type"] == "state"
                await ws.close()
            await mcp("openenv/session/close", session_id=session_id)


async def test_websocket_close_without_a_close_request_is_not_fatal() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                await ws.close()
                with pytest.raises(WebSocketClosed):
                    await ws.receive()
            await wait_until(lambda: server.app.state.mcp_sessions.attached_count == 0, "the WebSocket detaches")
            assert (await mcp("tools/list", session_id=session_id))["result"]["tools"]
            await mcp("openenv/session/close", session_id=session_id)


# -- openenv's client in production mode ------------------------------------------------


@pytest.mark.parametrize("scheme", ["http", "http+mcp"])
async def test_our_client_in_production_mode(scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server() as (server, mcp):
            url = server.url.replace("http", scheme, 1)
            async with EchoEnv(url, mode="production") as env:
                await env.reset(episode_id="prod")
                assert [tool.name for tool in await env.list_tools()] == ["echo_message", "echo_with_length"]
                assert await env.call_tool("echo_with_length", message="abc") == {"message": "abc", "length": 3}
                with pytest.raises(openenv.ToolCallError) as caught:
                    await env.call_tool("no_such_tool")
                assert caught.value.error_type == "tool_not_found"
                with pytest.raises(openenv.ToolCallError) as caught:
                    await env.call_tool("echo_message", message=[1])
                assert caught.value.error_type == "invalid_args"
                assert (await env.state()).step_count == 0  # tools bypass step in production mode
                if scheme == "http+mcp":
                    transport = env.transport
                    assert isinstance(transport, MCPSessionTransport)
                    session_id = transport.session_id
                    assert session_id is not None
                    assert [lease.transport for lease in registry_of(server).leases()] == ["mcp"]
                    # Another MCP client reaches the very environment the client steps.
                    call = await mcp(
                        "tools/call", name="echo_message", arguments={"message": "x"}, session_id=session_id
                    )
                    assert call["result"]["data"] == "x"
            await wait_until(lambda: registry_of(server).active == 0, "the session ends with the client")
            if scheme == "http+mcp":
                gone = await mcp("tools/list", session_id=session_id)
                assert gone["error"]["message"] == f"Unknown session_id: {session_id}"


async def test_an_mcp_session_at_capacity_is_a_typed_error() -> None:
    with anyio.fail_after(LIMIT):
        async with mcp_server(max_sessions=1) as (server, _), EchoEnv(server.url) as holder:
            await holder.reset()
            with pytest.raises(openenv.CapacityReachedError) as caught:
                async with EchoEnv(server.url.replace("http", "http+mcp", 1)):
                    pass
            assert caught.value.data["max_sessions"] == 1
            assert (await holder.call_tool("echo_message", message="still")) == "still"


def test_a_mode_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="mode must be 'simulation' or 'production'"):
        EchoEnv("ws://127.0.0.1:1", mode="prod")  # type: ignore[arg-type]


async def test_a_session_id_stays_out_of_the_logs(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """It is the session's only credential (as on OpenEnv's server): a log shows a prefix at most."""
    caplog.set_level(logging.DEBUG)
    with anyio.fail_after(LIMIT):
        async with mcp_server(log_level="debug") as (server, mcp):
            session_id = await mcp.create()
            async with RawWebSocket.connect(attach_url(server, session_id)) as ws:
                await ws.request('{"type": "reset"}')
                await ws.close()
            await mcp("tools/list", session_id=session_id)
            await mcp("openenv/session/close", session_id=session_id)
    server_loggers = ("uvicorn", "hypercorn", "openenv")  # not the test's own clients'
    logged = "\n".join(record.getMessage() for record in caplog.records if record.name.startswith(server_loggers))
    logged += capsys.readouterr().out  # hypercorn writes its access log to stdout
    assert f"MCP session {session_id[:8]}… opened" in logged  # the logs were on
    assert session_id not in logged


class _KeptTransport(openenv.Transport):
    """A stand-in inner transport: records that its owner ran its idle work."""

    def __init__(self) -> None:
        self.kept = anyio.Event()

    async def __aenter__(self) -> _KeptTransport:
        return self

    async def send(self, frame: bytes) -> None:
        raise NotImplementedError

    async def receive(self) -> bytes:
        raise NotImplementedError

    async def keep(self) -> None:
        self.kept.set()
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        pass


@pytest.mark.parametrize("wrapper", ["http+mcp", "project"])
async def test_a_wrapping_transport_runs_its_inner_ones_idle_work(wrapper: str, tmp_path: Any) -> None:
    """The client's owner runs `keep` on the transport it holds: one that wraps another must run the other's."""
    from transports.project import ProjectTransport

    inner = _KeptTransport()
    outer: openenv.Transport
    if wrapper == "http+mcp":
        outer = MCPSessionTransport("http+mcp://127.0.0.1:9")
        outer._inner = inner
    else:
        (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\n')
        (tmp_path / "server").mkdir()
        (tmp_path / "server" / "app.py").write_text("app = None\n")
        outer = ProjectTransport(f"project://{tmp_path}", cache_dir=tmp_path / "cache")
        outer._inner = inner
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(outer.keep)
            await inner.kept.wait()
            task_group.cancel_scope.cancel()


async def test_a_pool_over_mcp_sessions_sends_as_their_websockets_do() -> None:
    """A wrapper takes on its inner transport's ``send_waits``: the pool then sends its batch from one task."""
    with anyio.fail_after(LIMIT):
        async with (
            mcp_server() as (server, _),
            openenv.EnvPool(server.url.replace("http", "http+mcp", 1), size=3, client=EchoEnv) as pool,
        ):
            transports = [client.transport for client in pool.clients]
            assert all(isinstance(transport, MCPSessionTransport) for transport in transports)
            assert [transport.send_waits for transport in transports if transport is not None] == [False] * 3
            await pool.reset()
            actions = [CallToolAction(tool_name="echo_message", arguments={"message": f"m{n}"}) for n in range(3)]
            results = await pool.step(actions)
            assert [result.observation.result for result in results] == ["m0", "m1", "m2"]  # type: ignore[union-attr]
            assert [lease.transport for lease in registry_of(server).leases()] == ["mcp"] * 3


class _InProcessWrapper(WrappingTransport):
    """A wrapper whose inner transport is an in-process session of the counter environment."""

    async def __aenter__(self) -> _InProcessWrapper:
        inner = InProcessTransport(factory=AsyncCounterEnv)
        await inner.__aenter__()
        self._wrap(inner)
        return self

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()


async def test_a_wrapping_transport_hands_frames_over_without_waiting_when_its_inner_one_can() -> None:
    with anyio.fail_after(LIMIT):
        async with _InProcessWrapper() as wrapper:
            assert wrapper.send_waits is False
            with pytest.raises(anyio.WouldBlock):
                wrapper.receive_nowait()  # nothing sent yet
            wrapper.send_nowait(b'{"type": "reset", "data": {"start": 5}}')
            reply = json.loads(await wrapper.receive())
            assert reply["type"] == "observation"
            assert reply["data"]["observation"]["count"] == 5
        with pytest.raises(openenv.ConnectionClosed):
            wrapper.send_nowait(b'{"type": "state"}')

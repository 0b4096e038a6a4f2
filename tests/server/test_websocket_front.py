"""hypercorn+websockets, trio's default server: WebSocket upgrades by websockets' protocol, the rest by hypercorn.

The hostile-client tests (tests/robustness/test_hostile_clients.py) run against it as
against every server; these check what is its own: the split of connections
by their request head, and the WebSocket protocol's edges (fragments, a bad
handshake; bad UTF-8 is a hostile-client test). The server runs on trio only.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from websockets.client import ClientProtocol

from tests.server.test_server_app import RawWebSocket, WebSocketClosed, WireEchoEnv
from transports.server.drivers import _websocket_front as front
from transports.server.drivers._websocket_front import HEAD_LIMIT, is_websocket_upgrade
from transports.server.runner import RunningServer, serve

pytestmark = pytest.mark.anyio

LIMIT = 60  # seconds: the bound of every test's waits

_UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@asynccontextmanager
async def serving(**options: Any) -> AsyncIterator[RunningServer]:
    async with serve(WireEchoEnv, server="hypercorn+websockets", **options) as server:
        yield server


async def _response(stream: Any) -> bytes:
    """Everything the server sends until it closes the connection."""
    data = b""
    try:
        while True:
            data += await stream.receive()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        return data


async def _reset_works(server: RunningServer) -> None:
    async with RawWebSocket.connect(server.ws_url) as ws:
        assert (await ws.request('{"type":"reset"}'))["type"] == "observation"
        await ws.close()


def test_only_a_complete_get_asking_for_websocket_is_an_upgrade() -> None:
    assert is_websocket_upgrade(_UPGRADE)
    assert is_websocket_upgrade(_UPGRADE.replace(b"Upgrade: websocket", b"upgrade:  WebSocket"))
    assert not is_websocket_upgrade(_UPGRADE[:-2])  # the head is not complete
    assert not is_websocket_upgrade(_UPGRADE.replace(b"GET ", b"POST "))
    assert not is_websocket_upgrade(_UPGRADE.replace(b"Upgrade: websocket", b"Upgrade: h2c"))
    assert not is_websocket_upgrade(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")


@pytest.mark.speed_path
async def test_a_session_and_the_http_routes_share_the_port() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server:
            assert server.server == "hypercorn+websockets"
            async with RawWebSocket.connect(server.ws_url) as ws:
                assert (await ws.request('{"type":"reset"}'))["type"] == "observation"
                reply = await ws.request('{"type":"step","data":{"message":"hi"}}')
                assert reply["data"]["observation"]["echoed_message"] == "hi"
                # A request whose head comes in pieces, then a second on the same connection: hypercorn's.
                async with await anyio.connect_tcp(server.host, server.port) as http:
                    for piece in (b"GET /hea", b"lth HTTP/1.1\r\nHo", b"st: x\r\n\r\n"):
                        await http.send(piece)
                    response = b""
                    while not response.endswith(b'{"status":"healthy"}'):
                        response += await http.receive()
                    assert response.startswith(b"HTTP/1.1 200")
                    await http.send(
                        b"POST /reset HTTP/1.1\r\nHost: localhost\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                    )
                    assert (await _response(http)).startswith(b"HTTP/1.1 200")
                await ws.close()


async def test_a_fragmented_message_is_one_request() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server, RawWebSocket.connect(server.ws_url) as ws:
            protocol = ws._protocol
            protocol.send_text(b'{"type":"step","data":', fin=False)
            protocol.send_continuation(b'{"message":"in ', fin=False)
            protocol.send_continuation(b'parts"}}', fin=True)
            await ws._flush()
            reply = await ws.receive()
            assert isinstance(reply, str)
            assert '"echoed_message":"in parts"' in reply
            await ws.close()


@pytest.mark.speed_path
async def test_a_bad_handshake_gets_an_http_error_and_the_server_serves_on() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server:
            async with await anyio.connect_tcp(server.host, server.port) as stream:
                await stream.send(_UPGRADE.replace(b"Sec-WebSocket-Version: 13", b"Sec-WebSocket-Version: 8"))
                assert (await _response(stream)).startswith(b"HTTP/1.1 4")
            async with await anyio.connect_tcp(server.host, server.port) as stream:
                await stream.send(_UPGRADE.replace(b"GET /ws ", b"GET /nowhere "))
                assert (await _response(stream)).startswith(b"HTTP/1.1 403")
            await _reset_works(server)


async def test_a_head_too_large_is_left_to_hypercorn_which_refuses_it() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server:
            async with await anyio.connect_tcp(server.host, server.port) as stream:
                await stream.send(b"GET /health HTTP/1.1\r\nX-Filler: " + b"a" * (4 * HEAD_LIMIT) + b"\r\n\r\n")
                response = await _response(stream)
                assert not response.startswith(b"HTTP/1.1 200")
            await _reset_works(server)


class _CloseCodes:
    """An ASGI WebSocket endpoint that accepts, takes one message and notes the close code that follows."""

    def __init__(self) -> None:
        self.codes: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        assert (await receive())["type"] == "websocket.receive"
        self.codes.append((await receive())["code"])


@pytest.mark.speed_path
async def test_the_close_code_of_the_client_reaches_the_app() -> None:
    endpoint = _CloseCodes()
    app = Starlette(routes=[WebSocketRoute("/ws", endpoint)])
    with anyio.fail_after(LIMIT):
        async with serve(app, server="hypercorn+websockets") as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.send_text("hello")
            ws._protocol.send_close(4321, "done")
            await ws._flush()
            with pytest.raises(WebSocketClosed):
                await ws.receive()
    assert endpoint.codes == [4321]


class _FailsAfterAccepting:
    """An ASGI WebSocket endpoint that accepts, then raises."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        raise RuntimeError("the endpoint broke")


async def test_an_app_that_fails_ends_its_connection_with_1011_and_the_server_serves_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Starlette(routes=[WebSocketRoute("/ws", _FailsAfterAccepting()), WebSocketRoute("/echo", _CloseCodes())])
    with anyio.fail_after(LIMIT):
        async with serve(app, server="hypercorn+websockets") as server:
            for _ in range(2):
                async with RawWebSocket.connect(server.ws_url) as ws:
                    with pytest.raises(WebSocketClosed) as closed:
                        await ws.receive()
                    assert closed.value.code == 1011
            async with RawWebSocket.connect(server.ws_url.replace("/ws", "/echo")) as ws:
                await ws.send_text("still serving")
                await ws.close()
    assert "the endpoint broke" in caplog.text


class _SendsOnly:
    """An ASGI WebSocket endpoint that sends a burst without receiving, noting whether another task ran meanwhile."""

    BURST = 100

    def __init__(self) -> None:
        self.others_ran_during_the_burst: bool | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        other_ran = anyio.Event()

        async def other() -> None:
            other_ran.set()

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(other)
            for index in range(self.BURST):
                await send({"type": "websocket.send", "text": str(index)})
            self.others_ran_during_the_burst = other_ran.is_set()
        await send({"type": "websocket.close", "code": 1000})


async def test_an_app_that_only_sends_still_lets_other_tasks_run() -> None:
    endpoint = _SendsOnly()
    app = Starlette(routes=[WebSocketRoute("/ws", endpoint)])
    with anyio.fail_after(LIMIT):
        async with serve(app, server="hypercorn+websockets") as server, RawWebSocket.connect(server.ws_url) as ws:
            received = [await ws.receive() for _ in range(_SendsOnly.BURST)]
            assert received == [str(index) for index in range(_SendsOnly.BURST)]
            with pytest.raises(WebSocketClosed):
                await ws.receive()
    assert endpoint.others_ran_during_the_burst is True


# -- reading for an app that is away from receive (a step running) -----------------------


@pytest.fixture
def soon_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection reads for an app away from ``receive`` after a hundredth of a second, not a whole one."""
    monkeypatch.setattr(front, "AWAY_BEFORE_READING", 0.01)


class _AwayThenEcho:
    """An ASGI WebSocket endpoint that accepts, stays away from ``receive`` until ``back`` is set, then echoes.

    It notes the messages it gets and the close code that ends the connection; with ``leave``, it
    returns once back instead of echoing.
    """

    def __init__(self, *, leave: bool = False) -> None:
        self.back = anyio.Event()
        self.leave = leave
        self.received: list[str] = []
        self.codes: list[int] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        assert (await receive())["type"] == "websocket.connect"
        await send({"type": "websocket.accept"})
        await self.back.wait()
        if self.leave:
            return
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                self.codes.append(message["code"])
                return
            self.received.append(message["text"])
            with contextlib.suppress(OSError):  # the client may have closed meanwhile
                await send({"type": "websocket.send", "text": message["text"]})


@asynccontextmanager
async def _away(endpoint: _AwayThenEcho, **options: Any) -> AsyncIterator[RawWebSocket]:
    app = Starlette(routes=[WebSocketRoute("/ws", endpoint)])
    async with serve(app, server="hypercorn+websockets", **options) as server:
        try:
            async with RawWebSocket.connect(server.ws_url) as ws:
                yield ws
        finally:
            endpoint.back.set()  # however the test ends, the app comes back and the server can stop


@pytest.mark.speed_path
async def test_the_app_away_has_its_pings_answered_and_gets_every_message_after(soon_away: None) -> None:
    endpoint = _AwayThenEcho()
    with anyio.fail_after(LIMIT):
        async with _away(endpoint) as ws:
            await ws.send_text("one")
            await ws.ping(b"first")  # read for the app, which is away: "one" waits for it
            await ws.ping(b"second")
            endpoint.back.set()
            assert await ws.receive() == "one"
            # The app reads for itself again: the read made for it while it was away gave way.
            await ws.send_text("two")
            assert await ws.receive() == "two"
            await ws.ping(b"third")
            await ws.close(4000)
    assert endpoint.received == ["one", "two"]
    assert endpoint.codes == [4000]


@pytest.mark.speed_path
async def test_a_close_while_the_app_is_away_is_answered_and_reaches_the_app(soon_away: None) -> None:
    endpoint = _AwayThenEcho()
    with anyio.fail_after(LIMIT):
        async with _away(endpoint) as ws:
            await ws.send_text("before closing")
            ws._protocol.send_close(4001, "bye")
            await ws._flush()
            # The server's half of the closing handshake comes while the app is still away.
            assert (await ws.expect_close()).code == 4001
            endpoint.back.set()
    assert endpoint.received == ["before closing"]
    assert endpoint.codes == [4001]


async def test_a_message_too_large_while_the_app_is_away_ends_the_connection_with_1009(soon_away: None) -> None:
    endpoint = _AwayThenEcho()
    with anyio.fail_after(LIMIT):
        async with _away(endpoint, max_message_size=1024) as ws:
            await ws.ping(b"reading")
            await ws.send_text("x" * 2048)
            assert (await ws.expect_close()).code == 1009


@pytest.mark.speed_path
async def test_the_app_returning_while_read_for_ends_the_read_and_the_connection(soon_away: None) -> None:
    endpoint = _AwayThenEcho(leave=True)
    with anyio.fail_after(LIMIT):
        async with _away(endpoint) as ws:
            await ws.ping()  # a read for the app now waits for more bytes
            endpoint.back.set()
            assert (await ws.expect_close()).code == 1000


@pytest.mark.parametrize("flood", ["messages", "pings"])
async def test_reading_for_an_app_away_is_bounded(soon_away: None, flood: str) -> None:
    """Messages wait for the app up to a bound, pongs are written before more is read: a flooder is held back."""
    limit = 64 * 1024 * 1024  # far beyond what the socket buffers on the way hold
    endpoint = _AwayThenEcho()
    with anyio.fail_after(LIMIT):
        async with _away(endpoint) as ws:
            await ws.ping()  # the connection reads for the app: it is away

            def frames(protocol: ClientProtocol) -> None:
                for _ in range(1000):
                    if flood == "messages":
                        protocol.send_text(b"m" * 1000)
                    else:
                        protocol.send_ping(b"p" * 125)

            await ws.flood(frames, limit)

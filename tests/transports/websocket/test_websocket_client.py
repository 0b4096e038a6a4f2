"""The WebSocket transport's client side, against a small sans-I/O server in this file.

The server is websockets' `ServerProtocol` over an anyio TCP listener, so every
test runs on asyncio and on trio alike, on loopback, with an ephemeral port.
Each test scripts the server's side with a handler coroutine.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import struct
import subprocess
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import pytest
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.tls import TLSStream
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Request
from websockets.server import ServerProtocol
from websockets.typing import Subprotocol

import transports.websocket as websocket_package
from openenv import ClientStateError, ConnectError, ConnectionClosed, Dialect, ProtocolError
from tests.helpers import ManualClock, all_tasks_blocked, wait_until
from transports.websocket import (
    JSON_SUBPROTOCOL,
    LINK_JSON_SUBPROTOCOL,
    LINK_MSGPACK_SUBPROTOCOL,
    MSGPACK_SUBPROTOCOL,
    SUBPROTOCOLS,
    WebSocketTransport,
)
from transports.websocket._client import websocket_url
from transports.websocket._link import RECEIVE_BUFFER

pytestmark = pytest.mark.anyio

WAIT = 5.0  # the bound on any single wait in these tests


class ServerConnection:
    """The server's end of one connection, driven by hand from a test's handler."""

    def __init__(self, stream: SocketStream, *, compression: bool) -> None:
        self.stream = stream
        self.protocol = ServerProtocol(
            extensions=[ServerPerMessageDeflateFactory()] if compression else None,
            max_size=None,
        )
        self.events: deque[Frame] = deque()
        self.request: Request | None = None
        self.eof = False

    async def flush(self) -> None:
        for data in self.protocol.data_to_send():
            if data:
                await self.stream.send(data)
            else:
                await self.stream.aclose()

    async def _pump(self) -> bool:
        """Read once from the socket; False at its end."""
        try:
            data = await self.stream.receive(65536)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            self.eof = True
            self.protocol.receive_eof()
            await self.flush()
            return False
        self.protocol.receive_data(data)
        for event in self.protocol.events_received():
            if isinstance(event, Request):
                self.request = event
            else:
                assert isinstance(event, Frame)
                self.events.append(event)
        await self.flush()  # pongs and the close echo, as any server would
        return True

    async def read_request(self) -> Request:
        while self.request is None:
            assert await self._pump(), "the client went away before its handshake"
        return self.request

    async def accept(self, subprotocol: str | None = None, *, force_subprotocol: str | None = None) -> None:
        """Complete the handshake, selecting ``subprotocol`` if the client offered it."""
        request = await self.read_request()
        chosen = None if subprotocol is None else Subprotocol(subprotocol)

        def select(offered: Sequence[Subprotocol]) -> Subprotocol | None:
            return chosen if chosen in offered else None

        self.protocol.select_subprotocol = select  # type: ignore[method-assign,assignment]
        response = self.protocol.accept(request)
        assert response.status_code == 101, response.body
        if force_subprotocol is not None:
            response.headers["Sec-WebSocket-Protocol"] = force_subprotocol
        self.protocol.send_response(response)

    async def reject(self, status: int, text: str) -> None:
        await self.read_request()
        self.protocol.send_response(self.protocol.reject(status, text))
        await self.flush()

    async def next_frame(self) -> Frame | None:
        """The next frame from the client, or None once the connection ended."""
        while not self.events:
            if not await self._pump():
                return None
        return self.events.popleft()

    async def next_message(self) -> Frame | None:
        """The next data frame, skipping control frames."""
        while (frame := await self.next_frame()) is not None:
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                return frame
        return None

    async def echo(self) -> None:
        """Echo each message with its own opcode, until the client closes."""
        while (frame := await self.next_message()) is not None:
            if frame.opcode is Opcode.TEXT:
                self.protocol.send_text(frame.data)
            else:
                self.protocol.send_binary(frame.data)
            await self.flush()

    async def ping_until_gone(self, payload: bytes, pong: anyio.Event) -> None:
        """Ping the client, set ``pong`` when its answer comes, read on until the client goes away."""
        self.protocol.send_ping(payload)
        await self.flush()
        while (frame := await self.next_frame()) is not None:
            if frame.opcode is Opcode.PONG and frame.data == payload:
                pong.set()

    async def drain(self) -> None:
        """Answer control frames (the closing handshake) until the client goes away."""
        while await self.next_frame() is not None:
            pass

    async def abort(self, *, reset: bool = False) -> None:
        """Drop the TCP connection without a closing handshake (an RST if ``reset``)."""
        if reset:
            raw = self.stream.extra(SocketAttribute.raw_socket)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self.stream.aclose()


Handler = Callable[[ServerConnection], Awaitable[None]]


class Server:
    def __init__(self, port: int, scheme: str) -> None:
        self.port = port
        self.url = f"{scheme}://127.0.0.1:{port}"
        self.connections: list[ServerConnection] = []


@asynccontextmanager
async def serve(
    handler: Handler, *, compression: bool = True, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[Server]:
    """Serve ``handler`` on an ephemeral loopback port for the duration of the block."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    server = Server(listener.extra(SocketAttribute.local_port), "https" if ssl_context else "http")

    async def handle(stream: SocketStream) -> None:
        async with stream:
            if ssl_context is not None:
                try:
                    tls = await TLSStream.wrap(
                        stream, server_side=True, ssl_context=ssl_context, standard_compatible=False
                    )
                except (anyio.BrokenResourceError, anyio.EndOfStream, ssl.SSLError):
                    return  # the client did not trust us: part of the TLS test
                stream = tls  # type: ignore[assignment]
            connection = ServerConnection(stream, compression=compression)
            server.connections.append(connection)
            try:
                await handler(connection)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass  # the client went away: part of several tests
            finally:
                await stream.aclose()

    async with listener, anyio.create_task_group() as task_group:
        task_group.start_soon(listener.serve, handle)
        yield server
        task_group.cancel_scope.cancel()


@asynccontextmanager
async def kept(transport: WebSocketTransport) -> AsyncIterator[WebSocketTransport]:
    """Run the transport's idle work for the block's length, as its owner (an `async with` client) does."""
    async with anyio.create_task_group() as owner:
        owner.start_soon(transport.keep)
        try:
            yield transport
        finally:
            owner.cancel_scope.cancel()


async def echo_handler(connection: ServerConnection) -> None:
    await connection.accept(JSON_SUBPROTOCOL)
    await connection.flush()
    await connection.echo()


# -- URLs and configuration ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://localhost:8000", "ws://localhost:8000/ws"),
        ("http://localhost:8000/", "ws://localhost:8000/ws"),
        ("https://example.com", "wss://example.com/ws"),
        ("https://example.com/env//", "wss://example.com/env/ws"),
        ("HTTP://localhost:8000", "ws://localhost:8000/ws"),
        ("ws://localhost:8000", "ws://localhost:8000/ws"),
        ("wss://example.com/base/", "wss://example.com/base/ws"),
        # The endpoint's own URL, as OpenEnv users write it, is taken as it is (OpenEnv's client would append).
        ("ws://localhost:8000/ws", "ws://localhost:8000/ws"),
        ("http://h/env/ws/", "ws://h/env/ws"),
        ("ws://h/ws/ws", "ws://h/ws/ws"),  # an app mounted at /ws: its endpoint, written out
        ("ws://h/news", "ws://h/news/ws"),
        ("localhost:8000", "ws://localhost:8000/ws"),
        ("http://h:1/p/?token=a/b", "ws://h:1/p/ws?token=a/b"),
    ],
)
def test_websocket_url_maps_like_openenv(url: str, expected: str) -> None:
    assert websocket_url(url) == expected
    assert WebSocketTransport(url).url == expected


def test_constructor_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError, match="URL"):
        WebSocketTransport("ftp://localhost")
    with pytest.raises(ValueError, match="encoding"):
        WebSocketTransport("http://localhost", encoding="xml")
    with pytest.raises(ValueError, match="ssl_context"):
        WebSocketTransport("http://localhost", ssl_context=ssl.create_default_context())
    with pytest.raises(ValueError, match="handshake"):
        WebSocketTransport("http://localhost", headers={"Sec-WebSocket-Protocol": "x"})
    with pytest.raises(ValueError, match="header"):
        WebSocketTransport("http://localhost", headers=[("X-Bad", "a\r\nb")])


def test_package_exports() -> None:
    assert sorted(websocket_package.__all__) == websocket_package.__all__
    for name in websocket_package.__all__:
        assert hasattr(websocket_package, name)


# -- handshake and dialects ----------------------------------------------------


async def test_json_dialect_echo_round_trip() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                assert transport.subprotocol == JSON_SUBPROTOCOL
                assert transport.dialect == Dialect(encoding="json", request_ids=True)
                for n in range(20):
                    frame = b'{"type": "step", "data": {"n": %d}}' % n
                    await transport.send(frame)
                    assert await transport.receive() == frame
            request = server.connections[0].request
            assert request is not None
            assert request.path == "/ws"
            # The link subprotocol first: this server does not speak it, so it selects the one-session one.
            assert request.headers["Sec-WebSocket-Protocol"] == f"{LINK_JSON_SUBPROTOCOL}, {JSON_SUBPROTOCOL}"
            assert "permessage-deflate" in request.headers["Sec-WebSocket-Extensions"]
            assert request.headers["User-Agent"].startswith("openenv/")


async def test_msgpack_dialect_sends_binary_frames() -> None:
    opcodes: list[Opcode] = []

    async def handler(connection: ServerConnection) -> None:
        await connection.accept(MSGPACK_SUBPROTOCOL)
        await connection.flush()
        while (frame := await connection.next_message()) is not None:
            opcodes.append(frame.opcode)
            connection.protocol.send_binary(frame.data)
            await connection.flush()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, encoding="msgpack") as transport:
                assert transport.subprotocol == MSGPACK_SUBPROTOCOL
                assert transport.dialect == SUBPROTOCOLS[MSGPACK_SUBPROTOCOL]
                payload = bytes(range(256))
                await transport.send(payload)
                assert await transport.receive() == payload
            request = server.connections[0].request
            assert request is not None
            assert request.headers["Sec-WebSocket-Protocol"] == (
                f"{LINK_MSGPACK_SUBPROTOCOL}, {LINK_JSON_SUBPROTOCOL}, {MSGPACK_SUBPROTOCOL}, {JSON_SUBPROTOCOL}"
            )
    assert opcodes == [Opcode.BINARY]


async def test_json_dialect_sends_text_frames() -> None:
    opcodes: list[Opcode] = []

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()  # selects nothing: plain OpenEnv
        await connection.flush()
        while (frame := await connection.next_message()) is not None:
            opcodes.append(frame.opcode)
            connection.protocol.send_text(frame.data)
            await connection.flush()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                assert transport.subprotocol is None
                assert transport.dialect == Dialect()
                await transport.send(b'{"type": "state"}')
                assert await transport.receive() == b'{"type": "state"}'
    assert opcodes == [Opcode.TEXT]


async def test_no_subprotocols_offered_and_no_compression() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, subprotocols=[], compression=False) as transport:
                assert transport.dialect == Dialect()
                await transport.send(b"{}")
                assert await transport.receive() == b"{}"
            request = server.connections[0].request
            assert request is not None
            assert "Sec-WebSocket-Protocol" not in request.headers
            assert "Sec-WebSocket-Extensions" not in request.headers


async def test_extra_headers_reach_the_server() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            headers = {"Authorization": "Bearer s3cret", "User-Agent": "my-agent/1.0"}
            async with WebSocketTransport(server.url, headers=headers):
                pass
            async with WebSocketTransport(server.url, headers=[("X-Trace", "a"), ("X-Trace", "b")]):
                pass
        first, second = (connection.request for connection in server.connections)
        assert first is not None
        assert second is not None
    assert first.headers["Authorization"] == "Bearer s3cret"
    assert first.headers.get_all("User-Agent") == ["my-agent/1.0"]
    assert second.headers.get_all("X-Trace") == ["a", "b"]


async def test_unoffered_subprotocol_is_a_connect_error() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept(force_subprotocol="chat.v9")
        await connection.flush()
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectError, match=r"chat\.v9"):
                async with WebSocketTransport(server.url):
                    pytest.fail("connected")
            with pytest.raises(ConnectError, match=r"chat\.v9"):
                async with WebSocketTransport(server.url, subprotocols=[]):
                    pytest.fail("connected")


async def test_a_selected_subprotocol_without_a_dialect_is_a_connect_error() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept("custom.v1")
        await connection.flush()
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectError, match=r"custom\.v1"):
                async with WebSocketTransport(server.url, subprotocols=["custom.v1"]):
                    pytest.fail("connected")


@pytest.mark.parametrize("status", [403, 404, 503])
async def test_http_error_on_handshake_is_a_connect_error(status: int) -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.reject(status, "go away")

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectError, match=f"HTTP {status}") as caught:
                async with WebSocketTransport(server.url):
                    pytest.fail("connected")
    assert "go away" in str(caught.value)


async def test_a_redirect_is_a_connect_error_and_not_followed() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.read_request()
        response = connection.protocol.reject(302, "moved")
        response.headers["Location"] = f"ws://127.0.0.1:{server.port}/elsewhere"
        connection.protocol.send_response(response)
        await connection.flush()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectError, match="HTTP 302"):
                async with WebSocketTransport(server.url):
                    pytest.fail("connected")
    assert len(server.connections) == 1  # the Location was not visited


async def test_connection_refused_is_a_connect_error() -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(SocketAttribute.local_port)
    await listener.aclose()
    with anyio.fail_after(WAIT):
        with pytest.raises(ConnectError, match="cannot connect"):
            async with WebSocketTransport(f"http://127.0.0.1:{port}"):
                pytest.fail("connected")


async def test_connect_timeout_is_a_connect_error() -> None:
    async def handler(connection: ServerConnection) -> None:
        await anyio.sleep_forever()  # accepts TCP, never answers the handshake

    clock = ManualClock()
    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.advance_when_blocked, 10.0)  # once the handshake waits for its answer
                with pytest.raises(ConnectError, match=r"timed out after 10\.0 s"):
                    async with WebSocketTransport(server.url, connect_timeout=10.0, clock=clock):
                        pytest.fail("connected")


async def test_server_closing_during_the_handshake_is_a_connect_error() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.read_request()
        await connection.abort()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            with pytest.raises(ConnectError, match="during the WebSocket handshake"):
                async with WebSocketTransport(server.url):
                    pytest.fail("connected")


async def test_invalid_url_is_a_connect_error() -> None:
    with pytest.raises(ConnectError, match="invalid WebSocket URL"):
        async with WebSocketTransport("http://"):
            pytest.fail("connected")


async def test_a_transport_connects_only_once() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            transport = WebSocketTransport(server.url)
            async with transport:
                pass
            with pytest.raises(ClientStateError):
                await transport.__aenter__()


# -- receiving, closing, breaking ------------------------------------------------


async def test_frames_sent_with_the_handshake_response_are_received() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept(JSON_SUBPROTOCOL)
        connection.protocol.send_text(b'{"type": "error"}')
        connection.protocol.send_close(1013, "try again later")
        await connection.flush()  # the response, the frame and the close: one write
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                assert await transport.receive() == b'{"type": "error"}'
                with pytest.raises(ConnectionClosed, match=r"1013.*try again later"):
                    await transport.receive()


async def test_fragmented_messages_are_reassembled() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        connection.protocol.send_text(b'{"a": ', fin=False)
        connection.protocol.send_continuation(b"1", fin=False)
        connection.protocol.send_continuation(b"}", fin=True)
        await connection.flush()
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                assert await transport.receive() == b'{"a": 1}'


async def test_server_close_ends_receive_after_queued_frames() -> None:
    closed = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        connection.protocol.send_text(b"one")
        connection.protocol.send_text(b"two")
        connection.protocol.send_close(1001, "going away")
        await connection.flush()
        await connection.drain()  # the client echoes the close frame
        closed.set()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport, kept(transport):
                await closed.wait()
                assert await transport.receive() == b"one"
                assert await transport.receive() == b"two"
                with pytest.raises(ConnectionClosed, match=r"1001.*going away"):
                    await transport.receive()
                with pytest.raises(ConnectionClosed, match="1001"):
                    await transport.receive()
                with pytest.raises(ConnectionClosed):
                    await transport.send(b"{}")
    close_echo = server.connections[0].protocol.close_rcvd
    assert close_echo == Close(1001, "going away")


@pytest.mark.parametrize("reset", [False, True], ids=["eof", "rst"])
async def test_server_dropping_the_socket_ends_a_pending_receive(reset: bool) -> None:
    drop = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        await drop.wait()
        await connection.abort(reset=reset)

    async with serve(handler) as server, WebSocketTransport(server.url) as transport:
        raised: list[BaseException] = []

        async def wait_for_reply() -> None:
            try:
                await transport.receive()
            except ConnectionClosed as exc:
                raised.append(exc)

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(wait_for_reply)
                await all_tasks_blocked()  # the receive is pending
                drop.set()
        assert len(raised) == 1
        with pytest.raises(ConnectionClosed):
            await transport.send(b"{}")


async def test_a_server_that_hangs_up_mid_send_is_reported_with_its_close_code() -> None:
    """The server stops reading a message too big for it, says 1009 and resets: the send says 1009."""

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        await connection.stream.receive(1)  # the big message is on its way; read no more of it
        connection.protocol.send_close(1009, "too big")
        await connection.flush()
        await connection.abort(reset=True)

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, compression=False) as transport:
                with pytest.raises(ConnectionClosed, match="1009"):
                    await transport.send(b"x" * 64 * 2**20)  # more than loopback buffers hold


async def test_server_ping_is_answered_while_the_client_is_idle() -> None:
    pong = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.ping_until_gone(b"are you there", pong)

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, ping_interval=None) as transport, kept(transport):
                await pong.wait()  # nobody calls receive(): the reader answered


async def test_server_ping_is_answered_when_the_client_goes_idle_after_a_busy_spell() -> None:
    """The background reader looks less often while callers read, but still takes over once they stop."""
    pong = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        for _ in range(200):  # the busy spell: echo what the client sends
            frame = await connection.next_message()
            assert frame is not None
            connection.protocol.send_text(frame.data)
            await connection.flush()
        await connection.ping_until_gone(b"still there?", pong)

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, ping_interval=None) as transport, kept(transport):
                for n in range(200):
                    await transport.send(b"%d" % n)
                    assert await transport.receive() == b"%d" % n
                    if n % 20 == 0:
                        await all_tasks_blocked()  # a pause: every task settles
                await pong.wait()  # nobody calls receive() any more: the reader answered


async def test_server_ping_is_answered_while_the_caller_is_busy_between_send_and_receive() -> None:
    pong = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        request = await connection.next_message()
        assert request is not None
        connection.protocol.send_ping(b"still there?")
        await connection.flush()
        while (frame := await connection.next_frame()) is not None:
            if frame.opcode is Opcode.PONG:
                pong.set()
                connection.protocol.send_text(request.data)
                await connection.flush()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, ping_interval=None) as transport, kept(transport):
                await transport.send(b'{"type": "step"}')
                await pong.wait()  # busy elsewhere: the background task answered
                assert await transport.receive() == b'{"type": "step"}'


def _reading_paused(transport: WebSocketTransport) -> bool:
    """Whether the keeper stopped reading the socket, the session's frames unread up to the buffer."""
    channel = transport.link_channel
    assert channel is not None
    return len(channel.frames) >= RECEIVE_BUFFER


async def test_messages_read_while_idle_are_kept_in_order_beyond_the_buffer() -> None:
    count = 200  # more than the background reader queues before it stops reading

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        for n in range(count):
            connection.protocol.send_text(b"%d" % n)
            await connection.flush()
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport, kept(transport):
                # Idle: the connection reads until its buffer is full, then stops reading.
                await wait_until(lambda: _reading_paused(transport), what="the receive buffer to fill")
                received = [await transport.receive() for _ in range(count)]
    assert received == [b"%d" % n for n in range(count)]


async def test_concurrent_receivers_share_the_messages() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                received: list[bytes] = []

                async def receive_one() -> None:
                    received.append(await transport.receive())

                async with anyio.create_task_group() as task_group:
                    for _ in range(3):
                        task_group.start_soon(receive_one)
                    await all_tasks_blocked()  # the three receives are pending
                    for n in range(3):
                        await transport.send(b"[%d]" % n)
    assert received == [b"[0]", b"[1]", b"[2]"]


async def test_a_reply_after_an_idle_spell_is_handed_over() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport, kept(transport):
                for _ in range(3):
                    await all_tasks_blocked()  # idle: only the background task waits on the socket
                    await transport.send(b"{}")
                    assert await transport.receive() == b"{}"
                    await transport.send(b"[]")  # and the caller reads it directly again
                    assert await transport.receive() == b"[]"


async def test_client_keepalive_pings_are_sent() -> None:
    pings = 0
    enough = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        nonlocal pings
        await connection.accept()
        await connection.flush()
        while (frame := await connection.next_frame()) is not None:
            if frame.opcode is Opcode.PING:
                pings += 1
                if pings == 3:
                    enough.set()

    clock = ManualClock()
    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with (
                WebSocketTransport(server.url, ping_interval=10, ping_timeout=1000, clock=clock) as transport,
                kept(transport),
            ):
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(clock.keep_advancing, 10)
                    await enough.wait()
                    task_group.cancel_scope.cancel()
                await transport.send(b"{}")  # still open: every ping got its pong


async def test_keepalive_timeout_ends_the_connection() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        await anyio.sleep_forever()  # never reads again: no pong

    clock = ManualClock()
    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with (
                WebSocketTransport(
                    server.url, ping_interval=10, ping_timeout=20, close_timeout=0.2, clock=clock
                ) as transport,
                kept(transport),
            ):
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(clock.keep_advancing, 10)
                    with pytest.raises(ConnectionClosed, match="keepalive"):
                        await transport.receive()  # the server never answers: only the keepalive ends this
                    task_group.cancel_scope.cancel()
                with pytest.raises(ConnectionClosed, match="keepalive"):
                    await transport.send(b"{}")


async def test_keepalive_timeout_while_the_caller_is_idle() -> None:
    hung_up = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        with suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                await connection.stream.receive()  # the pings go unanswered: bytes are read, never parsed
        hung_up.set()

    clock = ManualClock()
    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with (
                WebSocketTransport(server.url, ping_interval=10, ping_timeout=20, clock=clock) as transport,
                kept(transport),
            ):
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(clock.keep_advancing, 10)
                    await hung_up.wait()  # nobody reads but the background task, which gave up on the pong
                    task_group.cancel_scope.cancel()
                with pytest.raises(ConnectionClosed, match="keepalive"):
                    await transport.send(b"{}")
                with pytest.raises(ConnectionClosed, match="keepalive"):
                    await transport.receive()


async def test_oversize_message_is_a_protocol_error() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        connection.protocol.send_binary(b"\0" * 5000)  # compresses to little: the limit is on the message
        await connection.flush()
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, max_message_size=1000) as transport:
                with pytest.raises(ProtocolError, match="1000"):
                    await transport.receive()
                with pytest.raises(ConnectionClosed):
                    await transport.send(b"{}")
    assert server.connections[0].protocol.close_rcvd is not None
    assert server.connections[0].protocol.close_rcvd.code == 1009


async def test_invalid_frame_is_a_protocol_error() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        await connection.stream.send(b"\x8f\x00")  # FIN + reserved opcode 0xF
        await connection.drain()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, compression=False) as transport:
                with pytest.raises(ProtocolError, match="opcode"):
                    await transport.receive()


# -- whole frames, control frames among them -------------------------------------


async def test_whole_data_frames_and_control_frames_between_them() -> None:
    """Each of the server's writes answers a b"next" from the client and reaches it in one read."""
    pongs: list[bytes] = []
    six = Frame(Opcode.BINARY, b"six" * 100).serialize(mask=False)

    def frames(*messages: bytes) -> bytes:
        return b"".join(Frame(Opcode.TEXT, message).serialize(mask=False) for message in messages)

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        protocol = connection.protocol
        protocol.send_ping(b"p")
        ping = b"".join(protocol.data_to_send())
        protocol.send_close(1001, "going away")
        close = b"".join(protocol.data_to_send())
        writes = [
            frames(b"one", b"two"),
            frames(b"three") + ping + frames(b"four"),
            frames(b"five") + six[:100],  # the parser keeps the part of six
            six[100:],
            frames(b"seven"),
            frames(b"eight") + close,
        ]
        for write in writes:
            while (frame := await connection.next_frame()) is not None and frame.opcode is not Opcode.TEXT:
                if frame.opcode is Opcode.PONG:
                    pongs.append(bytes(frame.data))
            assert frame is not None
            assert frame.data == b"next"
            await connection.stream.send(write)
        while (frame := await connection.next_frame()) is not None:  # the close's echo, then the socket's end
            pass

    async with serve(handler, compression=False) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, compression=False, ping_interval=None) as transport:

                async def next_messages(count: int) -> list[bytes]:
                    await transport.send(b"next")
                    return [await transport.receive() for _ in range(count)]

                assert await next_messages(2) == [b"one", b"two"]
                assert await next_messages(2) == [b"three", b"four"]
                assert await next_messages(1) == [b"five"]
                assert await next_messages(1) == [b"six" * 100]
                assert await next_messages(1) == [b"seven"]
                assert await next_messages(1) == [b"eight"]
                with pytest.raises(ConnectionClosed, match=r"1001.*going away"):
                    await transport.receive()
    assert pongs == [b"p"]
    assert server.connections[0].protocol.close_rcvd == Close(1001, "going away")


@pytest.mark.speed_path  # waits on the boundaries the quick read follows
@pytest.mark.parametrize("behind_the_response", [False, True])
async def test_a_frame_split_between_reads_is_never_read_from_its_middle(behind_the_response: bool) -> None:
    """The rest of a split frame may look like whole frames: it is the parser's, whatever it looks like.

    The first part comes in a read of its own, or behind the handshake's response.
    """
    lookalike = Frame(Opcode.TEXT, b"not a message").serialize(mask=False)
    outer = Frame(Opcode.BINARY, b"head" + lookalike * 3).serialize(mask=False)
    cut = outer.index(lookalike)  # the second part starts with a whole text frame's bytes
    first_part_read = anyio.Event()

    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        if behind_the_response:
            connection.protocol.send_text(b"early")
            await connection.stream.send(b"".join(connection.protocol.data_to_send()) + outer[:cut])
        else:
            await connection.flush()
            await connection.stream.send(outer[:cut])
        await first_part_read.wait()
        await connection.stream.send(outer[cut:] + Frame(Opcode.TEXT, b"after").serialize(mask=False))
        await connection.drain()

    async with serve(handler, compression=False) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, compression=False, ping_interval=None) as transport:
                received: list[bytes] = []

                async def receive_all() -> None:
                    for _ in range(3 if behind_the_response else 2):
                        received.append(await transport.receive())

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(receive_all)
                    link = transport._link
                    assert link is not None
                    await wait_until(lambda: not link._boundaries.at_boundary, "the first part read")
                    first_part_read.set()
    early = [b"early"] if behind_the_response else []
    assert received == [*early, b"head" + lookalike * 3, b"after"]


async def test_a_whole_frame_over_the_limit_is_a_protocol_error_without_compression() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        assert await connection.next_message() is not None  # the handshake's response read on its own
        connection.protocol.send_binary(b"\0" * 1001)
        await connection.flush()
        await connection.drain()

    async with serve(handler, compression=False) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, compression=False, max_message_size=1000) as transport:
                await transport.send(b"next")
                with pytest.raises(ProtocolError, match="1000"):
                    await transport.receive()
    close = server.connections[0].protocol.close_rcvd
    assert close is not None
    assert close.code == 1009


async def test_a_fragmented_message_is_reassembled_without_compression() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        for message in (b'{"a": ', b"1", b"}"):  # each fragment a write of its own
            if message == b'{"a": ':
                connection.protocol.send_text(message, fin=False)
            else:
                connection.protocol.send_continuation(message, fin=message == b"}")
            await connection.flush()
        connection.protocol.send_text(b"after")
        await connection.flush()
        await connection.drain()

    async with serve(handler, compression=False) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, compression=False) as transport:
                assert await transport.receive() == b'{"a": 1}'
                assert await transport.receive() == b"after"


# -- closing from the client -----------------------------------------------------


async def test_aclose_is_idempotent_and_ends_send_and_receive() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                await transport.send(b"{}")
                assert await transport.receive() == b"{}"
                await transport.aclose()
                await transport.aclose()
                with pytest.raises(ConnectionClosed, match="closed by the client"):
                    await transport.send(b"{}")
                with pytest.raises(ConnectionClosed, match="closed by the client"):
                    await transport.receive()
            await transport.aclose()
    connection = server.connections[0]
    assert connection.protocol.close_rcvd is not None
    assert connection.protocol.close_rcvd.code == 1000


async def test_aclose_wakes_a_pending_receive() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport, anyio.create_task_group() as task_group:

                async def wait_for_reply() -> None:
                    with pytest.raises(ConnectionClosed):
                        await transport.receive()

                task_group.start_soon(wait_for_reply)
                await all_tasks_blocked()  # the receive is pending
                await transport.aclose()


async def test_aclose_is_bounded_when_the_server_does_not_answer() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        await anyio.sleep_forever()

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, close_timeout=0.2) as transport:
                pass
            await transport.aclose()  # already closed: idempotent


async def test_aclose_after_the_connection_broke() -> None:
    async def handler(connection: ServerConnection) -> None:
        await connection.accept()
        await connection.flush()
        await connection.abort(reset=True)

    async with serve(handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                with pytest.raises(ConnectionClosed):
                    await transport.receive()
                await transport.aclose()


async def test_send_and_receive_before_connecting_raise_connection_closed() -> None:
    transport = WebSocketTransport("http://127.0.0.1:1")
    with pytest.raises(ConnectionClosed, match="not connected"):
        await transport.send(b"{}")
    with pytest.raises(ConnectionClosed, match="not connected"):
        await transport.receive()
    await transport.aclose()


async def test_cancelled_caller_does_not_break_an_idle_connection() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url) as transport:
                with anyio.move_on_after(0.05):
                    await transport.receive()  # nothing comes; cancelled
                await transport.send(b"[1]")
                assert await transport.receive() == b"[1]"


async def test_cancellation_from_outside_passes_through() -> None:
    async with serve(echo_handler) as server:
        with anyio.fail_after(WAIT):
            with anyio.CancelScope() as scope:
                async with WebSocketTransport(server.url) as transport:
                    scope.cancel()
                    await transport.receive()
            assert scope.cancelled_caught


# -- TLS -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    key_options = ["-newkey", "rsa:2048", "-nodes", "-keyout", str(key)]
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [openssl, "req", "-x509", "-days", "1", *key_options, *subject, "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_wss_over_tls(tls_files: tuple[Path, Path]) -> None:
    cert, key = tls_files
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    async with serve(echo_handler, ssl_context=server_context) as server:
        assert server.url.startswith("https://")
        with anyio.fail_after(WAIT):
            async with WebSocketTransport(server.url, ssl_context=client_context) as transport:
                await transport.send(b'{"tls": true}')
                assert await transport.receive() == b'{"tls": true}'
            # The system's trust store does not know this certificate.
            with pytest.raises(ConnectError, match=r"cannot connect|certificate"):
                async with WebSocketTransport(server.url):
                    pytest.fail("connected")

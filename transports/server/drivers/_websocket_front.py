"""WebSocket connections served beside hypercorn on trio, through websockets' sans-I/O protocol.

Hypercorn speaks WebSocket through ``wsproto`` and its own event plumbing;
on trio that costs about twice the CPU per message of ``websockets``'
sans-I/O protocol driven straight from the socket. `FrontedTCPServer` reads
each new connection's request head first: a WebSocket upgrade is served here,
anything else goes on to hypercorn with the bytes already read, unchanged.

Either way the same ASGI app serves the request: a WebSocket connection here
is an ASGI ``websocket`` scope whose ``receive`` and ``send`` drive the
protocol, so the app's middleware (token, origin), its routes, session limits
and idle reaping apply as they do under any server. What a server itself
bounds is bounded here too: the request head (`HEAD_LIMIT` bytes, within the
configured keep-alive timeout, else the connection is closed), the size of a
message (close code 1009), and what a client makes the server write without
the app (pongs, close replies): they are written before anything more is read.

The app's own ``receive`` reads the socket: no task stands between a message
and the app. While the app is elsewhere (a step running), nothing would read,
and a client's keepalive ping would go unanswered until the step ended; so a
task beside the app looks every `AWAY_BEFORE_READING` seconds, and once the
app has stayed away from ``receive`` since its last look, reads for it: it
answers pings and closes, and queues messages until `QUEUED_MESSAGES` wait.
The app's next ``receive`` that must read stops that read first (a wait for
bytes is cancelled: trio's reads lose nothing when cancelled), so one reader
reads at a time.
"""

from __future__ import annotations

import contextlib
import http
import logging
import os
from collections import deque
from typing import Any, Protocol
from urllib.parse import unquote

import anyio
from websockets.datastructures import Headers
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import State
from websockets.server import ServerProtocol

__all__ = [
    "AWAY_BEFORE_READING",
    "HEAD_LIMIT",
    "QUEUED_MESSAGES",
    "ClientDisconnected",
    "ReplayedStream",
    "is_websocket_upgrade",
    "read_head",
    "serve_websocket",
]

logger = logging.getLogger("openenv.server")

HEAD_LIMIT = 16 * 1024
"""The most bytes a request head may take before it is handed on as it is (hypercorn refuses it)."""

AWAY_BEFORE_READING = 1.0
"""Seconds (up to twice that) the app may stay away from ``receive`` before the connection reads for it."""

QUEUED_MESSAGES = 2
"""Messages read for an app that is away after which reading stops until it takes them (as uvicorn's)."""

_READ_SIZE = 64 * 1024
# Seconds a closing connection waits for the client's close frame, then its end of the socket.
_CLOSE_TIMEOUT = 5.0
# Writes go straight to a POSIX socket's descriptor when it takes them (see _Connection._write).
_DIRECT_WRITES = os.name == "posix"
_YIELD_EVERY = 16


class ByteStream(Protocol):
    """The socket stream hypercorn hands each connection (trio's ``SocketStream``)."""

    @property
    def socket(self) -> Any: ...

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray: ...

    async def send_all(self, data: bytes | bytearray | memoryview) -> None: ...

    async def aclose(self) -> None: ...


class ClientDisconnected(OSError):
    """A message sent on a WebSocket connection whose client has gone (as uvicorn's)."""


async def read_head(stream: ByteStream) -> bytes | None:
    """Read until a request head is complete (or `HEAD_LIMIT` bytes, or the stream ends).

    Call it under the deadline a client has to send its head.

    Args:
        stream: The new connection.

    Returns:
        The bytes read (the head and whatever followed it in the same reads),
        or ``None`` if the connection ended or broke before a byte came.
    """
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer and len(buffer) < HEAD_LIMIT:
        try:
            data = await stream.receive_some(_READ_SIZE)
        except Exception:  # broken or reset before its head: nothing to answer
            return None
        if not data:
            break
        buffer += data
    return bytes(buffer) if buffer else None


def is_websocket_upgrade(head: bytes) -> bool:
    """Whether ``head`` is a complete ``GET`` request asking to upgrade to WebSocket."""
    end = head.find(b"\r\n\r\n")
    if end < 0 or not head.startswith(b"GET "):
        return False
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"upgrade":
            return b"websocket" in value.lower()
    return False


class ReplayedStream:
    """A connection whose first bytes were read already: ``receive_some`` gives them back first.

    What hypercorn reads a connection through when the front has read its head.

    Args:
        stream: The connection (trio's ``SocketStream``).
        head: The bytes read from it so far.
    """

    def __init__(self, stream: Any, head: bytes) -> None:
        self._stream = stream
        self._head = head
        self.socket = stream.socket

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """The bytes read before, once; then the stream's next bytes."""
        if self._head:
            size = len(self._head) if max_bytes is None else max_bytes
            head, self._head = self._head[:size], self._head[size:]
            return head
        data: bytes | bytearray = await self._stream.receive_some(max_bytes)
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Write to the stream."""
        await self._stream.send_all(data)

    async def send_eof(self) -> None:
        """Half-close the stream."""
        await self._stream.send_eof()

    async def aclose(self) -> None:
        """Close the stream."""
        await self._stream.aclose()


class _Connection:
    """One WebSocket connection as an ASGI ``websocket`` scope's ``receive`` and ``send``."""

    def __init__(self, stream: ByteStream, protocol: ServerProtocol, request: Request) -> None:
        self.stream = stream
        self.protocol = protocol
        self.request = request
        self.incoming: deque[dict[str, Any]] = deque()
        self.fragments: list[bytes] = []
        self.fragment_text = False
        self.connect_sent = False
        self.accepted = False
        self.responded = False  # the handshake got its answer (accepted, or refused)
        self.ended = False  # no more messages will come: the client closed, or the socket broke
        self.response_start: dict[str, Any] | None = None
        self.response_body = bytearray()
        self.send_lock = anyio.Lock(fast_acquire=True)
        self.unyielded_writes = 0
        self.in_receive = False  # the app is in receive: it reads for itself
        self.receives = 0  # receive calls ended: the app came back since the watcher last looked
        self.app_done = False  # the app has returned: nothing more is read for it
        self.reading_for_app: anyio.Event | None = None  # set when the read for an away app stops
        self.read_for_app_wait: anyio.CancelScope | None = None  # that read's wait for bytes

    async def receive(self) -> dict[str, Any]:
        """The app's next ASGI message: connect first, then the client's messages, then disconnect."""
        if not self.connect_sent:
            self.connect_sent = True
            return {"type": "websocket.connect"}
        self.in_receive = True
        try:
            while not self.incoming:
                if self.ended:
                    return {"type": "websocket.disconnect", "code": self._close_code()}
                if self.reading_for_app is not None:
                    await self._stop_reading_for_app()
                else:
                    # Answering what it read (a pong, say) may find the client gone: it has ended.
                    with contextlib.suppress(ClientDisconnected):
                        await self._read()
            return self.incoming.popleft()
        finally:
            self.in_receive = False
            self.receives += 1

    async def read_while_app_is_away(self) -> None:
        """Run beside the app: read for it whenever it stays away from ``receive``; ends with the connection.

        Every `AWAY_BEFORE_READING` seconds it looks: an app that has not been in
        ``receive`` since the last look gets the socket read for it. Cancel it
        once the app has returned (`finish` stops a read in progress first).
        """
        seen = self.receives
        while not self.app_done and not self.ended:
            await anyio.sleep(AWAY_BEFORE_READING)
            if self.in_receive or self.receives != seen:
                seen = self.receives
            elif self.accepted:  # before the handshake's answer there are no messages to read
                await self._read_for_app()
                seen = self.receives

    async def _read_for_app(self) -> None:
        """Read, answer, queue: until `QUEUED_MESSAGES` wait, the connection ends, or the app reads itself."""
        self.reading_for_app = stopped = anyio.Event()
        try:
            while len(self.incoming) < QUEUED_MESSAGES and not self.ended and not self.in_receive and not self.app_done:
                with anyio.CancelScope() as wait:
                    self.read_for_app_wait = wait
                    try:
                        data = await self.stream.receive_some(_READ_SIZE)
                    except Exception:  # as in _read: the socket broke or was closed
                        data = b""
                self.read_for_app_wait = None
                if wait.cancelled_caught:
                    return
                self._take(data)
                try:
                    await self._flush()
                except ClientDisconnected:
                    return
                if self.protocol.state is not State.OPEN:
                    self.ended = True
        finally:
            self.read_for_app_wait = None
            self.reading_for_app = None
            stopped.set()

    async def _stop_reading_for_app(self) -> None:
        """Stop the read for an away app: its wait for bytes at once, what it read once answered."""
        stopped = self.reading_for_app
        if stopped is None:
            return
        if self.read_for_app_wait is not None:
            self.read_for_app_wait.cancel()
        await stopped.wait()

    def _close_code(self) -> int:
        code = self.protocol.close_rcvd.code if self.protocol.close_rcvd is not None else None
        return code if code is not None else CloseCode.ABNORMAL_CLOSURE

    async def _read(self) -> None:
        """Read once from the socket, queue the messages it completes, write what it asks for."""
        try:
            data = await self.stream.receive_some(_READ_SIZE)
        except Exception:  # trio's BrokenResourceError or ClosedResourceError, a reset
            data = b""
        self.unyielded_writes = 0  # a read yields, whether it waited or not
        self._take(data)
        await self._flush()
        if self.protocol.state is not State.OPEN:
            self.ended = True

    def _take(self, data: bytes | bytearray) -> None:
        """Feed what was read (``b""``: the end) to the protocol; queue the messages it completes."""
        if data:
            self.protocol.receive_data(data)
        else:
            self.protocol.receive_eof()
        for event in self.protocol.events_received():
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                self.fragments = [bytes(event.data)]
                self.fragment_text = opcode is Opcode.TEXT
            elif opcode is Opcode.CONT:
                self.fragments.append(bytes(event.data))
            else:
                continue  # pings and closes: the protocol answers them
            if event.fin:
                self._queue_message(b"".join(self.fragments) if len(self.fragments) > 1 else self.fragments[0])
                self.fragments = []

    def _queue_message(self, payload: bytes) -> None:
        if not self.fragment_text:
            self.incoming.append({"type": "websocket.receive", "bytes": payload})
            return
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            self.protocol.fail(CloseCode.INVALID_DATA, "invalid UTF-8 in a text message")
            return
        self.incoming.append({"type": "websocket.receive", "text": text})

    async def _flush(self) -> None:
        """Write what the protocol has to send; half-close where it says so."""
        writes = self.protocol.data_to_send()
        if not writes:
            return
        async with self.send_lock:
            for data in writes:
                if not data:  # the protocol's end of stream: the server closes TCP first
                    await self._close_socket()
                    return
                try:
                    await self._write(data)
                except Exception as exc:  # the client went away, or the socket was closed
                    self.ended = True
                    raise ClientDisconnected("the client went away") from exc

    async def _write(self, data: bytes) -> None:
        """Write ``data``: straight to the socket while it takes it whole, else through the stream.

        Trio's stream yields to the scheduler on every write, about a tenth of
        the server's CPU per message; a write the socket takes at once need not.
        One in `_YIELD_EVERY` such writes in a row still yields, so an app that
        sends and never receives lets the other connections run (every read
        yields).
        """
        if _DIRECT_WRITES:
            try:
                sent = os.write(self.stream.socket.fileno(), data)  # -1 once closed: EBADF
            except BlockingIOError:
                sent = 0
            if sent == len(data):
                self.unyielded_writes += 1
                if self.unyielded_writes >= _YIELD_EVERY:
                    self.unyielded_writes = 0
                    await anyio.lowlevel.checkpoint()
                return
            data = data[sent:]
        self.unyielded_writes = 0
        await self.stream.send_all(data)

    async def _close_socket(self) -> None:
        self.ended = True
        with contextlib.suppress(Exception):
            await self.stream.aclose()

    async def send(self, message: dict[str, Any]) -> None:
        """Carry out one ASGI message from the app.

        Raises:
            ClientDisconnected: The client has gone.
            RuntimeError: A message the connection's state does not allow.
        """
        kind = message["type"]
        protocol = self.protocol
        if kind == "websocket.send":
            if protocol.state is not State.OPEN:
                raise ClientDisconnected("the WebSocket connection is closed")
            text = message.get("text")
            if text is not None:
                protocol.send_text(text.encode())
            else:
                protocol.send_binary(message["bytes"])
        elif kind == "websocket.accept":
            self._accept(message)
        elif kind == "websocket.close":
            if self.accepted:
                if protocol.state is State.OPEN:
                    protocol.send_close(message.get("code") or CloseCode.NORMAL_CLOSURE, message.get("reason") or "")
            elif not self.responded:  # refused before the handshake: 403, as the ASGI spec says
                self._send_response(protocol.reject(http.HTTPStatus.FORBIDDEN, "Forbidden\n"))
        elif kind == "websocket.http.response.start":
            self.response_start = message
        elif kind == "websocket.http.response.body":
            self._respond(message)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} on a WebSocket connection")
        await self._flush()

    def _accept(self, message: dict[str, Any]) -> None:
        if self.responded:
            raise RuntimeError("the WebSocket handshake was answered already")
        response = self.protocol.accept(self.request)
        if response.status_code == 101:
            self.accepted = True
            subprotocol = message.get("subprotocol")
            if subprotocol:
                response.headers["Sec-WebSocket-Protocol"] = subprotocol
            for name, value in message.get("headers") or ():
                response.headers[name.decode("latin-1")] = value.decode("latin-1")
        self._send_response(response)  # a refusal (bad handshake) ends the connection

    def _respond(self, message: dict[str, Any]) -> None:
        """The ASGI denial response: sent once its body is complete."""
        self.response_body += message.get("body", b"")
        if message.get("more_body", False) or self.response_start is None:
            return
        status = int(self.response_start["status"])
        headers = Headers(
            (name.decode("latin-1"), value.decode("latin-1")) for name, value in self.response_start["headers"]
        )
        if "Content-Length" in headers:  # the app's own, if any, makes way for the body's true length
            del headers["Content-Length"]
        headers["Content-Length"] = str(len(self.response_body))
        if "Connection" not in headers:
            headers["Connection"] = "close"
        try:
            phrase = http.HTTPStatus(status).phrase
        except ValueError:  # a status of the app's own
            phrase = ""
        self._send_response(Response(status, phrase, headers, bytes(self.response_body)))

    def _send_response(self, response: Response) -> None:
        if self.responded:
            raise RuntimeError("the WebSocket handshake was answered already")
        self.responded = True
        self.protocol.send_response(response)

    async def finish(self, code: int = CloseCode.NORMAL_CLOSURE) -> None:
        """After the app: close the WebSocket if the app did not, wait (bounded) for the client's end.

        Cancelled (the server stops without grace), it closes the socket at once.

        Args:
            code: The close code, if the app left the connection open.
        """
        protocol = self.protocol
        self.app_done = True
        try:
            await self._stop_reading_for_app()
            with contextlib.suppress(ClientDisconnected):
                if protocol.state is State.OPEN:
                    protocol.send_close(code)
                elif not self.responded:  # the app ended without a word: refuse the handshake
                    status = (
                        http.HTTPStatus.FORBIDDEN
                        if code == CloseCode.NORMAL_CLOSURE
                        else http.HTTPStatus.INTERNAL_SERVER_ERROR
                    )
                    self._send_response(protocol.reject(status, f"{status.phrase}\n"))
                await self._flush()
                with anyio.move_on_after(_CLOSE_TIMEOUT):
                    while protocol.state is not State.CLOSED and not self.ended:
                        await self._read()
        finally:
            await self._close_socket()


async def serve_websocket(
    app: Any,
    stream: ByteStream,
    head: bytes,
    *,
    client: tuple[str, int] | None,
    server: tuple[str, int] | None,
    max_message_size: int,
    state: dict[str, Any],
) -> None:
    """Serve one WebSocket connection to ``app`` (an ASGI app), from its request head to its end.

    Args:
        app: The ASGI app.
        stream: The connection.
        head: The bytes read so far: the request head, and any that followed it.
        client: The client's address, for the scope.
        server: The server's address, for the scope.
        max_message_size: The largest message accepted; a larger one ends the
            connection (close code 1009).
        state: The app's lifespan state, copied into the scope.
    """
    # No extensions: compressing small frames costs more CPU than it saves on a fast link.
    protocol = ServerProtocol(extensions=[], max_size=max_message_size)
    protocol.receive_data(head)
    events = protocol.events_received()
    if not events or not isinstance(events[0], Request):  # unparsable: the protocol says goodbye
        connection = _Connection(stream, protocol, Request("/", Headers()))
        with contextlib.suppress(ClientDisconnected):
            await connection._flush()
        await connection._close_socket()
        return
    request = events[0]
    connection = _Connection(stream, protocol, request)
    path, _, query = request.path.partition("?")
    scope: dict[str, Any] = {
        "type": "websocket",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "scheme": "ws",
        "path": unquote(path),
        "raw_path": path.encode("latin-1"),
        "query_string": query.encode("latin-1"),
        "root_path": "",
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in request.headers.raw_items()
        ],
        "client": client,
        "server": server,
        "subprotocols": [
            item.strip() for value in request.headers.get_all("Sec-WebSocket-Protocol") for item in value.split(",")
        ],
        "state": dict(state),
        "extensions": {"websocket.http.response": {}},
    }
    code = CloseCode.NORMAL_CLOSURE
    async with anyio.create_task_group() as beside_the_app:
        beside_the_app.start_soon(connection.read_while_app_is_away)
        try:
            await app(scope, connection.receive, connection.send)
        except Exception:  # the app's failure ends its connection, never the server
            logger.exception("error in the ASGI app serving a WebSocket connection")
            code = CloseCode.INTERNAL_ERROR
        finally:
            try:
                await connection.finish(code)  # stops any read for the app first
            except Exception:
                logger.exception("error closing a WebSocket connection")
            finally:
                beside_the_app.cancel_scope.cancel()

"""The WebSocket transport, client side: ``ws://``, ``wss://``, ``http://`` and ``https://`` URLs.

websockets' sans-I/O `ClientProtocol` does the protocol work (handshake, framing,
masking, permessage-deflate, the closing handshake); this module drives it over an
anyio byte stream, so the same code runs on asyncio and on trio.

Reading the socket is a role that one task holds at a time. A caller waiting in
`WebSocketTransport.receive` reads the socket itself: the reply it waits for
reaches it with no hand-off between tasks, which is the hot path of a client that
steps an environment. When no caller has read for a short while
(`_IDLE_READ_DELAY`; up to `_BUSY_READ_DELAY` after a busy spell), a background
task takes the role, so the server's pings are answered and its close is noticed
while the caller is busy elsewhere; it gives the role back as soon as a caller
wants it, handing over what it read. Whoever
reads answers pings on the spot. A second task sends keepalive pings. Writes from
the caller and from both tasks go through one lock, so frames never interleave.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import NoReturn

import anyio
import anyio.lowlevel
from anyio.abc import ByteStream, TaskGroup
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import (
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
    InvalidURI,
    NegotiationError,
    PayloadTooBig,
    WebSocketException,
)
from websockets.exceptions import ProtocolError as WebSocketProtocolError
from websockets.extensions.permessage_deflate import enable_client_permessage_deflate
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import Event, State
from websockets.typing import Subprotocol
from websockets.uri import WebSocketURI, parse_uri

from openenv import (
    AuthenticationError,
    ClientStateError,
    ConnectError,
    ConnectionClosed,
    ProtocolError,
    Transport,
    __version__,
)

from .._credentials import with_auth_token
from ._subprotocols import PLAIN, SUBPROTOCOLS, offered_subprotocols

__all__ = ["WebSocketTransport", "websocket_url"]

# Bytes asked of the socket per read: large, so that a burst of frames (or a big
# one) takes few system calls and few trips through the protocol's parser.
_READ_SIZE = 65536

# Messages the background reader may queue ahead of `receive`. Backpressure,
# chosen: OpenEnv's server speaks only when spoken to (one reply per request), so
# at most a few replies are ever unread (those of calls in flight, or abandoned by
# a timeout until the client drains them) and a well-behaved server never fills
# this; the reader keeps reading and answering pings while the caller is idle or
# busy. A server that floods us with unsolicited messages fills it; the reader
# then stops reading the socket, pushing back on the server through TCP instead
# of buffering without bound (each message may be up to `max_message_size`).
# Pings go unanswered while it is stopped, as with websockets' own clients when
# their queue is full. (A caller in `receive` reads only when this is empty.)
_RECEIVE_BUFFER = 64

# Seconds without a caller reading the socket before the background task reads it
# on the caller's behalf (pongs are then that late at most, plus a read; servers
# wait many seconds for them). A caller in a tight send/receive loop reads the
# socket itself, so the background task stays out of the hot path.
_IDLE_READ_DELAY = 0.1
# While callers keep reading, the background task looks less and less often (up
# to this), so that hundreds of busy connections do not wake it ten times a
# second each; the first look after a takeover is `_IDLE_READ_DELAY` again.
_BUSY_READ_DELAY = 1.0

# Headers the handshake owns; a caller sets them through the constructor's options.
_HANDSHAKE_HEADERS = frozenset(
    {
        "connection",
        "upgrade",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
    }
)

_USER_AGENT = f"openenv/{__version__} {USER_AGENT}"

# Everything the socket (plain or TLS) may raise once it is open. ssl.SSLError is
# an OSError.
_STREAM_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)

# What may go wrong while connecting: the socket's failures and websockets' own.
_CONNECT_ERRORS = (*_STREAM_ERRORS, WebSocketException)

# The peer broke the WebSocket protocol (the parser's reasons to fail a connection).
_PEER_PROTOCOL_ERRORS = (WebSocketProtocolError, PayloadTooBig, UnicodeDecodeError)

_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}


def websocket_url(url: str) -> str:
    """Turn a server's base URL into the URL of its WebSocket endpoint, as OpenEnv does.

    ``http://`` becomes ``ws://``, ``https://`` becomes ``wss://``, a URL without
    a scheme gets ``ws://``; then trailing slashes are stripped from the path and
    ``/ws`` is appended, always (``ws://host/ws`` becomes ``ws://host/ws/ws``,
    exactly as OpenEnv's client does). A query string stays at the end.

    Args:
        url: The server's base URL (``http://localhost:8000``, ``wss://host/env/``).

    Returns:
        The WebSocket URL (``ws://localhost:8000/ws``, ``wss://host/env/ws``).

    Raises:
        ValueError: The URL's scheme is not ``ws``, ``wss``, ``http`` or ``https``.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        scheme, rest = "ws", url
    ws_scheme = _SCHEMES.get(scheme.lower())
    if ws_scheme is None:
        raise ValueError(f"{url!r} is not a ws://, wss://, http:// or https:// URL")
    rest, hash_mark, fragment = rest.partition("#")
    rest, question_mark, query = rest.partition("?")
    return f"{ws_scheme}://{rest.rstrip('/')}/ws{question_mark}{query}{hash_mark}{fragment}"


def _describe(exc: BaseException) -> str:
    """One line on why an I/O call failed, looking inside anyio's grouped connect errors."""
    text = str(exc) or type(exc).__name__
    inner = getattr(exc.__cause__, "exceptions", None)
    if inner:
        text += " (" + "; ".join(str(e) or type(e).__name__ for e in inner) + ")"
    return text


def _connect_error(url: str, exc: BaseException) -> ConnectError:
    """Translate a failure to connect, most specific class first."""
    if isinstance(exc, InvalidStatus):
        response = exc.response
        detail = response.body.decode("utf-8", "replace").strip()[:200] if response.body else ""
        if response.status_code == 401:
            return AuthenticationError(
                f"the server at {url} refused the token: HTTP 401 {response.reason_phrase}"
                + (f": {detail}" if detail else "")
            )
        return ConnectError(
            f"the server at {url} refused the WebSocket handshake: HTTP "
            f"{response.status_code} {response.reason_phrase}" + (f": {detail}" if detail else "")
        )
    if isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError):
        return ConnectError(f"the server at {url} closed the connection during the WebSocket handshake")
    if isinstance(exc, NegotiationError):
        return ConnectError(f"the WebSocket handshake with {url} failed to negotiate: {exc}")
    if isinstance(exc, InvalidHandshake):
        return ConnectError(f"invalid WebSocket handshake response from {url}: {exc}")
    if isinstance(exc, (anyio.EndOfStream, anyio.BrokenResourceError)):
        return ConnectError(f"the connection to {url} was lost while connecting: {_describe(exc)}")
    return ConnectError(f"cannot connect to {url}: {_describe(exc)}")


async def _close_quietly(stream: ByteStream) -> None:
    """Close a socket now, even under cancellation; it may already be broken."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(*_STREAM_ERRORS):
            await stream.aclose()


@functools.cache
def _default_ssl_context() -> ssl.SSLContext:
    """The system's default TLS settings, built once: loading the CA store is slow."""
    return ssl.create_default_context()


class WebSocketTransport(Transport):
    """OpenEnv frames over a WebSocket connection (``ws://``, ``wss://``, ``http://``, ``https://``).

    The URL is the server's base URL, as OpenEnv's client takes it: ``http://``
    becomes ``ws://``, ``https://`` becomes ``wss://``, and ``/ws`` is appended to
    the path after stripping trailing slashes (see `websocket_url`).

    On connect the transport offers openenv's subprotocols; a server that selects
    one (ours) is spoken to in its dialect, a server that selects none (OpenEnv's
    reference) in plain OpenEnv: JSON text frames without request ids. While it is
    open, the server's pings are answered whether or not the caller is waiting in
    `receive` (a background task reads the socket when the caller does not), and
    a keepalive task pings the server: an idle or busy caller is never dropped for
    silence, and a dead server is noticed.

    Examples:
        Its options are the client's transport options:

        ```python
        from openenv.examples.echo import EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000", encoding="msgpack", auth_token="...") as env:
            await env.reset()
            print(env.transport.subprotocol)  # openenv.v1.msgpack
        ```

        On its own, it carries frames (here, plain OpenEnv: no subprotocol):

        ```python
        from transports.websocket import WebSocketTransport

        async with WebSocketTransport("http://127.0.0.1:8000", subprotocols=[]) as transport:
            await transport.send(b'{"type": "reset", "data": {}}')
            print(await transport.receive())  # b'{"type":"observation","data":{"observation":...'
        ```

    Args:
        url: The server's base URL (``http://host:8000``, ``wss://host/env``).
        connect_timeout: Seconds allowed for the whole connect: DNS, TCP, TLS and
            the WebSocket handshake (``None``: no limit).
        max_message_size: The largest message accepted from the server, in bytes
            (``None``: no limit). The default, 100 MiB, is OpenEnv's.
        ping_interval: Seconds between keepalive pings (``None``: no pings).
        ping_timeout: Seconds to wait for the pong to a keepalive ping before the
            connection is declared dead (``None``: wait forever).
        headers: Extra HTTP headers for the handshake, as a mapping or as
            ``(name, value)`` pairs. They replace a default of the same name
            (``User-Agent``); handshake headers cannot be set.
        auth_token: The bearer token the server asks for, sent as
            ``Authorization: Bearer <token>``; ``None`` takes it from the
            ``OPENENV_AUTH_TOKEN`` environment variable, if set.
        compression: Offer permessage-deflate, as OpenEnv's client does.
        encoding: The dialect to ask for: ``"json"`` or ``"msgpack"`` (binary
            frames). Ignored when ``subprotocols`` is given.
        subprotocols: The subprotocols to offer instead, most preferred first;
            ``[]`` offers none, so the connection speaks plain OpenEnv.
        ssl_context: The TLS settings for ``wss://`` and ``https://`` URLs; the
            system's defaults when ``None``.
        close_timeout: Seconds to wait for the server to complete the closing
            handshake before the socket is closed anyway.

    Attributes:
        url: The WebSocket URL the transport connects to.
        subprotocol: The subprotocol the server selected, or ``None``; set on connect.
        dialect: How frames are written on this connection; set on connect.

    Raises:
        ValueError: An unsupported URL scheme, an unknown encoding, a TLS context
            for a plain-text URL, an invalid header, or both ``auth_token`` and
            an ``Authorization`` header.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float | None = 10.0,
        max_message_size: int | None = 100 * 2**20,
        ping_interval: float | None = 20.0,
        ping_timeout: float | None = 20.0,
        headers: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        compression: bool = True,
        encoding: str = "json",
        subprotocols: Sequence[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        close_timeout: float = 5.0,
        auth_token: str | None = None,
    ) -> None:
        self.url = websocket_url(url)
        offer = offered_subprotocols(encoding)
        if subprotocols is not None:
            offer = list(subprotocols)
        if ssl_context is not None and not self.url.startswith("wss://"):
            raise ValueError(f"an ssl_context was given for {url!r}, which is not a TLS URL")
        pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
        pairs = with_auth_token(pairs, auth_token)
        for name, _ in pairs:
            if name.lower() in _HANDSHAKE_HEADERS:
                raise ValueError(f"the {name} header belongs to the WebSocket handshake; it cannot be set")
        try:
            Headers(pairs)
        except WebSocketException as exc:
            raise ValueError(f"invalid header: {exc}") from exc
        self.connect_timeout = connect_timeout
        self.max_message_size = max_message_size
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.compression = compression
        self.close_timeout = close_timeout
        self.ssl_context = ssl_context
        self.subprotocol: str | None = None
        self._offer = [Subprotocol(name) for name in offer]
        self._headers = pairs
        self._entered = False
        self._aclosed = False
        self._binary = False
        self._protocol: ClientProtocol | None = None
        self._stream: ByteStream | None = None
        self._task_group: TaskGroup | None = None
        self._write_lock: anyio.Lock | None = None
        self._done: anyio.Event | None = None  # set once the socket is closed
        self._stop: anyio.Event | None = None  # set to stop the background tasks
        # Messages for `receive`, oldest first. A deque and an event rather than a
        # memory object stream: the hand-off is the hot path, and this way a
        # receive() that must wait suspends once, and one that need not, never.
        self._inbox: deque[bytes] = deque()
        self._inbox_ended = False  # no message can follow those queued
        self._arrival: anyio.Event | None = None  # set for receivers waiting on the inbox
        self._new_event: Callable[[], anyio.Event] = anyio.Event
        # The read role (see the module docstring).
        self._reading = False  # some task holds the role
        self._reads = 0  # counts the times the role was given back
        self._background_scope: anyio.CancelScope | None = None  # set while the background task holds it
        self._hand_over = False  # a caller asks the background task to give the role back
        self._close_deadline: float | None = None  # the server should close the TCP connection by then
        self._shutting_down = False
        # A data message arriving in fragments, until its last one.
        self._partial: bytearray | None = None
        # The keepalive ping awaiting its pong: its payload, and the event to set.
        self._ping: tuple[bytes, anyio.Event] | None = None
        # Why the connection ended, when it was not the server's doing.
        self._failure: str | None = None
        self._failure_cause: BaseException | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    # -- connecting ------------------------------------------------------------

    async def __aenter__(self) -> WebSocketTransport:
        """Connect and perform the WebSocket handshake.

        Returns:
            The transport itself, with `dialect` and `subprotocol` set.

        Raises:
            AuthenticationError: The server refused the token (HTTP 401).
            ConnectError: The URL is invalid, the server is unreachable or refused
                the connection, TLS failed, the handshake was rejected (the message
                gives the HTTP status) or invalid, the server selected a
                subprotocol that was not offered, or `connect_timeout` elapsed.
            ClientStateError: The transport was entered before; create a new one.
        """
        if self._entered:
            raise ClientStateError("a WebSocketTransport connects only once; create a new one")
        self._entered = True
        try:
            uri = parse_uri(self.url)
        except (InvalidURI, ValueError) as exc:
            raise ConnectError(f"invalid WebSocket URL {self.url!r}: {exc}") from exc
        stream: ByteStream | None = None
        try:
            with anyio.move_on_after(self.connect_timeout) as timeout_scope:
                if uri.secure:
                    stream = await anyio.connect_tcp(
                        uri.host,
                        uri.port,
                        tls=True,
                        ssl_context=self.ssl_context or _default_ssl_context(),
                        tls_hostname=uri.host,
                        # WebSocket frames carry their own ends, so a peer that
                        # skips TLS's close_notify truncates nothing.
                        tls_standard_compatible=False,
                    )
                else:
                    stream = await anyio.connect_tcp(uri.host, uri.port)
                protocol, leftover = await self._handshake(stream, uri)
            if timeout_scope.cancelled_caught:
                raise ConnectError(f"timed out after {self.connect_timeout} s connecting to {self.url}")
        except BaseException as exc:
            if stream is not None:
                await _close_quietly(stream)
            if isinstance(exc, _CONNECT_ERRORS) and not isinstance(exc, ConnectError):
                raise _connect_error(self.url, exc) from exc
            raise
        self._protocol = protocol
        self._stream = stream
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._done = anyio.Event()
        self._stop = anyio.Event()
        # The backend's event class, called directly: anyio.Event() looks up the
        # backend on every call, and the hot path makes one per message.
        self._new_event = type(self._done)
        # Frames the server sent right behind its handshake response (an error
        # frame, say), before anything is read after them.
        with contextlib.suppress(ConnectionClosed):  # if so, the tasks below end it
            await self._handle(leftover, shield_writes=True)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        task_group.start_soon(self._background_reader)
        if self.ping_interval is not None:
            task_group.start_soon(self._keepalive, self.ping_interval, self.ping_timeout)
        return self

    async def _handshake(self, stream: ByteStream, uri: WebSocketURI) -> tuple[ClientProtocol, list[Event]]:
        """Send the upgrade request, read the response; return the protocol and any early events."""
        protocol = ClientProtocol(
            uri,
            extensions=enable_client_permessage_deflate(None) if self.compression else None,
            subprotocols=self._offer or None,
            max_size=self.max_message_size,
        )
        request = protocol.connect()
        headers = request.headers
        for name in {name.lower() for name, _ in self._headers}:
            if name in headers:
                del headers[name]
        for name, value in self._headers:
            headers[name] = value
        if "User-Agent" not in headers:
            headers["User-Agent"] = _USER_AGENT
        protocol.send_request(request)
        for data in protocol.data_to_send():
            if data:
                await stream.send(data)
        while True:
            try:
                data = await stream.receive(_READ_SIZE)
            except anyio.EndOfStream:
                data = b""
                protocol.receive_eof()
            else:
                protocol.receive_data(data)
            events = protocol.events_received()
            if protocol.handshake_exc is not None:
                self._check_selected_subprotocol(events)
                raise protocol.handshake_exc
            if events and isinstance(events[0], Response):
                break
            if not data:
                raise ConnectError(f"the server at {self.url} closed the connection during the WebSocket handshake")
        selected = protocol.subprotocol
        dialect = PLAIN if selected is None else SUBPROTOCOLS.get(selected)
        if dialect is None:
            raise ConnectError(
                f"the server at {self.url} selected the subprotocol {selected!r}, which openenv cannot speak"
            )
        self.subprotocol = selected
        self.dialect = dialect
        self._binary = dialect.encoding == "msgpack"
        # Frames the server sent right behind its response (an error frame, say).
        return protocol, events[1:]

    def _check_selected_subprotocol(self, events: list[Event]) -> None:
        """Name the subprotocol a failed handshake's response selected, if it was never offered."""
        response = events[0] if events else None
        if isinstance(response, Response) and response.status_code == 101:
            selected = response.headers.get("Sec-WebSocket-Protocol")
            if selected is not None and selected not in self._offer:
                offered = ", ".join(self._offer) or "none"
                raise ConnectError(
                    f"the server at {self.url} selected the subprotocol {selected!r}, which was not offered "
                    f"(offered: {offered})"
                )

    # -- reading ---------------------------------------------------------------

    async def _read_once(self, *, shield_writes: bool = False) -> None:
        """Read the socket once and act on it; only the holder of the read role calls it.

        Answers what the protocol owes (pongs, a close echo), queues data messages,
        and ends the connection on EOF, on a broken socket, or when the server
        takes longer than `close_timeout` to close after a close frame.

        Args:
            shield_writes: Shield the answers from cancellation. A caller's
                timeout must not cut a pong in half, which would break the
                connection; a background task is cancelled only to end it.
        """
        protocol, stream = self._protocol, self._stream
        assert protocol is not None
        assert stream is not None
        try:
            if self._close_deadline is None:
                data = await stream.receive(_READ_SIZE)
            else:
                with anyio.move_on_at(self._close_deadline) as close_scope:
                    data = await stream.receive(_READ_SIZE)
                if close_scope.cancelled_caught:
                    await self._shutdown()  # the server did not end the TCP connection in time
                    return
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            await self._shutdown()
            return
        except _STREAM_ERRORS as exc:
            self._note_failure(f"the connection to {self.url} broke: {_describe(exc)}", exc)
            await self._shutdown()
            return
        if self._shutting_down:
            # Another task shut the connection down (fed the protocol its EOF)
            # while these bytes were on their way: nothing can read them now.
            await self._shutdown()
            return
        protocol.receive_data(data)
        try:
            await self._handle(protocol.events_received(), shield_writes=shield_writes)
        except ConnectionClosed:
            await self._shutdown()  # answering failed; _write_pending noted why

    async def _handle(self, events: list[Event], *, shield_writes: bool = False) -> None:
        """Answer what the protocol owes, queue data messages, note pongs and the close.

        Raises:
            ConnectionClosed: Writing the answers failed.
        """
        protocol = self._protocol
        assert protocol is not None
        if protocol.writes:  # pongs, a close echo: answer them first
            if shield_writes:
                with anyio.CancelScope(shield=True):
                    await self._flush_from_reader()
            else:
                await self._flush_from_reader()
        for event in events:
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                if event.fin:
                    self._deliver(event.data)
                else:
                    self._partial = bytearray(event.data)
            elif opcode is Opcode.CONT:
                if self._partial is not None:  # the protocol checks the sequence
                    self._partial += event.data
                    if event.fin:
                        message, self._partial = self._partial, None
                        self._deliver(message)
            elif opcode is Opcode.PONG:
                ping = self._ping
                if ping is not None and ping[0] == event.data:
                    ping[1].set()
            # PING: the protocol queued the pong, flushed above. CLOSE: below.
        if protocol.state is not State.OPEN and self._close_deadline is None:
            # A close frame went one way or the other: no message can follow, so
            # `receive` raises once the inbox is empty; and the server should
            # end the TCP connection soon.
            self._end_inbox()
            self._close_deadline = anyio.current_time() + self.close_timeout

    def _deliver(self, data: bytes | bytearray | memoryview) -> None:
        """Queue one message for `receive` and wake a receiver waiting for it."""
        if self._aclosed:
            return  # nobody reads any more: drop it
        self._inbox.append(data if type(data) is bytes else bytes(data))
        self._wake_receivers()

    def _wake_receivers(self) -> None:
        """Wake the tasks waiting for a message, for the read role, or for the end."""
        arrival = self._arrival
        if arrival is not None:
            self._arrival = None
            arrival.set()

    def _end_inbox(self) -> None:
        """No message will follow those queued: wake the receivers, so they see it."""
        self._inbox_ended = True
        self._wake_receivers()

    def _give_back_read_role(self) -> None:
        """Let the socket be read by another task; wake those waiting to."""
        self._reading = False
        self._reads += 1
        self._wake_receivers()

    async def _wait_for_reader(self) -> None:
        """Wait while another task holds the read role; ask the background task to give it back."""
        if self._background_scope is not None:
            self._hand_over = True
        arrival = self._arrival
        if arrival is None:
            arrival = self._arrival = self._new_event()
        await arrival.wait()

    async def _flush_from_reader(self) -> None:
        """Write the protocol's queued bytes, unless a writer holds the lock.

        The reader never waits for the lock: a writer blocked on a full socket
        must not stop us reading (both peers would then wait on each other), and
        whoever holds the lock writes everything queued before letting go.
        """
        lock = self._write_lock
        assert lock is not None
        if not lock.locked():
            async with lock:
                await self._write_pending()

    # -- the background tasks --------------------------------------------------

    async def _background_reader(self) -> None:
        """Read the socket while no caller does; close it when the connection must end."""
        stop = self._stop
        assert stop is not None
        inbox = self._inbox
        try:
            seen = self._reads
            delay = _IDLE_READ_DELAY
            while not stop.is_set():
                with anyio.move_on_after(delay):
                    await stop.wait()
                    break
                if self._reading or self._reads != seen or len(inbox) >= _RECEIVE_BUFFER:
                    seen = self._reads  # a caller reads, or did lately, or must catch up
                    delay = min(delay * 2, _BUSY_READ_DELAY)
                    continue
                delay = _IDLE_READ_DELAY
                self._reading = True
                self._hand_over = False
                try:
                    with anyio.CancelScope() as self._background_scope:
                        while not (stop.is_set() or self._hand_over or len(inbox) >= _RECEIVE_BUFFER):
                            await self._read_once()
                finally:
                    self._background_scope = None
                    self._give_back_read_role()
                seen = self._reads
        except Exception as exc:  # a safety net: a bug must end the connection, not hang it
            self._note_failure(f"internal error in the WebSocket transport: {exc!r}", exc)
        finally:
            await self._shutdown()

    async def _keepalive(self, interval: float, timeout: float | None) -> None:
        """Ping every ``interval`` seconds; fail the connection if a pong is ``timeout`` late."""
        protocol, stop, lock = self._protocol, self._stop, self._write_lock
        assert protocol is not None
        assert stop is not None
        assert lock is not None
        count = 0
        while True:
            with anyio.move_on_after(interval):
                await stop.wait()
                return
            count = (count + 1) % 2**32
            payload = count.to_bytes(4, "big")
            pong = self._new_event()
            self._ping = (payload, pong)
            try:
                async with lock:
                    if protocol.state is not State.OPEN:
                        return
                    protocol.send_ping(payload)
                    await self._write_pending()
            except ConnectionClosed:
                return
            if timeout is None:
                continue
            with anyio.move_on_after(timeout) as scope:
                await pong.wait()
            if stop.is_set():
                return
            if scope.cancelled_caught:
                self._fail(f"the server at {self.url} did not answer a keepalive ping within {timeout} s")
                return

    async def _shutdown(self) -> None:
        """Close the socket and end the inbox; idempotent, shielded from cancellation."""
        with anyio.CancelScope(shield=True):
            protocol, stream, done, stop = self._protocol, self._stream, self._done, self._stop
            assert protocol is not None
            assert stream is not None
            assert done is not None
            assert stop is not None
            if self._shutting_down:
                await done.wait()
                return
            self._shutting_down = True
            stop.set()
            if self._background_scope is not None:
                self._background_scope.cancel()
            protocol.receive_eof()  # idempotent; the protocol is CLOSED after it
            protocol.data_to_send()  # nothing more to say on a closed socket
            self._partial = None
            await _close_quietly(stream)  # a task still reading gets ClosedResourceError
            self._end_inbox()
            if self._ping is not None:
                self._ping[1].set()
            done.set()

    # -- writing ---------------------------------------------------------------

    async def _write_pending(self) -> None:
        """Write every byte the protocol has queued; call with the write lock held.

        Raises:
            ConnectionClosed: The socket failed; the connection is now broken.
        """
        protocol, stream = self._protocol, self._stream
        assert protocol is not None
        assert stream is not None
        try:
            # Loop: a reader may queue a pong while we wait on the socket.
            while protocol.writes:
                writes = protocol.data_to_send()
                data = writes[0] if len(writes) == 1 else b"".join(writes)
                if data:  # b"" alone is the protocol asking for EOF: _shutdown closes the socket
                    await stream.send(data)
        except _STREAM_ERRORS as exc:
            self._fail(f"the connection to {self.url} broke while sending: {_describe(exc)}", exc)
            self._raise_closed(receiving=False)  # with the first reason the connection ended
        except BaseException:
            # Interrupted (cancelled) part-way: what reached the wire is unknown.
            self._fail(f"a write to {self.url} was interrupted; the connection was abandoned")
            raise

    def _note_failure(self, reason: str, cause: BaseException | None = None) -> None:
        """Remember why the connection ended, unless it already has a reason or has ended."""
        if self._failure is None and not self._shutting_down:
            self._failure = reason
            self._failure_cause = cause

    def _fail(self, reason: str, cause: BaseException | None = None) -> None:
        """End the connection now: the background reader closes the socket, which stops any reader."""
        self._note_failure(reason, cause)
        if self._stop is not None:
            self._stop.set()
        if self._background_scope is not None:
            self._background_scope.cancel()

    # -- the Transport API -----------------------------------------------------

    async def send(self, frame: bytes) -> None:
        """Send one frame: a text frame in a JSON dialect, a binary one for msgpack.

        Args:
            frame: The encoded message.

        Raises:
            ConnectionClosed: The connection is closed or broken, or was never opened.
        """
        protocol, lock = self._protocol, self._write_lock
        if protocol is None or lock is None or self._aclosed or protocol.state is not State.OPEN:
            self._raise_closed(receiving=False)
        # Acquiring the lock raises a pending cancellation before the protocol is
        # touched; one that interrupts the write below abandons the connection.
        async with lock:
            if protocol.state is not State.OPEN:
                self._raise_closed(receiving=False)
            if self._binary:
                protocol.send_binary(frame)
            else:
                protocol.send_text(frame)
            await self._write_pending()

    async def receive(self) -> bytes:
        """Return the next message from the server.

        Messages that arrived before the server closed the connection are returned
        first; only then does it raise. While it waits, it reads the socket itself
        (answering pings), unless another task is reading it.

        Returns:
            The message's payload, as bytes (text and binary messages alike).

        Raises:
            ConnectionClosed: The server closed the connection (the message gives
                its close code and reason), the connection broke (EOF, reset,
                keepalive timeout), or `aclose` was called.
            ProtocolError: The server broke the WebSocket protocol (an invalid
                frame, or a message larger than ``max_message_size``); the
                connection is closed.
        """
        inbox = self._inbox
        while True:
            if self._aclosed:
                self._raise_closed(receiving=True)
            if inbox:
                # Queued already: honour a pending cancellation, but do not yield.
                await anyio.lowlevel.checkpoint_if_cancelled()
                return inbox.popleft()
            if self._inbox_ended or self._protocol is None:
                self._raise_closed(receiving=True)
            if self._reading:
                await self._wait_for_reader()
                continue
            self._reading = True
            try:
                await self._read_once(shield_writes=True)
            finally:
                self._give_back_read_role()
            if inbox and not self._aclosed:
                return inbox.popleft()  # reading the socket was the checkpoint

    def _raise_closed(self, *, receiving: bool) -> NoReturn:
        """Raise the error that says why the connection is not usable, from its cause."""
        protocol = self._protocol
        if protocol is None:
            raise ConnectionClosed(f"the WebSocket transport to {self.url} is not connected")
        if self._aclosed:
            raise ConnectionClosed(f"the WebSocket connection to {self.url} was closed by the client")
        if self._failure is not None:
            raise ConnectionClosed(self._failure) from self._failure_cause
        parser_exc = protocol.parser_exc
        if isinstance(parser_exc, _PEER_PROTOCOL_ERRORS):
            text = f"the server at {self.url} broke the WebSocket protocol: {parser_exc}"
            if receiving:
                raise ProtocolError(text) from parser_exc
            raise ConnectionClosed(text) from parser_exc
        close = protocol.close_rcvd
        if close is not None:
            raise ConnectionClosed(f"the server at {self.url} closed the WebSocket connection: {close}")
        raise ConnectionClosed(
            f"the connection to {self.url} was lost without a WebSocket closing handshake"
        ) from parser_exc

    async def aclose(self) -> None:
        """Close the connection: the closing handshake (code 1000), then the socket.

        Waits at most `close_timeout` seconds for the server's part; idempotent, and
        safe on a broken connection. Afterwards `send` and `receive` raise
        `ConnectionClosed`.
        """
        if self._aclosed:
            return
        self._aclosed = True
        self._inbox.clear()
        self._end_inbox()  # wakes receivers, who see `_aclosed`
        protocol, lock, done = self._protocol, self._write_lock, self._done
        if protocol is None or lock is None or done is None:
            return
        try:
            with anyio.move_on_after(self.close_timeout):
                if protocol.state is State.OPEN:
                    async with lock:
                        if protocol.state is State.OPEN:
                            protocol.send_close(CloseCode.NORMAL_CLOSURE)
                            await self._write_pending()
                # The server echoes the close frame, then ends the TCP connection;
                # read until it has, unless another task is reading.
                while not done.is_set():
                    if self._reading:
                        await self._wait_for_reader()
                        continue
                    self._reading = True
                    try:
                        await self._read_once()
                    finally:
                        self._give_back_read_role()
        except ConnectionClosed:
            pass  # already broken: nothing to hand-shake with
        finally:
            await self._shutdown()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the connection (see `aclose`) and stop the background tasks.

        Args:
            exc_type: The type of the exception that ended the block, if any.
            exc_value: That exception, if any.
            traceback: Its traceback, if any.
        """
        try:
            await self.aclose()
        finally:
            task_group, self._task_group = self._task_group, None
            if task_group is not None:
                task_group.cancel_scope.cancel()
                await task_group.__aexit__(None, None, None)

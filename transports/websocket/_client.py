"""The WebSocket transport, client side: ``ws://``, ``wss://``, ``http://`` and ``https://`` URLs.

websockets' sans-I/O `ClientProtocol` does the protocol work (handshake, framing,
masking, permessage-deflate, the closing handshake). This module holds the
options, connects and performs the handshake; what follows, on the open
connection, is `transports.websocket._connection.Connection`'s on trio and
`transports.websocket._asyncio_connection.AsyncioConnection`'s on asyncio, and
on a resumable session `transports.websocket._resumption.ResumableConnection`'s,
which calls back here to reconnect.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Sequence
from typing import Literal, NoReturn

import anyio
import sniffio
from anyio.abc import ByteStream
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import (
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
    InvalidURI,
    NegotiationError,
    WebSocketException,
)
from websockets.extensions.permessage_deflate import enable_client_permessage_deflate
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import Event
from websockets.typing import Subprotocol
from websockets.uri import WebSocketURI, parse_uri

from openenv import (
    EVENT_LOOP_CLOCK,
    Clock,
    ConnectError,
    ConnectionClosed,
    Dialect,
    Transport,
)
from openenv._limits import (
    DEFAULT_CLIENT_CLOSE_TIMEOUT,
    DEFAULT_CLIENT_MAX_MESSAGE_SIZE,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PING_INTERVAL,
    DEFAULT_PING_TIMEOUT,
)

from .._network_client import (
    STREAM_ERRORS,
    HeaderPairs,
    authentication_error,
    client_headers,
    connect_once,
    default_ssl_context,
    describe,
    error_detail,
    error_message,
    network_cause,
    sends_token,
    split_url,
    user_agent,
)
from .._public_io import public_io_only
from ._asyncio_connection import AsyncioConnection, HandshakeFailed
from ._connection import READ_SIZE, Connection, OpenConnection, close_quietly
from ._resumption import FirstFrameThen, ResumableConnection, SessionRefused, read_session
from ._subprotocols import (
    PLAIN,
    RESUMABLE_SUBPROTOCOLS,
    RESUME_HEADER,
    SUBPROTOCOLS,
    QueuedData,
    SessionData,
    offered_subprotocols,
)

__all__ = ["ENDPOINT_PATH", "WebSocketTransport", "websocket_url"]

# Headers the handshake owns; a caller sets them through the constructor's options.
_HANDSHAKE_HEADERS = frozenset(
    {
        "connection",
        "upgrade",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        RESUME_HEADER.lower(),
    }
)

_USER_AGENT = user_agent(USER_AGENT)

# What may go wrong while connecting: the socket's failures and websockets' own.
_CONNECT_ERRORS = (*STREAM_ERRORS, WebSocketException)

_SCHEMES = {"ws": "ws", "wss": "wss", "http": "ws", "https": "wss"}

ENDPOINT_PATH = "/ws"
"""Where a server's WebSocket endpoint is, below its base URL (OpenEnv's and ours)."""


def websocket_url(url: str) -> str:
    """Turn a server's base URL into the URL of its WebSocket endpoint, as OpenEnv does.

    ``http://`` becomes ``ws://``, ``https://`` becomes ``wss://``, a URL without
    a scheme gets ``ws://``; then trailing slashes are stripped from the path and
    ``/ws`` is appended, as OpenEnv's client does, unless the path ends in
    ``/ws`` already: ``ws://host:8000/ws``, the endpoint's own URL, is taken as
    it is (OpenEnv's client would connect to ``/ws/ws``, which no server
    serves). A query string stays at the end.

    Args:
        url: The server's base URL (``http://localhost:8000``, ``wss://host/env/``).

    Returns:
        The WebSocket URL (``ws://localhost:8000/ws``, ``wss://host/env/ws``;
        ``ws://localhost:8000/ws`` for ``ws://localhost:8000/ws`` too).

    Raises:
        ValueError: The URL's scheme is not ``ws``, ``wss``, ``http`` or ``https``.
    """
    parts = split_url(url, _SCHEMES, default_scheme="ws")
    if parts is None:
        raise ValueError(f"{url!r} is not a ws://, wss://, http:// or https:// URL")
    location = parts.location if parts.location.endswith(ENDPOINT_PATH) else parts.location + ENDPOINT_PATH
    return f"{parts.scheme}://{location}{parts.query}{parts.fragment}"


def _connect_error(url: str, exc: BaseException, *, token_sent: bool = False) -> ConnectError:
    """Translate a failure to connect, most specific class first."""
    if isinstance(exc, InvalidStatus):
        response = exc.response
        detail = error_detail(bytes(response.body)) if response.body else ""
        refusal = f"HTTP {response.status_code} {response.reason_phrase}" + (f": {detail}" if detail else "")
        if response.status_code == 401:
            return authentication_error(url, refusal, token_sent=token_sent)
        hint = ""
        if response.status_code in (403, 404) and error_message(bytes(response.body)) is None:
            # What Starlette (ours, OpenEnv's) answers a WebSocket to a path it does not serve.
            hint = f" (no WebSocket endpoint there? give the server's base URL: the client appends {ENDPOINT_PATH})"
        return ConnectError(f"the server at {url} refused the WebSocket handshake: {refusal}{hint}")
    if isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError):
        return ConnectError(f"the server at {url} closed the connection during the WebSocket handshake")
    if isinstance(exc, NegotiationError):
        return ConnectError(f"the WebSocket handshake with {url} failed to negotiate: {exc}")
    if isinstance(exc, InvalidHandshake):
        return ConnectError(f"invalid WebSocket handshake response from {url}: {exc}")
    if isinstance(exc, (anyio.EndOfStream, anyio.BrokenResourceError)):
        return ConnectError(f"the connection to {url} was lost while connecting: {describe(exc)}")
    return ConnectError(f"cannot connect to {url}: {describe(exc)}")


def _dialect_of(subprotocol: str | None) -> Dialect:
    """The dialect a subprotocol selects (one the handshake checked openenv speaks)."""
    if subprotocol is None:
        return PLAIN
    return SUBPROTOCOLS.get(subprotocol) or RESUMABLE_SUBPROTOCOLS[subprotocol]


class _NotConnected:
    """Stands in for the connection before connect: every use says so."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _raise(self) -> NoReturn:
        raise ConnectionClosed(f"the WebSocket transport to {self.url} is not connected")

    async def send(self, message: bytes) -> None:
        self._raise()

    async def receive(self) -> bytes:
        self._raise()

    async def aclose(self) -> None:
        pass


class WebSocketTransport(Transport):
    """OpenEnv frames over a WebSocket connection (``ws://``, ``wss://``, ``http://``, ``https://``).

    The URL is the server's base URL, as OpenEnv's client takes it: ``http://``
    becomes ``ws://``, ``https://`` becomes ``wss://``, and ``/ws`` is appended to
    the path after stripping trailing slashes (see `websocket_url`).

    On connect the transport offers openenv's subprotocols; a server that selects
    one (ours) is spoken to in its dialect, a server that selects none (OpenEnv's
    reference) in plain OpenEnv: JSON text frames without request ids. While it is
    open, the socket is read as data comes (on asyncio by websockets' own asyncio
    client, on trio by a background task), answering the server's pings whether
    or not the caller is waiting in `receive`, and a keepalive task pings the
    server: an idle or busy caller is never dropped for silence, and a dead
    server is noticed. It may be closed from any task.

    With ``resume`` (the default), it offers the resumable variants first, and a
    server that selects one (ours) keeps the session for a while when the
    connection drops: the transport then reconnects at once, in the background,
    takes the same session (the same environment) over, and sends again the
    requests the server did not receive; the server sends its last reply again
    if it was lost. A caller waiting in `send` or `receive` waits for the new
    connection and sees nothing else: no request runs twice, no reply is lost.
    A connection closed on purpose (by the server: its close frame; or by the
    client) is not resumed. When resuming fails (the grace period ran out, the
    server refused the token: it restarted, say), `send` and `receive` raise
    `ConnectionClosed` saying why.

    Examples:
        Its options are the client's transport options:

        ```python
        from openenv.examples.echo import EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000", encoding="msgpack", auth_token="...") as env:
            await env.reset()
            print(env.transport.subprotocol)  # openenv.v1.msgpack.resumable
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
        resume: Offer resumable sessions: a dropped connection is replaced
            without ending the session (see above). ``False`` offers only the
            plain subprotocols: the session ends with its connection.
        resume_timeout: Seconds to keep trying to resume after a drop;
            ``None``: as long as the server keeps the session (its ``session``
            frame says; 30 s on ours by default).
        clock: Where the timeouts, the keepalive and the resumption's grace are
            measured (a test's clock, say); the event loop's time by default.

    Attributes:
        url: The WebSocket URL the transport connects to.
        subprotocol: The subprotocol the server selected, or ``None``; set on connect.
        dialect: How frames are written on this connection; set on connect.
        resumable: Whether the session survives a dropped connection (the
            server selected a resumable subprotocol); set on connect.

    Raises:
        ValueError: An unsupported URL scheme, an unknown encoding, a TLS context
            for a plain-text URL, an invalid header, or both ``auth_token`` and
            an ``Authorization`` header.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        max_message_size: int | None = DEFAULT_CLIENT_MAX_MESSAGE_SIZE,
        ping_interval: float | None = DEFAULT_PING_INTERVAL,
        ping_timeout: float | None = DEFAULT_PING_TIMEOUT,
        headers: HeaderPairs | None = None,
        compression: bool = True,
        encoding: Literal["json", "msgpack"] = "json",
        subprotocols: Sequence[str] | None = None,
        ssl_context: ssl.SSLContext | None = None,
        close_timeout: float = DEFAULT_CLIENT_CLOSE_TIMEOUT,
        auth_token: str | None = None,
        resume: bool = True,
        resume_timeout: float | None = None,
        clock: Clock = EVENT_LOOP_CLOCK,
    ) -> None:
        self.url = websocket_url(url)
        offer = offered_subprotocols(encoding, resume=resume)
        if subprotocols is not None:
            offer = list(subprotocols)
        if ssl_context is not None and not self.url.startswith("wss://"):
            raise ValueError(f"an ssl_context was given for {url!r}, which is not a TLS URL")
        pairs = client_headers(headers, auth_token, reserved=_HANDSHAKE_HEADERS, owner="the WebSocket handshake")
        self.connect_timeout = connect_timeout
        self.max_message_size = max_message_size
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.compression = compression
        self.close_timeout = close_timeout
        self.ssl_context = ssl_context
        self.resume_timeout = resume_timeout
        self._clock = clock
        self.subprotocol: str | None = None
        self.resumable = False
        self._offer = [Subprotocol(name) for name in offer]
        self._headers = pairs
        self._entered = False
        self._uri: WebSocketURI | None = None
        self._connection: OpenConnection | ResumableConnection | FirstFrameThen | _NotConnected
        self._connection = _NotConnected(self.url)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @property
    def resumes(self) -> int:
        """How many times the session was resumed on a new connection after a drop."""
        connection = self._connection
        return connection.resumes if isinstance(connection, ResumableConnection) else 0

    async def __aenter__(self) -> WebSocketTransport:
        """Connect and perform the WebSocket handshake.

        Returns:
            The transport itself, with `dialect` and `subprotocol` set.

        Raises:
            AuthenticationError: The server refused the token (HTTP 401).
            ConnectError: The URL is invalid, the server is unreachable or refused
                the connection, TLS failed, the handshake was rejected (the message
                gives the HTTP status) or invalid, the server selected a
                subprotocol that was not offered, or `connect_timeout` elapsed
                (or, on a resumable session, passed again before the server's
                ``session`` frame came).
            ClientStateError: The transport was entered before; create a new one.
        """
        connect_once(self._entered, self)
        self._entered = True
        try:
            self._uri = parse_uri(self.url)
        except (InvalidURI, ValueError) as exc:
            raise ConnectError(f"invalid WebSocket URL {self.url!r}: {exc}") from exc
        connection, selected = await self._open(self._offer)
        self.subprotocol = selected
        self.dialect = _dialect_of(selected)
        self.resumable = selected in RESUMABLE_SUBPROTOCOLS
        if not self.resumable:
            self._connection = connection
            return self
        binary = self.dialect.encoding == "msgpack"
        try:
            queued: QueuedData | None = None
            while True:
                # A server at capacity that queues the session says so: then the
                # session frame may take as long as its queue keeps a session waiting.
                wait = self.connect_timeout
                if queued is not None and wait is not None:
                    wait += queued.queue_timeout
                first: SessionData | QueuedData | None = None
                with self._clock.move_on_after(wait):
                    first = await read_session(connection, binary=binary)
                if first is None:
                    waited = f", queued at place {queued.position} for a slot," if queued is not None else ""
                    raise ConnectError(f"timed out after {wait} s{waited} waiting for {self.url}'s session frame")
                if isinstance(first, SessionData):
                    session = first
                    break
                queued = first
        except SessionRefused as exc:
            # Turned away (CAPACITY_REACHED, say): the caller reads it as a reply, as on any subprotocol.
            self.resumable = False
            self._connection = FirstFrameThen(connection, exc.frame)
            return self
        except ConnectionClosed:
            self.resumable = False  # closed at once: the caller's first call says how
            self._connection = connection
            return self
        except BaseException:
            await connection.aclose()
            raise
        self._connection = await ResumableConnection.start(
            connection,
            session,
            url=self.url,
            binary=binary,
            reconnect=self._reconnect,
            resume_timeout=self.resume_timeout,
            clock=self._clock,
        )
        return self

    async def _open(
        self, offer: list[Subprotocol], extra_headers: Sequence[tuple[str, str]] = ()
    ) -> tuple[OpenConnection, str | None]:
        """Connect, perform the handshake, start the connection; return it and the subprotocol selected.

        On asyncio the connection is websockets' own asyncio client (`AsyncioConnection`,
        the cheaper there); on trio, ours over an anyio stream (`Connection`).
        """
        uri = self._uri
        assert uri is not None
        if sniffio.current_async_library() == "asyncio" and not public_io_only():
            return await self._open_on_asyncio(uri, offer, extra_headers)
        handshaken: tuple[ByteStream, ClientProtocol, list[Event]] | None = None
        with self._clock.move_on_after(self.connect_timeout):
            handshaken = await self._connect(uri, offer, extra_headers)
        if handshaken is None:
            raise ConnectError(f"timed out after {self.connect_timeout} s connecting to {self.url}")
        stream, protocol, early_events = handshaken
        selected = protocol.subprotocol
        connection = await Connection.open(
            stream,
            protocol,
            early_events,
            url=self.url,
            binary=_dialect_of(selected).encoding == "msgpack",
            tls=uri.secure,
            close_timeout=self.close_timeout,
            ping_interval=self.ping_interval,
            ping_timeout=self.ping_timeout,
            clock=self._clock,
        )
        return connection, selected

    async def _open_on_asyncio(
        self, uri: WebSocketURI, offer: list[Subprotocol], extra_headers: Sequence[tuple[str, str]]
    ) -> tuple[AsyncioConnection, str | None]:
        """`_open` on asyncio: websockets' ``connect`` with this transport's handshake and errors."""
        connection: AsyncioConnection | None = None
        with self._clock.move_on_after(self.connect_timeout):
            try:
                connection = await AsyncioConnection.open(
                    self.url,
                    offer,
                    set_headers=functools.partial(self._set_headers, extra_headers=extra_headers),
                    compression=self.compression,
                    max_message_size=self.max_message_size,
                    ping_interval=self.ping_interval,
                    ping_timeout=self.ping_timeout,
                    close_timeout=self.close_timeout,
                    ssl_context=(self.ssl_context or default_ssl_context()) if uri.secure else None,
                    clock=self._clock,
                )
            except HandshakeFailed as exc:
                events: list[Event] = [exc.response] if exc.response is not None else []
                self._check_selected_subprotocol(events, offer)
                raise _connect_error(self.url, exc.reason, token_sent=sends_token(self._headers)) from exc.reason
            except _CONNECT_ERRORS as exc:
                raise _connect_error(self.url, exc) from network_cause(exc)
        if connection is None:
            raise ConnectError(f"timed out after {self.connect_timeout} s connecting to {self.url}")
        selected = connection.subprotocol
        try:
            self._check_speaks(selected)
        except BaseException:
            await connection.aclose()
            raise
        if _dialect_of(selected).encoding == "msgpack":
            connection.use_binary()
        return connection, selected

    async def _reconnect(self, token: str) -> OpenConnection:
        """A new connection to the session, presenting its resume token (for `ResumableConnection`).

        Raises:
            ConnectError: As on connect; the server did not take the resumable subprotocol again.
        """
        assert self.subprotocol is not None
        connection, selected = await self._open([Subprotocol(self.subprotocol)], [(RESUME_HEADER, token)])
        if selected != self.subprotocol:
            await connection.aclose()
            raise SessionRefused(f"the server no longer speaks {self.subprotocol} (it selected {selected!r})", b"")
        return connection

    async def _connect(
        self, uri: WebSocketURI, offer: list[Subprotocol], extra_headers: Sequence[tuple[str, str]]
    ) -> tuple[ByteStream, ClientProtocol, list[Event]]:
        """Open the socket and perform the handshake; return them and the events behind the response."""
        try:
            stream = await self._connect_tcp(uri)
        except _CONNECT_ERRORS as exc:
            raise _connect_error(self.url, exc) from network_cause(exc)
        try:
            protocol, early_events = await self._handshake(stream, uri, offer, extra_headers)
        except BaseException as exc:
            await close_quietly(stream)
            if isinstance(exc, _CONNECT_ERRORS) and not isinstance(exc, ConnectError):
                raise _connect_error(self.url, exc, token_sent=sends_token(self._headers)) from network_cause(exc)
            raise
        return stream, protocol, early_events

    async def _connect_tcp(self, uri: WebSocketURI) -> ByteStream:
        if not uri.secure:
            return await anyio.connect_tcp(uri.host, uri.port)
        return await anyio.connect_tcp(
            uri.host,
            uri.port,
            tls=True,
            ssl_context=self.ssl_context or default_ssl_context(),
            tls_hostname=uri.host,
            # WebSocket frames carry their own ends, so a peer that skips TLS's
            # close_notify truncates nothing.
            tls_standard_compatible=False,
        )

    def _set_headers(self, headers: Headers, extra_headers: Sequence[tuple[str, str]]) -> None:
        """Add this transport's headers to an upgrade request's; each replaces any default of its name."""
        added = list(self._headers)
        if not any(name.lower() == "user-agent" for name, _ in added):
            added.append(("User-Agent", _USER_AGENT))
        added += extra_headers
        for name in {name for name, _ in added}:
            if name in headers:
                del headers[name]
        for name, value in added:
            headers[name] = value

    async def _handshake(
        self, stream: ByteStream, uri: WebSocketURI, offer: list[Subprotocol], extra_headers: Sequence[tuple[str, str]]
    ) -> tuple[ClientProtocol, list[Event]]:
        """Send the upgrade request, read the response; return the protocol and any events behind it."""
        protocol = ClientProtocol(
            uri,
            extensions=enable_client_permessage_deflate(None) if self.compression else None,
            subprotocols=offer or None,
            max_size=self.max_message_size,
        )
        request = protocol.connect()
        self._set_headers(request.headers, extra_headers)
        protocol.send_request(request)
        for data in protocol.data_to_send():
            if data:
                await stream.send(data)
        while True:
            try:
                data = await stream.receive(READ_SIZE)
            except anyio.EndOfStream:
                data = b""
                protocol.receive_eof()
            else:
                protocol.receive_data(data)
            events = protocol.events_received()
            if protocol.handshake_exc is not None:
                self._check_selected_subprotocol(events, offer)
                raise protocol.handshake_exc
            if events and isinstance(events[0], Response):
                break
            if not data:
                raise ConnectError(f"the server at {self.url} closed the connection during the WebSocket handshake")
        self._check_speaks(protocol.subprotocol)
        return protocol, events[1:]

    def _check_speaks(self, selected: str | None) -> None:
        """Raise `ConnectError` if the subprotocol the server selected is not one openenv speaks."""
        if selected is not None and selected not in SUBPROTOCOLS and selected not in RESUMABLE_SUBPROTOCOLS:
            raise ConnectError(
                f"the server at {self.url} selected the subprotocol {selected!r}, which openenv cannot speak"
            )

    def _check_selected_subprotocol(self, events: list[Event], offer: list[Subprotocol]) -> None:
        """Name the subprotocol a failed handshake's response selected, if it was never offered."""
        response = events[0] if events else None
        if isinstance(response, Response) and response.status_code == 101:
            selected = response.headers.get("Sec-WebSocket-Protocol")
            if selected is not None and selected not in offer:
                offered = ", ".join(offer) or "none"
                raise ConnectError(
                    f"the server at {self.url} selected the subprotocol {selected!r}, which was not offered "
                    f"(offered: {offered})"
                )

    async def send(self, frame: bytes) -> None:
        """Send one frame: a text frame in a JSON dialect, a binary one for msgpack.

        Args:
            frame: The encoded message.

        Raises:
            ConnectionClosed: The connection is closed or broken, or was never opened.
        """
        await self._connection.send(frame)

    async def receive(self) -> bytes:
        """Return the next message from the server.

        Messages that arrived before the server closed the connection are returned
        first; only then does it raise.

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
        return await self._connection.receive()

    async def aclose(self) -> None:
        """Close the connection: the closing handshake (code 1000), then the socket.

        Waits at most `close_timeout` seconds for the server's part; idempotent,
        safe on a broken connection, from any task and under any cancel scope.
        Afterwards `send` and `receive` raise `ConnectionClosed`.
        """
        await self._connection.aclose()

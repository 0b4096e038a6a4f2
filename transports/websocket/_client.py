"""The WebSocket transport, client side: ``ws://``, ``wss://``, ``http://`` and ``https://`` URLs.

A `WebSocketTransport` is one session's side of a connection (`transports.websocket._link.Link`):
of a link shared by every session this event loop opens to the same server with
the same options (`transports.link._registry`), or of a connection of its own
where the server does not offer links (OpenEnv's) or the caller asked for one
(``share=False``). Opening the connection, and its handshake, is
`transports.websocket._handshake`'s.
"""

from __future__ import annotations

import math
import ssl
from collections.abc import Hashable, Sequence
from typing import Literal

import anyio
from websockets.exceptions import InvalidURI
from websockets.uri import parse_uri

from openenv import EVENT_LOOP_CLOCK, Clock, ConnectError, ConnectionClosed, Dialect, Transport
from openenv._batch import LinkStepBatcher
from openenv._lane import BLOCKING_CALLERS
from openenv._limits import (
    DEFAULT_CLIENT_CLOSE_TIMEOUT,
    DEFAULT_CLIENT_MAX_MESSAGE_SIZE,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PING_INTERVAL,
    DEFAULT_PING_TIMEOUT,
)
from transports.link._envelope import EnvelopeCodec
from transports.link._registry import PRIVATE, Private, forget, join
from transports.shared._network_client import HeaderPairs, client_headers, connect_once, split_url
from transports.shared._public_io import public_io_only
from transports.websocket._handshake import Handshaken, Upgrade, close_quietly, handshake
from transports.websocket._link import Link, LinkChannel
from transports.websocket._link_lane import SessionLane
from transports.websocket._subprotocols import (
    LINK_SUBPROTOCOLS,
    MAX_MESSAGE_HEADER,
    RESUME_HEADER,
    RESUME_TIMEOUT_HEADER,
    dialect_of,
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
        RESUME_TIMEOUT_HEADER.lower(),
        MAX_MESSAGE_HEADER.lower(),
    }
)

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


class WebSocketTransport(Transport):
    """OpenEnv frames over a WebSocket connection (``ws://``, ``wss://``, ``http://``, ``https://``).

    The URL is the server's base URL, as OpenEnv's client takes it: ``http://``
    becomes ``ws://``, ``https://`` becomes ``wss://``, and ``/ws`` is appended to
    the path after stripping trailing slashes (see `websocket_url`).

    On connect the transport offers openenv's subprotocols. A server that selects
    a link subprotocol (ours) carries every session this event loop opens to it
    with the same options over that one connection, in envelopes: opening a
    session there costs one small frame, not a handshake, and the frames that
    sessions send in one turn of the event loop leave as one message. A server
    that selects a one-session subprotocol (an older openenv) or none (OpenEnv's
    reference: plain JSON frames without request ids) gets a connection per
    session, as OpenEnv's client opens.

    The connection is read by whoever waits on it; while nobody does, by its
    keeper (`keep`), which its owner runs: the server's pings are answered while
    the caller thinks, a quiet server is pinged, a drop is noticed. It may be
    closed from any task.

    With ``resume`` (the default), a link survives a dropped connection: the
    transport reconnects, the new connection takes every session of the link
    over (the same environments), and each side sends again what the other did
    not receive. A caller waiting in `send` or `receive` sees nothing else: no
    request runs twice, no reply is lost. A connection closed on purpose (by the
    server: its close frame; or by the client) is not resumed. When resuming
    fails (the grace period ran out, the server forgot the link: it restarted,
    say), `send` and `receive` raise `ConnectionClosed` saying why.

    Examples:
        Its options are the client's transport options:

        ```python
        from openenv.examples.echo import EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000", encoding="msgpack", auth_token="...") as env:
            await env.reset()
            print(env.transport.subprotocol)  # openenv.v2.msgpack
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
        ping_interval: Seconds of silence from the server after which the
            connection's keeper pings it (``None``: no pings).
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
        share: Ride the link this event loop shares with other sessions to the
            same server (``False``: a connection of its own).
        resume: Resume a link whose connection dropped (see above); ``False``:
            the sessions end with the connection.
        resume_timeout: Seconds to keep trying to resume after a drop;
            ``None``: as long as the server keeps the sessions (30 s on ours by
            default).
        clock: Where the timeouts, the keepalive and the resumption's grace are
            measured (a test's clock, say); the event loop's time by default.

    Attributes:
        url: The WebSocket URL the transport connects to.
        subprotocol: The subprotocol the server selected, or ``None``; set on connect.
        dialect: How frames are written on this connection; set on connect.
        shared: Whether the session rides a link (``v2`` subprotocol); set on connect.
        resumable: Whether the session survives a dropped connection; set on connect.
        link_channel: The session's channel when it rides a link, else ``None``: what
            the link's batcher (`transports.link.LinkBatcher`) reads of each session.

    Raises:
        ValueError: An unsupported URL scheme, an unknown encoding, a TLS context
            for a plain-text URL, an invalid header, or both ``auth_token`` and
            an ``Authorization`` header.
    """

    send_waits = False  # a frame is written, or queued for the next receive: never an answer awaited

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
        share: bool = True,
        resume: bool = True,
        resume_timeout: float | None = None,
        clock: Clock = EVENT_LOOP_CLOCK,
    ) -> None:
        self.url = websocket_url(url)
        offer = offered_subprotocols(encoding) if subprotocols is None else list(subprotocols)
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
        self.share = share
        self.resume = resume
        self.resume_timeout = resume_timeout
        self._clock = clock
        self._offer = offer
        self._headers = pairs
        self.subprotocol: str | None = None
        self.shared = False
        self._entered = False
        self._link: Link | None = None
        self.link_channel: LinkChannel | None = None
        self._lanes = False  # opened for a blocking client: on a link only blocking clients ride, lent to them

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @property
    def resumable(self) -> bool:
        """Whether the session survives a dropped connection (it rides a link, and ``resume`` is on)."""
        return self.shared and self.resume

    @property
    def resumes(self) -> int:
        """How many times the session's link was resumed on a new connection after a drop."""
        return 0 if self._link is None else self._link.resumes

    def _key(self) -> Hashable:
        """What two transports must share to share a link: the URL and every option of the connection."""
        return (
            self.url,
            tuple(self._headers),
            tuple(self._offer),
            self.compression,
            self.max_message_size,
            self.ping_interval,
            self.ping_timeout,
            self.close_timeout,
            self.ssl_context,
            self.resume,
            self.resume_timeout,
            self._clock,
            self._lanes,
        )

    async def __aenter__(self) -> WebSocketTransport:
        """Open the session: on the shared link to the server, or on a connection of its own.

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
        connect_once(self._entered, self)
        self._entered = True
        # A blocking client's threads may borrow the connection: not one async sessions ride as well.
        self._lanes = BLOCKING_CALLERS.get() and self._clock is EVENT_LOOP_CLOCK and not public_io_only()
        try:
            upgrade = Upgrade(
                self.url,
                parse_uri(self.url),
                self._headers,
                self.compression,
                self.max_message_size,
                self.ssl_context,
            )
        except (InvalidURI, ValueError) as exc:
            raise ConnectError(f"invalid WebSocket URL {self.url!r}: {exc}") from exc
        link: Link | None = None
        if self.share:
            key = self._key()
            private: list[Link] = []

            async def connect() -> Link | Private:
                opened = await self._open(upgrade, key)
                if opened.shared:
                    return opened
                private.append(opened)  # ours alone, as the server carries one session per connection
                return PRIVATE

            link = await join(key, connect)
            if link is None:
                link = private[0] if private else await self._open(upgrade, None)
        else:
            link = await self._open(upgrade, None)
        self._link = link
        await link.reclaim()  # threads of other sessions may have it
        try:
            self.link_channel = link.open()
        except ConnectionClosed as exc:  # the link ended between its opening and now: say so as a connect error
            raise ConnectError(f"cannot open a session on the connection to {self.url}: {exc}") from exc
        self.shared = link.shared
        self.subprotocol = link.subprotocol
        self.dialect = dialect_of(link.subprotocol)
        return self

    async def _open(self, upgrade: Upgrade, key: Hashable | None) -> Link:
        """Connect, perform the handshake, and make a link of the connection.

        ``key`` is the registry's key of a shared link (``None``: the connection is private).
        """
        handshaken: Handshaken | None = None
        limit = self._limit_header()
        link: Link | None = None
        with self._clock.move_on_after(self.connect_timeout):
            handshaken = await handshake(upgrade, self._offer, limit)
            link = self._link_of(handshaken, upgrade, key, limit)
            try:
                await link.start()  # a shared link's Hello: its token and the server's message limit
            except BaseException:
                await link.aclose()
                raise
            return link
        if handshaken is not None:
            await close_quietly(handshaken.stream)
        raise ConnectError(f"timed out after {self.connect_timeout} s connecting to {self.url}")

    def _limit_header(self) -> list[tuple[str, str]]:
        """The handshake headers that tell a link's server this client's limits: its messages, its resuming."""
        headers = [] if self.max_message_size is None else [(MAX_MESSAGE_HEADER, str(self.max_message_size))]
        if not self.resume:
            headers.append((RESUME_TIMEOUT_HEADER, "0"))  # it never comes back: end the sessions with the connection
        elif self.resume_timeout is not None:
            headers.append((RESUME_TIMEOUT_HEADER, str(math.ceil(self.resume_timeout))))
        return headers

    def _link_of(
        self, handshaken: Handshaken, upgrade: Upgrade, key: Hashable | None, limit: list[tuple[str, str]]
    ) -> Link:
        """Make a link of a connection past its handshake."""
        selected = handshaken.protocol.subprotocol
        shared = selected in LINK_SUBPROTOCOLS
        dialect: Dialect = dialect_of(selected)

        async def reconnect(token: str) -> Handshaken:
            opened: Handshaken | None = None
            with self._clock.move_on_after(self.connect_timeout):
                opened = await handshake(upgrade, [selected] if selected else [], [(RESUME_HEADER, token), *limit])
            if opened is None:
                raise ConnectError(f"timed out after {self.connect_timeout} s reconnecting to {self.url}")
            if opened.protocol.subprotocol != selected:
                await close_quietly(opened.stream)
                raise ConnectionClosed(
                    f"the server no longer speaks {selected} (it selected {opened.protocol.subprotocol!r})"
                )
            return opened

        return Link(
            handshaken,
            url=self.url,
            subprotocol=selected,
            envelope=EnvelopeCodec(dialect.encoding) if shared else None,
            binary=dialect.encoding == "msgpack",
            close_timeout=self.close_timeout,
            ping_interval=self.ping_interval,
            ping_timeout=self.ping_timeout,
            reconnect=reconnect if shared and self.resume else None,
            resume_timeout=self.resume_timeout,
            clock=self._clock,
            quick_read=not public_io_only(),
            max_message_size=upgrade.max_message_size,
            on_idle=(lambda link: forget(key, link)) if key is not None else lambda link: None,
            lend_to_threads=self._lanes,
        )

    async def send(self, frame: bytes) -> None:
        """Send one frame (a text message in a JSON dialect, a binary one for msgpack; in an envelope on a link).

        On a link shared with other sessions the frame may wait for the next
        `receive` of any of them, so that the frames of one turn of the event
        loop leave as one message.

        Args:
            frame: The encoded message.

        Raises:
            ConnectionClosed: The connection is closed or broken, the server
                ended the session, or the transport was never opened.
        """
        link, channel = self._link, self.link_channel
        if link is None or channel is None:
            raise ConnectionClosed(f"the WebSocket transport to {self.url} is not connected")
        await link.reclaim()
        await link.send(channel, frame)

    async def receive(self) -> bytes:
        """Return the next frame from the server.

        Frames that arrived before the session ended are returned first; only then does it raise.

        Returns:
            The frame, as bytes.

        Raises:
            ConnectionClosed: The server closed the connection or ended the
                session (the message says why), the connection broke (EOF,
                reset, keepalive timeout) and was not resumed, or `aclose` was called.
            ProtocolError: The server broke the WebSocket protocol (an invalid
                frame, or a message larger than ``max_message_size``) or the
                link's; the connection is closed.
        """
        link, channel = self._link, self.link_channel
        if link is None or channel is None:
            raise ConnectionClosed(f"the WebSocket transport to {self.url} is not connected")
        await link.reclaim()
        return await link.receive(channel)

    def send_nowait(self, frame: bytes) -> None:
        """Post a frame on a link shared with other sessions, to leave with the next flush.

        Raises:
            anyio.WouldBlock: The frame must be written now (a connection of one
                session): await `send` instead.
            ConnectionClosed: The session has ended, or the transport is not connected.
        """
        link, channel = self._link, self.link_channel
        if link is None or channel is None:
            raise ConnectionClosed(f"the WebSocket transport to {self.url} is not connected")
        if link.lane is not None and link.lane.held:
            raise anyio.WouldBlock  # threads have the link: `send` takes it back
        link.send_nowait(channel, frame)

    def receive_nowait(self) -> bytes:
        """A frame from the server that came already.

        Raises:
            anyio.WouldBlock: None has: await `receive` instead.
            ConnectionClosed: The session has ended and every frame was returned.
            ProtocolError: The server broke the protocol.
        """
        link, channel = self._link, self.link_channel
        if link is None or channel is None:
            raise ConnectionClosed(f"the WebSocket transport to {self.url} is not connected")
        if link.lane is not None and link.lane.held:
            raise anyio.WouldBlock  # threads have the link: `receive` takes it back
        return link.receive_nowait(channel)

    def step_batcher(self) -> LinkStepBatcher | None:
        """Steps this session with the others of its link as one entry, when the server takes batches."""
        link, channel = self._link, self.link_channel
        if link is None or channel is None or channel.ended is not None or link.lane is not None:
            return None
        return link.step_batcher()

    @property
    def lent(self) -> bool:
        """Whether the session's connection is lent to a blocking client's threads now (see `blocking_lane`)."""
        link = self._link
        lane = None if link is None else link.lane
        return lane is not None and lane.lent

    def blocking_lane(self) -> SessionLane | None:
        """The session's lane for a blocking client's threads, lent if it can be (see `openenv._lane`).

        ``None`` unless the transport was opened for a blocking client
        (`openenv._lane.BLOCKING_CALLERS`) over a plain TCP connection.
        """
        link, channel = self._link, self.link_channel
        if link is None or channel is None:
            return None
        lane = link.lane
        if lane is None:
            return None
        link.lend()
        return SessionLane(lane, channel, link.lend)

    async def keep(self) -> None:
        """Keep the connection while nobody calls: answer pings, ping a quiet server, resume a drop.

        Its owner runs it in a task of its own from connect to close (see `openenv.Transport.keep`).
        """
        if self._link is not None:
            await self._link.keep()

    async def aclose(self) -> None:
        """End the session's use of the connection; the connection closes with its last session.

        Closing the connection is the closing handshake (code 1000), then the
        socket, waiting at most `close_timeout` seconds for the server's part.
        Idempotent, safe on a broken connection, from any task and under any
        cancel scope. Afterwards `send` and `receive` raise `ConnectionClosed`.
        """
        link, channel = self._link, self.link_channel
        if link is not None and channel is not None:
            await link.reclaim()
            await link.leave(channel)

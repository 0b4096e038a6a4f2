"""A WebSocket connection, client side, that carries one session or many, driven by the calls made on it.

A `Link` runs no task of its own. Its socket is read by whoever waits on it: the
first session waiting in `Link.receive` reads for every session of the link
(the *reader*) and hands each its frames; the others wait for theirs, and one
of them takes the reading over when the reader has what it came for. Writes go
through one lock (`transports.websocket._link_write`). So a link may be opened in one task, used from many and closed
from any, under any cancel scope, and it costs a lone session nothing.

While nobody waits, the socket is read by the link's *keeper*: `Link.keep`, the
idle work a client's owner (its ``async with`` block, an `openenv.EnvPool`, the
blocking facade) runs in a task group of its own. The keeper starts reading only
once nobody has read for `IDLE_READ` seconds, so that the server's pings are
answered while every session thinks; it pings the server when the connection
has been quiet, and notices a drop. One keeper is at work per link; the others
wait their turn.

A link speaks one of two framings. On a ``v2`` subprotocol (`LINK_SUBPROTOCOLS`)
it is shared: every message is an envelope (`transports.link._envelope`), frames that
sessions send in one turn of the event loop leave together, and a dropped
connection is replaced by a new one that takes every session over (with
``resume``). On any other it carries one session, whose frames are the messages
themselves, and ends with its connection.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import msgspec
from anyio.abc import ByteStream, SocketAttribute
from websockets.client import ClientProtocol
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Event, State

from openenv import (
    AuthenticationError,
    Clock,
    ConnectError,
    ConnectionClosed,
    OpenEnvError,
    ProtocolError,
)
from openenv._batch import BatchedReply
from transports.link._batch import LinkBatcher
from transports.link._client import LinkChannel
from transports.link._client import for_send as _for_send
from transports.link._client import fresh as _fresh
from transports.link._envelope import LINK_CHANNEL, End, EnvelopeCodec, Hello, Resumed, fits
from transports.link._state import ClientLinkState, LinkProtocolError
from transports.shared._network_client import STREAM_ERRORS, describe
from transports.websocket._handshake import READ_SIZE, Handshaken, close_quietly
from transports.websocket._link_lane import LendingLink, LinkLane
from transports.websocket._quick_frames import FrameBoundaries, whole_data_frames
from transports.websocket._socket_reader import SocketReader, socket_reader

__all__ = ["IDLE_READ", "RECEIVE_BUFFER", "Link", "LinkChannel", "Reconnect"]

IDLE_READ = 1.0
"""Seconds a link goes unread before its keeper reads it (answering the server's pings)."""

RECEIVE_BUFFER = 64
"""Frames a session may hold unread before the keeper stops reading for it (TCP then holds the server back)."""

# Seconds between attempts to resume a dropped link: doubled each time, up to the maximum.
_FIRST_RETRY_DELAY = 0.05
_MAX_RETRY_DELAY = 1.0

Reconnect = Callable[[str], Awaitable[Handshaken]]
"""Opens a new connection presenting a link's token (the ``OpenEnv-Resume`` header)."""


def _refused(exc: BaseException) -> bool:
    """Whether a failure to connect was a refusal (nothing listens on the port) at every address tried."""
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, ConnectionRefusedError):
        inner = getattr(cause, "exceptions", None)
        if inner:
            return all(isinstance(e, ConnectionRefusedError) or _refused(e) for e in inner)
        cause = cause.__cause__
    return cause is not None


class Link(LendingLink):
    """One open WebSocket connection carrying its sessions' frames; see the module's docstring.

    Its write path is `transports.websocket._link_write.LinkWriter`'s; its loan
    to blocking clients' threads, `transports.websocket._link_lane.LendingLink`'s.

    Args:
        handshaken: The connection, past the upgrade.
        url: The WebSocket URL, for the messages.
        subprotocol: The subprotocol the server selected (``None``: plain OpenEnv).
        envelope: The envelope codec on a ``v2`` subprotocol; ``None`` for a
            connection of one session.
        binary: Send binary messages (MessagePack) instead of text ones.
        close_timeout: Seconds the server gets to end the TCP connection after a close frame.
        ping_interval: Seconds of quiet after which the keeper pings the server (``None``: never).
        ping_timeout: Seconds a pong may take before the connection counts as dead (``None``: forever).
        reconnect: Opens a connection that takes the link over after a drop;
            ``None``: a dropped link ends every session on it.
        resume_timeout: Seconds to keep trying to resume after a drop; ``None``:
            as long as the server keeps the sessions (its `Hello` says).
        clock: Where the keeper's and the resumption's waits are measured.
        quick_read: Read whole data frames without websockets' parser (see
            `transports.websocket._quick_frames`) on a connection with no
            extension (compression); off with ``OPENENV_PUBLIC_IO=1``.
        max_message_size: The largest message taken from the server (the
            protocol's own limit, which the quick read keeps too).
        on_idle: Called once when the link ends, or its last session leaves
            (a registry of shared links forgets it there).
        lend_to_threads: Only blocking clients ride it: lend it to their threads
            (`transports.websocket._link_lane`) while it is a plain TCP socket read quickly.
    """

    _session_name = "WebSocket session"

    def __init__(
        self,
        handshaken: Handshaken,
        *,
        url: str,
        subprotocol: str | None,
        envelope: EnvelopeCodec | None,
        binary: bool,
        close_timeout: float,
        ping_interval: float | None,
        ping_timeout: float | None,
        reconnect: Reconnect | None,
        resume_timeout: float | None,
        clock: Clock,
        quick_read: bool = False,
        max_message_size: int | None = None,
        on_idle: Callable[[Link], object] = lambda link: None,
        lend_to_threads: bool = False,
    ) -> None:
        super().__init__(url=url, codec=envelope, clock=clock, close_timeout=close_timeout, on_idle=on_idle)
        self.subprotocol = subprotocol
        self._ping_interval = ping_interval
        self._ping_timeout = ping_timeout
        self._reconnect = reconnect
        self._resume_timeout = resume_timeout
        self._binary = binary
        self._envelope = envelope
        self._quick_read = quick_read
        self._max_message_size = max_message_size
        self._reading = False  # a session (or the keeper) reads the socket
        self._last_read = clock.now()  # when the socket was last read (or begun to be)
        self._last_received = clock.now()  # when bytes last came from the server
        self._coalescing = False  # a session lets the others of this turn post their frames
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._pong: tuple[bytes, anyio.Event] | None = None  # the keeper's ping awaiting its pong
        self._token: str | None = None  # the link's resume token, from the server's Hello
        self._server_resume_timeout = 0.0
        self.server_limit: int | None = None  # the largest message the server takes, from its Hello
        self._batcher: LinkBatcher | None = None  # set once the server's Hello says it takes steps entries
        self._broken: ConnectionClosed | ProtocolError | None = None  # the connection dropped; not yet replaced
        self._gone = anyio.Event()  # set once the socket in use has ended (EOF, a failure, a shutdown)
        self.resumes = 0
        self._lane = LinkLane(self) if lend_to_threads else None
        self._deferred_end: tuple[ConnectionClosed | ProtocolError, BaseException | None] | None = None
        self._take_over(handshaken)

    def __repr__(self) -> str:
        kind = "shared" if self.shared else "one-session"
        return f"<{type(self).__name__} {kind} {self.url} sessions={len(self._channels)}>"

    # -- the connection ------------------------------------------------------------

    def _take_over(self, handshaken: Handshaken) -> None:
        """Use a new connection from now on (the first one, or one that resumed the link)."""
        self._stream: ByteStream = handshaken.stream
        self._protocol: ClientProtocol = handshaken.protocol
        self._send_data = self._protocol.send_binary if self._binary else self._protocol.send_text
        # The plain TCP socket under the stream, read and written directly: anyio's stream would
        # add a pass through the event loop to every message. A descriptor of our own (a dup),
        # because on asyncio the stream's transport holds the original one (paused, idle, since
        # the handshake) and asyncio lets no one else wait on it. None for TLS: its stream does it.
        self._socket: socket.socket | None = None
        self._reader: SocketReader | None = None
        if not handshaken.tls:
            self._socket = self._stream.extra(SocketAttribute.raw_socket).dup()
            self._socket.setblocking(False)
            self._reader = socket_reader(self._socket, READ_SIZE)
        self._partial = bytearray()  # a data message arriving in fragments
        self._fragmented = False  # one is (its first fragment may be empty)
        self._boundaries = FrameBoundaries()  # whether the protocol holds part of a frame
        self._boundaries.feed(handshaken.after_response)
        # An extension (compression) may change any frame: only its parser can read them.
        self._quick = self._quick_read and not handshaken.protocol.extensions
        self._unsent: list[bytes] = []  # bytes the protocol queued, taken from it and not yet written
        self._broken = None
        if self._gone.is_set():
            self._gone = anyio.Event()
        self._last_received = self._clock.now()
        # What came right behind the handshake's response: acted on once the first session is there.
        self._early = list(handshaken.early_events)
        if self._channels:
            self._act_on_early_events()

    def _act_on_early_events(self) -> None:
        early, self._early = self._early, []
        self._after_events(early)  # a close or a protocol error may have come with the response, too

    async def start(self) -> None:
        """Read the server's `Hello` of a shared link (its token, its message limit); nothing to do for one session.

        Raises:
            ConnectionClosed: The connection ended first.
            ProtocolError: The server's first message is no envelope.
        """
        if self._state is None:
            return
        self._act_on_early_events()  # the Hello may have come with the handshake's response
        self._reading = True
        try:
            while self._token is None:
                if self._ended is not None:
                    raise self._ended_error()
                if self._broken is not None:
                    raise _fresh(self._broken)
                await self._read_some()
        finally:
            self._release_reading()

    # -- sessions ----------------------------------------------------------------------

    def open(self) -> LinkChannel:
        """Open a session on the link: a channel of its own (its `Open` leaves with the next frames).

        Returns:
            The session's channel.

        Raises:
            ConnectionClosed: The link is over, or carries one session and has it already.
        """
        channel = super().open()
        self._act_on_early_events()
        return channel

    def step_batcher(self) -> LinkBatcher | None:
        """What steps this link's sessions together, while the server takes batches and others share the link."""
        batcher = self._batcher
        return batcher if batcher is not None and len(self._channels) > 1 else None

    def steps_state(self) -> ClientLinkState | None:
        """The link's numbering, where a pool's ``steps`` entry is posted; ``None`` when none may be: ended, broken."""
        if self._ended is not None or self._broken is not None:
            return None
        return self._state

    async def send(self, channel: LinkChannel, frame: bytes) -> None:
        """Send one of a session's frames.

        On a shared link with other sessions, the frame waits until a session
        of the link waits for a reply or closes: the frames of one turn of the
        event loop leave as one message.

        Raises:
            ConnectionClosed: The session's channel has ended, or the link broke
                and is not being resumed.
        """
        if channel.ended is not None:
            raise _for_send(channel.ended)
        state = self._state
        if state is None:
            async with self._write_lock:
                self._check_writable()
                self._send_data(frame)
                await self._write_pending()
            return
        channel_state = state.channels.get(channel.number)
        if channel_state is None:  # ended by the server while the caller got here
            raise _for_send(channel.ended or self._ended_error())
        refusal = self._refusal(frame)
        if refusal is not None:
            # Sent, it would end the connection of every session: this session gives up alone.
            channel.ended = ConnectionClosed(f"{refusal}; the session ended")
            state.leave(channel.number)
            await self._flush()
            raise _for_send(channel.ended)
        self._post(channel_state, frame)
        if len(self._channels) == 1:
            await self._flush()

    def _refusal(self, frame: bytes) -> str | None:
        """Why a frame cannot travel in an envelope (too big for the server, not one value), or ``None``."""
        if not fits(len(frame), self.server_limit):
            return (
                f"1009 (message too big): a frame of {len(frame)} bytes is over the server's limit "
                f"of {self.server_limit} bytes"
            )
        assert self._check_frame is not None
        try:
            self._check_frame(frame)
        except (msgspec.DecodeError, RecursionError) as exc:
            encoding = "MessagePack" if self._binary else "JSON"
            return f"a frame that is not one {encoding} value cannot travel on a link ({exc})"
        return None

    def send_nowait(self, channel: LinkChannel, frame: bytes) -> None:
        """Post a session's frame on a shared link with other sessions, to leave with the next flush.

        Raises:
            anyio.WouldBlock: It cannot be posted without waiting (a link of one
                session writes at once; a frame over the server's limit ends its session): use `send`.
            ConnectionClosed: The session's channel has ended.
        """
        state = self._state
        if state is None or len(self._channels) == 1:
            raise anyio.WouldBlock
        if channel.ended is not None:
            raise _for_send(channel.ended)
        channel_state = state.channels.get(channel.number)
        if channel_state is None or self._refusal(frame) is not None:
            raise anyio.WouldBlock  # `send` tells why
        self._post(channel_state, frame)

    async def receive(self, channel: LinkChannel) -> bytes:
        """The next frame for a session: read by this call, or by another session's.

        Frames that came before the channel ended are returned first. A reply
        that came in a batch (`receive_step`) is dropped: it answers a batch
        given up on.

        Raises:
            ConnectionClosed: The channel has ended (the server ended the
                session, the link broke and was not resumed, or it was closed).
            ProtocolError: The server broke the protocol.
        """
        while True:
            frame = await self.receive_step(channel)
            if type(frame) is bytes:
                return frame

    async def receive_step(self, channel: LinkChannel) -> bytes | BatchedReply:
        """The next frame for a session, or its reply that came in a batch; see `receive`.

        Raises:
            ConnectionClosed: The channel has ended (the server ended the
                session, the link broke and was not resumed, or it was closed).
            ProtocolError: The server broke the protocol.
        """
        frames = channel.frames
        while True:
            if frames:
                return frames.popleft()
            if channel.ended is not None:
                raise _fresh(channel.ended)
            if self._has_output():
                if len(self._channels) > 1 and not self._coalescing:
                    # Let the other sessions that run in this turn post theirs first: one message for all.
                    self._coalescing = True
                    try:
                        await anyio.lowlevel.checkpoint()
                    finally:
                        self._coalescing = False
                        # Even when cancelled: the others' frames wait for this flush.
                        with (
                            anyio.CancelScope(shield=True),
                            anyio.move_on_after(self._close_timeout),
                            contextlib.suppress(OpenEnvError),
                        ):
                            await self._flush()
                    continue
                if not self._coalescing:
                    await self._flush()
                    continue
            if not self._reading:
                await self._read_for(channel)
                continue
            await self._wait_for(channel)

    async def aclose(self) -> None:
        """Close the link: send what is posted, the closing handshake (1000), then the socket.

        Every session still on it is ended. Idempotent; shielded and bounded.
        """
        if self._closing:
            return
        self._closing = True
        self._forget()
        if self._state is not None and self._token is not None:
            # Said in the link too: some servers (hypercorn) report a client's closing handshake as a drop.
            self._state.post_control(LINK_CHANNEL, End())
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._close_timeout):
            with contextlib.suppress(OpenEnvError):
                await self._flush()
            with contextlib.suppress(OpenEnvError):
                async with self._write_lock:
                    if self._broken is None and self._protocol.state is State.OPEN:
                        self._protocol.send_close(CloseCode.NORMAL_CLOSURE)
                    if self._protocol.state is not State.CLOSED:
                        # Ours, or the close frame the protocol queued when the server broke it (1009, 1002).
                        await self._write_pending()
            # The server echoes the close and ends the TCP connection: read until it does,
            # unless a session (or the keeper) reads already.
            if self._reading:
                await self._gone.wait()
            else:
                self._reading = True
                try:
                    while not self._gone.is_set():
                        await self._read_some()
                finally:
                    self._reading = False
        self._end_all(ConnectionClosed(f"the WebSocket connection to {self.url} was closed by the client"))
        await self._close_socket()

    async def _close_socket(self) -> None:
        """Close the connection's socket (and our descriptor of it) now, under any cancel scope."""
        sock, reader = self._socket, self._reader
        if reader is not None:
            reader.close()  # a task waiting on it wakes up, and finds it closed
        if sock is not None:
            sock.close()
        await close_quietly(self._stream)

    async def _keep(self) -> None:
        clock = self._clock
        interval = self._ping_interval
        while self._ended is None and not self._closing:
            lane = self._lane
            if lane is not None and lane.held:
                idle = lane.idle_for()  # lent to threads: taken back once they leave it unused
                if idle < IDLE_READ:
                    await clock.sleep(IDLE_READ - idle)
                else:
                    await self.reclaim()
                continue
            now = clock.now()
            if self._broken is not None and not self._reading:
                self._reading = True
                try:
                    await self._recover()
                finally:
                    self._release_reading()
                continue
            if interval is not None and now - self._last_received >= interval:
                await self._ping()
                continue
            wake_at = self._last_received + interval if interval is not None else math.inf
            if not self._reading and not self._waiting and now - self._last_read >= IDLE_READ and not self._full():
                await self._read_while_idle(wake_at)
                continue
            await clock.sleep(min(IDLE_READ, wake_at - now))

    async def _read_while_idle(self, until: float) -> None:
        """Read as the keeper until a session waits for the reading, or ``until`` (a ping is due)."""
        self._reading = True
        try:
            with self._clock.cancel_scope(deadline=until):
                while self._ended is None and not self._waiting and self._broken is None and not self._full():
                    await self._read_some()
        finally:
            self._release_reading()

    def _full(self) -> bool:
        """Whether a session holds `RECEIVE_BUFFER` frames unread: the keeper reads no more until it takes some."""
        return any(len(channel.frames) >= RECEIVE_BUFFER for channel in self._channels.values())

    async def _ping(self) -> None:
        """Ping the server; if no pong (nor anything else) comes within the timeout, drop the connection."""
        payload = os.urandom(4)
        pong = anyio.Event()
        self._pong = (payload, pong)
        try:
            async with self._write_lock:
                if self._broken is not None or self._protocol.state is not State.OPEN:
                    return
                self._protocol.send_ping(payload)
                await self._write_pending()
            with self._clock.move_on_after(self._ping_timeout) as scope:
                if self._reading:
                    await pong.wait()
                else:
                    self._reading = True
                    try:
                        while not pong.is_set() and self._broken is None and self._ended is None:
                            await self._read_some()
                    finally:
                        self._release_reading()
            if scope.cancelled_caught:
                self._break(
                    ConnectionClosed(
                        f"the server at {self.url} did not answer a keepalive ping within {self._ping_timeout} s"
                    )
                )
        finally:
            self._pong = None
            self._last_received = self._clock.now()

    # -- reading -------------------------------------------------------------------------

    async def _read_for(self, channel: LinkChannel) -> None:
        """Read for every session until ``channel`` has a frame or has ended."""
        self._reading = True
        try:
            while not channel.frames and channel.ended is None:
                if self._broken is not None:
                    await self._recover()
                    continue
                await self._read_some()
        finally:
            self._release_reading()

    def _release_reading(self) -> None:
        """Stop reading; hand the reading to a session still waiting for a frame, if any."""
        self._reading = False
        self._last_read = self._clock.now()
        self._wake_one()

    async def _read_some(self) -> None:
        """Read once from the socket and act on what came; a failure breaks the connection (noted)."""
        self._unsent += self._protocol.data_to_send()
        if self._unsent:  # a pong owed for a ping that came with the handshake's response, say
            await self._write_controls()
        try:
            data = await self._receive()
        except anyio.EndOfStream:
            data = b""
        except (*STREAM_ERRORS, anyio.BrokenResourceError) as exc:
            self._gone.set()
            self._break(ConnectionClosed(f"the connection to {self.url} broke: {describe(exc)}"), exc)
            return
        await self._took(data)

    async def _took(self, data: bytes) -> None:
        """Act on bytes read from the socket (``b""``: the server ended the TCP connection)."""
        protocol = self._protocol
        if not data:
            self._gone.set()
            protocol.receive_eof()
            self._after_events(protocol.events_received())
            self._break(self._closed_error("the connection was lost without a WebSocket closing handshake"))
            return
        self._last_received = self._clock.now()
        events = self._parse(data)
        if events is None:
            return
        self._unsent += protocol.data_to_send()
        if self._unsent:  # pongs, a close echo
            await self._write_controls()
        self._after_events(events)

    def _parse(self, data: bytes) -> list[Event] | None:
        """Act on bytes read: hand out whole data frames at once (``None``), else the protocol's events from them."""
        protocol = self._protocol
        if self._quick and not self._fragmented and self._boundaries.at_boundary and protocol.state is State.OPEN:
            messages = whole_data_frames(data, self._max_message_size, masked=False)
            if messages is not None:  # nothing but whole data frames: the protocol has nothing to do
                for _, message in messages:
                    self._message(message)
                return None
        if self._quick:
            self._boundaries.feed(data)
        protocol.receive_data(data)
        return protocol.events_received()

    async def _write_controls(self) -> None:
        """Write the protocol's answers (pongs, a close echo) now, unless a writer has the lock (and writes them)."""
        if not self._write_lock.locked():
            with anyio.CancelScope(shield=True), contextlib.suppress(ConnectionClosed):
                async with self._write_lock:
                    await self._write_pending()

    async def _receive(self) -> bytes:
        """The next bytes from the socket, waiting for some.

        Raises:
            anyio.EndOfStream: The server ended the TCP connection.
            OSError: The socket failed.
        """
        reader = self._reader
        if reader is None:
            return await self._stream.receive(READ_SIZE)
        return await reader.receive()

    def _after_events(self, events: list[Event]) -> None:
        self._handle_events(events)
        protocol = self._protocol
        if protocol.state is not State.OPEN and self._broken is None and not self._resuming:
            broke = self._broken_protocol()
            if broke is not None:
                self._end_all(broke)
            elif protocol.close_rcvd is not None:
                self._end_all(
                    ConnectionClosed(f"the server at {self.url} closed the WebSocket connection: {protocol.close_rcvd}")
                )

    def _handle_events(self, events: list[Event]) -> None:
        """Hand the data messages to the sessions; note the keeper's pong."""
        for event in events:
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                if event.fin:
                    self._message(bytes(event.data))
                else:
                    self._partial, self._fragmented = bytearray(event.data), True
            elif opcode is Opcode.CONT:  # the protocol checks the sequence
                self._partial += event.data
                if event.fin:
                    message, self._partial, self._fragmented = bytes(self._partial), bytearray(), False
                    self._message(message)
            elif opcode is Opcode.PONG:
                pong = self._pong
                if pong is not None and pong[0] == event.data:
                    pong[1].set()
            # PING: the protocol queued the pong. CLOSE: seen by the state change.

    def _message(self, message: bytes) -> None:
        state = self._state
        if state is None:
            self._deliver(1, message)
            return
        assert self._envelope is not None
        try:
            controls = state.take(self._envelope.decode(message))
        except (msgspec.DecodeError, LinkProtocolError) as exc:
            self._end_all(ProtocolError(f"the server at {self.url} sent a message that is not an envelope: {exc}"))
            return
        for control in controls:
            if isinstance(control, Hello):
                self._token = control.token
                self._server_resume_timeout = control.resume_timeout
                self.server_limit = control.max_message_size
                if control.batches and self._batcher is None:
                    self._batcher = LinkBatcher(self)
            elif isinstance(control, Resumed):
                state.resumed(control)
                self._resumed = True

    def _read_what_is_left(self) -> None:
        """Feed the protocol what the socket still holds (a close frame, say), without waiting for more."""
        reader, protocol = self._reader, self._protocol
        if reader is None:
            return
        while protocol.close_rcvd is None:
            try:
                data = reader.receive_nowait()
            except (OSError, anyio.EndOfStream, anyio.ClosedResourceError):  # the socket failed, or ended
                return
            if not data:
                return
            self._boundaries.feed(data)
            protocol.receive_data(data)
            self._handle_events(protocol.events_received())

    # -- breaking, resuming, ending ------------------------------------------------------

    def _break(self, error: ConnectionClosed | ProtocolError, cause: BaseException | None = None) -> None:
        """The connection is lost: resume the link later if it can be, else end every session now."""
        if self._broken is not None or self._ended is not None:
            return
        if error.__cause__ is None and cause is not None:
            error.__cause__ = cause
        self._broken = error
        self._gone.set()
        self._protocol.receive_eof()  # the protocol is CLOSED after it; nothing more is written
        self._protocol.data_to_send()
        self._unsent.clear()
        self._shut_down()
        if self._closing or self._reconnect is None or self._token is None:
            self._end_all(error)
        for waiting in list(self._waiting.values()):  # whoever reads next resumes it
            waiting.wake()

    async def _recover(self) -> None:
        """Replace a dropped connection with one that takes the link over; else end every session.

        Called by whoever reads (a session, or the keeper) once the connection broke.
        """
        broken = self._broken
        assert broken is not None
        assert self._reconnect is not None
        assert self._token is not None
        stream = self._stream
        with anyio.CancelScope(shield=True):
            await self._close_socket()
        why = str(broken)
        budget = self._server_resume_timeout if self._resume_timeout is None else self._resume_timeout
        clock = self._clock
        deadline = clock.now() + budget
        delay = _FIRST_RETRY_DELAY
        last_error: OpenEnvError | None = None
        while self._ended is None:
            with clock.cancel_scope(deadline=deadline):
                try:
                    await self._resume_once()
                    self.resumes += 1
                    return
                except (AuthenticationError, _Refused) as exc:
                    self._end_all(ConnectionClosed(f"{why}; the sessions could not be resumed: {exc}"), exc)
                    return
                except (ConnectError, ConnectionClosed) as exc:
                    if self._stream is not stream:  # the attempt's own connection: let it go
                        stream = self._stream
                        await self._close_socket()
                    if isinstance(exc, ConnectError) and _refused(exc):
                        # Nothing listens on the port: the server's process, and the sessions with it, is gone.
                        self._end_all(
                            ConnectionClosed(
                                f"{why}; the sessions could not be resumed: the server is gone (connection refused)"
                            ),
                            exc,
                        )
                        return
                    last_error = exc
                await clock.sleep(min(delay, max(0.0, deadline - clock.now())))
                delay = min(delay * 2, _MAX_RETRY_DELAY)
            if clock.now() >= deadline:
                detail = f" (the last attempt: {last_error})" if last_error is not None else ""
                self._end_all(
                    ConnectionClosed(f"{why}; the sessions could not be resumed within {budget:g} s{detail}"),
                    last_error,
                )
                return

    async def _resume_once(self) -> None:
        """One attempt: connect presenting the token, say what the client holds, wait for `Resumed`."""
        assert self._reconnect is not None
        assert self._token is not None
        assert self._state is not None
        handshaken = await self._reconnect(self._token)
        async with self._write_lock:
            self._resumed = False
            self._resuming = True
            self._take_over(handshaken)
            assert self._envelope is not None
            if self._protocol.state is State.OPEN:
                resume = self._state.resume()
                self._send_data(self._envelope.encode([resume]))
                await self._write_pending()
        try:
            while not self._resumed:
                refused = self._protocol.close_rcvd
                if refused is not None:  # it knows no such link (a restarted server, one that gave up)
                    raise _Refused(f"the server refused it ({refused})")
                if self._broken is not None:
                    raise ConnectionClosed(str(self._broken))
                if self._ended is not None:
                    raise self._ended_error()
                await self._read_some()
        finally:
            self._resuming = False
        await self._flush()  # what the server lacks

    def _end_all(self, error: ConnectionClosed | ProtocolError, cause: BaseException | None = None) -> None:
        """The link is over: every session's channel ends with ``error`` (a session's own end stays)."""
        if self._on_lane:  # in a borrowing thread: the event loop ends it when it takes the link back
            if self._deferred_end is None:
                self._deferred_end = (error, cause)
            return
        if self._broken is None:
            self._broken = error
        super()._end_all(error, cause)

    _on_lane = False  # a borrowing thread hands out a message: ending the link waits for the event loop
    _resumed = False  # the server's Resumed came on the connection that takes the link over
    _resuming = False  # a connection is taking the link over: its close is a refusal, not the link's end


class _Refused(ConnectionClosed):
    """The server closed a connection that came to take a link over: it does not know the link."""

"""A client's end of a link, whatever carries its messages: its sessions' channels, their frames, their ends.

A link carries the sessions of many clients of one process to one server
(`transports.link._envelope`, `transports.link._state`). `ClientLink` keeps what
every carrier needs: a `LinkChannel` per session, the frames handed to each,
the sessions waiting for theirs, how each channel (or the whole link) ended,
a session leaving (`ClientLink.leave`), and the turn of the link's keeper
(`ClientLink.keep`, the idle work a client's owner runs). A carrier adds how
messages move: what `receive` does when a session has no frame yet (read for
everyone, or wait for whoever reads), how posted entries leave (``_flush``),
what the keeper does, and how the link closes (`ClientLink.aclose`).

It runs no task of its own: whoever waits in ``receive`` does the carrier's
I/O for every session, and the keeper does it while nobody waits.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

import anyio
import msgspec

from openenv import Clock, ConnectionClosed, OpenEnvError, ProtocolError
from openenv._batch import BatchedReply
from transports.link._envelope import End, EnvelopeCodec, Stepped
from transports.link._state import ClientLinkState

__all__ = ["RECEIVE_LIMIT", "ClientLink", "LinkChannel", "for_send", "fresh"]

RECEIVE_LIMIT = 4096
"""The most frames a session may hold unread; a server sending more breaks the protocol."""


class LinkChannel:
    """One session's side of a link: its frames from the server, and how its channel ended.

    Attributes:
        number: The channel's number on the link (1 for the one session of an unshared link).
        frames: Frames from the server, not yet taken by the session; a reply
            that came in a batch is its `BatchedReply` (taken by a pool's batch,
            dropped by a session's own receive: it answers a batch given up on).
        ended: Why nothing more will come, once the session's channel has ended.
    """

    __slots__ = ("ended", "frames", "number", "waiter", "waiters")

    def __init__(self, number: int) -> None:
        self.number = number
        self.frames: deque[bytes | BatchedReply] = deque()
        self.ended: ConnectionClosed | ProtocolError | None = None
        # Set to wake the calls waiting in receive (they share it): a frame came, or one is to do the I/O now.
        self.waiter: anyio.Event | None = None
        self.waiters = 0  # calls waiting in receive, not doing the I/O

    def wake(self) -> None:
        """Wake the calls of the session waiting in ``receive``."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set()


class ClientLink:
    """The sessions of one link, client side, whatever carries it; see the module's docstring.

    Args:
        url: The server's URL, for the messages.
        codec: The link's envelope codec; ``None`` for a connection that carries
            one session, whose frames are its messages (a WebSocket one only).
        clock: Where the keeper's waits are measured.
        close_timeout: Seconds a session leaving (and the link's close) waits for the server.
        on_idle: Called once when the link ends, or its last session leaves
            (a registry of shared links forgets it there).

    Attributes:
        url: The server's URL.
    """

    _session_name = "session"
    """What one of its sessions is called in the errors: ``"WebSocket session"``, say."""

    def __init__(
        self,
        *,
        url: str,
        codec: EnvelopeCodec | None,
        clock: Clock,
        close_timeout: float,
        on_idle: Callable[[Any], object] = lambda link: None,
    ) -> None:
        self.url = url
        self.shared = codec is not None
        self._codec = codec
        self._clock = clock
        self._close_timeout = close_timeout
        self._on_idle: Callable[[Any], object] | None = on_idle
        self._state: ClientLinkState | None = None
        # Checks that a frame is one value of the link's encoding (embedded raw, anything else breaks the envelope).
        self._check_frame: Callable[[bytes], object] | None = None
        if codec is not None:
            self._state = ClientLinkState(
                codec, deliver=self._deliver, end=self._end_channel, batched=self._deliver_batched
            )
            self._check_frame = (
                msgspec.json.Decoder(msgspec.Raw) if codec.encoding == "json" else msgspec.msgpack.Decoder(msgspec.Raw)
            ).decode
        self._channels: dict[int, LinkChannel] = {}
        self._waiting: dict[int, LinkChannel] = {}  # sessions waiting in receive for someone else's I/O
        self._keeping = False  # a keeper is at work
        self._keeper_turn: anyio.Event | None = None  # set when the keeper at work stops
        self._ended: ConnectionClosed | ProtocolError | None = None  # the link is over, for good
        self._closing = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} sessions={len(self._channels)}>"

    @property
    def sessions(self) -> int:
        """How many sessions ride the link now."""
        return len(self._channels)

    @property
    def ended(self) -> bool:
        """Whether the link is over for good (closed, or broken)."""
        return self._ended is not None

    def open(self) -> LinkChannel:
        """Open a session on the link: a channel of its own (its `Open` leaves with the next frames).

        Returns:
            The session's channel.

        Raises:
            ConnectionClosed: The link is over.
        """
        if self._ended is not None:
            raise self._ended_error()
        if self._state is None:
            if self._channels:
                raise ConnectionClosed(f"the connection to {self.url} carries one session only")
            channel = LinkChannel(1)
        else:
            channel = LinkChannel(self._state.open().number)
        self._channels[channel.number] = channel
        return channel

    def post(self, channel: LinkChannel, frame: bytes) -> None:
        """Queue one of a session's frames on its channel; it leaves with the link's next message.

        A frame that is not one value of the link's encoding cannot travel in
        an envelope (it would break the whole message): it is refused, and its
        session ends, alone.

        Raises:
            ConnectionClosed: The session's channel has ended, or the frame was refused.
        """
        if channel.ended is not None:
            raise for_send(channel.ended)
        assert self._state is not None
        assert self._check_frame is not None
        channel_state = self._state.channels.get(channel.number)
        if channel_state is None:  # ended by the server while the caller got here
            raise for_send(channel.ended or self._ended_error())
        try:
            self._check_frame(frame)
        except (msgspec.DecodeError, RecursionError) as exc:
            encoding = "MessagePack" if self._codec is not None and self._codec.encoding == "msgpack" else "JSON"
            self._refuse(channel, f"a frame that is not one {encoding} value cannot travel on a link ({exc})")
        self._state.post(channel_state, msgspec.Raw(frame))

    def receive_nowait(self, channel: LinkChannel) -> bytes:
        """A frame the session holds already.

        Raises:
            anyio.WouldBlock: It holds none.
            ConnectionClosed: The channel has ended and every frame was returned.
            ProtocolError: The server broke the protocol (likewise).
        """
        frames = channel.frames
        while frames:
            frame = frames.popleft()
            if type(frame) is bytes:
                return frame
        if channel.ended is not None:
            raise fresh(channel.ended)
        raise anyio.WouldBlock

    def receive_step_nowait(self, channel: LinkChannel) -> bytes | BatchedReply:
        """A frame the session holds already, or a reply of its that came in a batch.

        Raises:
            anyio.WouldBlock: It holds none.
            ConnectionClosed: The channel has ended and every frame was returned.
            ProtocolError: The server broke the protocol (likewise).
        """
        frames = channel.frames
        if frames:
            return frames.popleft()
        if channel.ended is not None:
            raise fresh(channel.ended)
        raise anyio.WouldBlock

    async def leave(self, channel: LinkChannel) -> None:
        """A session is done with the link: send what it posted; close the link if it was the last.

        Idempotent; shielded and bounded (by ``close_timeout``), under any cancel scope.
        """
        if self._channels.pop(channel.number, None) is None:
            return
        if channel.ended is None:
            channel.ended = ConnectionClosed(f"the {self._session_name} to {self.url} was closed by the client")
        channel.wake()
        self._left(channel)
        with anyio.CancelScope(shield=True):
            if self._channels:
                with anyio.move_on_after(self._close_timeout), contextlib.suppress(OpenEnvError):
                    await self._flush()  # its close request, say
                return
            await self.aclose()

    def _left(self, channel: LinkChannel) -> None:
        """A session left the link, others ride it still perhaps (the carrier may tell the server; by default not)."""

    async def _flush(self) -> None:
        """Send every posted entry (the carrier's)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close the link: every session still on it ends (the carrier's). Idempotent; shielded and bounded."""
        raise NotImplementedError

    def _refuse(self, channel: LinkChannel, reason: str) -> NoReturn:
        """Refuse a frame of a session, unsent: the session ends (the server is told), the others go on."""
        error = ConnectionClosed(reason)
        if channel.ended is None:
            channel.ended = error
        assert self._state is not None
        self._state.leave(channel.number)
        raise fresh(error)

    # -- waiting -----------------------------------------------------------------------

    async def _wait_for(self, channel: LinkChannel) -> None:
        """Wait until ``channel`` gets a frame, ends, or is woken to do the I/O itself (several calls may wait)."""
        waiter = channel.waiter
        if waiter is None:
            waiter = channel.waiter = anyio.Event()
        channel.waiters += 1
        self._waiting[channel.number] = channel
        try:
            await waiter.wait()
        finally:
            channel.waiters -= 1
            if not channel.waiters:
                self._waiting.pop(channel.number, None)

    def _wake_one(self) -> bool:
        """Wake one session waiting without a frame (its turn to do the I/O); whether there was one."""
        for waiting in self._waiting.values():
            if not waiting.frames:
                waiting.wake()
                return True
        return False

    # -- what comes from the server ------------------------------------------------------

    def _deliver(self, number: int, frame: bytes | msgspec.Raw) -> None:
        channel = self._channels.get(number)
        if channel is None:
            return  # a session that has left: nobody waits for it
        frames = channel.frames
        if len(frames) >= RECEIVE_LIMIT:
            self._end_all(
                ProtocolError(f"the server at {self.url} sent more than {RECEIVE_LIMIT} unread frames to one session")
            )
            return
        frames.append(frame if type(frame) is bytes else bytes(frame))
        channel.wake()

    def _deliver_batched(self, stepped: Stepped, positions: list[int]) -> None:
        channels, items, replies = self._channels, stepped.channels, stepped.replies
        for position in positions:
            number, _, _, request_id = items[position]
            channel = channels.get(number)
            if channel is None:
                continue  # a session that has left: nobody waits for it
            frames = channel.frames
            if len(frames) >= RECEIVE_LIMIT:
                self._end_all(
                    ProtocolError(
                        f"the server at {self.url} sent more than {RECEIVE_LIMIT} unread frames to one session"
                    )
                )
                return
            frames.append(BatchedReply(replies, position, request_id))
            waiter = channel.waiter  # `LinkChannel.wake`, inline: a batch wakes a thousand
            if waiter is not None:
                channel.waiter = None
                waiter.set()

    def _end_channel(self, number: int, end: End) -> None:
        channel = self._channels.get(number)
        if channel is not None and channel.ended is None:
            channel.ended = ConnectionClosed(self._ended_text(end))
            channel.wake()

    def _ended_text(self, end: End) -> str:
        """What a session's calls say once the server ended its channel."""
        text = f"the server at {self.url} ended the session ({end.code})"
        return f"{text}: {end.reason}" if end.reason else text

    def _end_all(self, error: ConnectionClosed | ProtocolError, cause: BaseException | None = None) -> None:
        """The link is over: every session's channel ends with ``error`` (a session's own end stays)."""
        if self._ended is not None:
            return
        if error.__cause__ is None and cause is not None:
            error.__cause__ = cause
        self._ended = error
        for channel in self._channels.values():
            if channel.ended is None:
                channel.ended = error
            channel.wake()
        turn, self._keeper_turn = self._keeper_turn, None
        if turn is not None:
            turn.set()
        self._forget()

    def _forget(self) -> None:
        on_idle, self._on_idle = self._on_idle, None
        if on_idle is not None:
            on_idle(self)

    def _ended_error(self) -> ConnectionClosed | ProtocolError:
        error = self._ended
        assert error is not None
        return fresh(error)

    # -- the keeper --------------------------------------------------------------------

    async def keep(self) -> None:
        """The link's idle work, until it ends; one keeper works at a time, the others wait their turn.

        Run by a session's owner in a task of its own and cancelled when the owner is done.
        """
        while self._ended is None and not self._closing:
            if not self._keeping:
                self._keeping = True
                try:
                    await self._keep()
                finally:
                    self._keeping = False
                    turn, self._keeper_turn = self._keeper_turn, None
                    if turn is not None:
                        turn.set()
                return
            turn = self._keeper_turn
            if turn is None:
                turn = self._keeper_turn = anyio.Event()
            await turn.wait()

    async def _keep(self) -> None:
        """The carrier's idle work (none by default)."""


def for_send(error: ConnectionClosed | ProtocolError) -> ConnectionClosed:
    """The error a send raises on an ended channel: a peer's protocol violation is, for it, a closed channel."""
    new = ConnectionClosed(str(error))
    new.__cause__ = error.__cause__ or error
    return new


def fresh(error: ConnectionClosed | ProtocolError) -> ConnectionClosed | ProtocolError:
    """A new exception like ``error`` (the same one raised twice would grow its traceback), from its cause."""
    new = type(error)(str(error))
    new.__cause__ = error.__cause__ or error
    return new

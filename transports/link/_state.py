"""What each end of a link keeps of its channels, without any I/O: numbers, acknowledgements, resumption.

`ClientLinkState` and `ServerLinkState` take envelopes' entries in and give
entries out (`transports.link._envelope`); the connection they ride, and when it is
read or written, is their caller's business. Each side numbers the frames it
posts on a channel (1, 2, 3, ...), keeps every one until the other side
acknowledges it (an entry's ``ack``), and drops a frame it already holds. So,
when a connection drops and a new one takes the link over, each side sends
again exactly what the other lacks (`Resume`, `Resumed`): no request runs twice,
no reply is lost.

What a side keeps unacknowledged is bounded by the sessions themselves: a client
sends a session's next request only after the reply to the one before (or after
giving up on it), and each request acknowledges every reply before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import msgspec

from transports.link._envelope import (
    LINK_CHANNEL,
    Control,
    End,
    Entry,
    EnvelopeCodec,
    Open,
    Resume,
    Resumed,
    StepItem,
    Stepped,
    Steps,
)

__all__ = ["ChannelState", "ClientLinkState", "Held", "LinkProtocolError", "ServerLinkState", "TakenSteps"]


class Held(Protocol):
    """A frame that went out in a batch (`Steps`, `Stepped`), kept as what makes it: sent again, it is encoded."""

    def frame(self) -> msgspec.Raw:
        """The frame, as the entry that stands for it after a resumption carries it."""


class LinkProtocolError(Exception):
    """The other side broke the link protocol (an entry that makes no sense where it is)."""


class ChannelState:
    """One channel's numbering in both directions, and the frames posted but not yet acknowledged.

    Attributes:
        number: The channel's number on the link.
        sent: The ``seq`` of the last frame posted on it.
        received: The highest ``seq`` taken from the other side.
        unacked: ``(seq, frame)`` of each frame posted that the other side has
            not acknowledged, oldest first (a list, not a deque: it holds a frame
            or two, and an empty deque takes ten times an empty list's memory);
            a frame that went out in a batch is kept as a `Held`.
    """

    __slots__ = ("number", "received", "sent", "unacked")

    def __init__(self, number: int) -> None:
        self.number = number
        self.sent = 0
        self.received = 0
        self.unacked: list[tuple[int, msgspec.Raw | Held]] = []

    def acknowledged(self, ack: int) -> None:
        """Forget the frames the other side holds (those numbered up to ``ack``)."""
        unacked = self.unacked
        if unacked and unacked[-1][0] <= ack:  # all of them: the usual case, once per session per step
            unacked.clear()
            return
        held = 0
        while held < len(unacked) and unacked[held][0] <= ack:
            held += 1
        if held:
            del unacked[:held]


class _LinkState:
    """What both ends share: the channels, the entries waiting to go out."""

    def __init__(self, codec: EnvelopeCodec) -> None:
        self.codec = codec
        self.channels: dict[int, ChannelState] = {}
        # Entries posted and not yet taken by `outgoing`, in order.
        self._outgoing: list[Entry] = []

    @property
    def has_outgoing(self) -> bool:
        """Whether entries wait to be sent."""
        return bool(self._outgoing)

    @property
    def outgoing_count(self) -> int:
        """How many entries wait to be sent."""
        return len(self._outgoing)

    def outgoing(self) -> list[Entry]:
        """Take the entries waiting to be sent, in order (an empty list if none)."""
        entries, self._outgoing = self._outgoing, []
        return entries

    def post(self, channel: ChannelState, frame: msgspec.Raw) -> None:
        """Number a frame on its channel and queue it; keep it until the other side acknowledges it."""
        channel.sent = seq = channel.sent + 1
        channel.unacked.append((seq, frame))
        self._outgoing.append((channel.number, seq, channel.received, frame))

    def post_control(self, number: int, control: Control) -> None:
        """Queue a control entry (never numbered, never sent twice)."""
        channel = self.channels.get(number)
        self._outgoing.append((number, 0, 0 if channel is None else channel.received, self.codec.control(control)))

    def post_held(self, channel: ChannelState, held: Held, request_id: int) -> StepItem:
        """Number a frame that goes out in a batch, and keep it until acknowledged (it is not queued).

        Returns:
            Its item in the batch: ``(channel, seq, ack, request_id)``.
        """
        channel.sent = seq = channel.sent + 1
        channel.unacked.append((seq, held))
        return (channel.number, seq, channel.received, request_id)

    def _resend(self, channel: ChannelState, after: int) -> None:
        """Queue again the frames of ``channel`` numbered above ``after`` (the other side lacks them)."""
        channel.acknowledged(after)
        for seq, frame in channel.unacked:
            if type(frame) is not msgspec.Raw:
                frame = frame.frame()
            self._outgoing.append((channel.number, seq, channel.received, frame))


class ClientLinkState(_LinkState):
    """The client's end: opens channels, posts its sessions' frames, takes the server's.

    Args:
        codec: The link's envelope codec.
        deliver: Called with each new frame from the server: ``deliver(channel, frame)``.
        end: Called once per channel the server ended: ``end(channel, reason)``.
        batched: Called with the new replies of each `Stepped`:
            ``batched(stepped, positions)``, each position's channel and
            request id being ``stepped.channels[position][0]`` and ``[3]``.
    """

    def __init__(
        self,
        codec: EnvelopeCodec,
        *,
        deliver: Callable[[int, msgspec.Raw], object],
        end: Callable[[int, End], object],
        batched: Callable[[Stepped, list[int]], object] = lambda stepped, positions: None,
    ) -> None:
        super().__init__(codec)
        self._deliver = deliver
        self._end = end
        self._batched = batched
        self._next_channel = 1

    def open(self) -> ChannelState:
        """Open a new channel: queue its `Open`; its frames may be posted right after.

        Returns:
            The new channel.
        """
        number = self._next_channel
        self._next_channel += 1
        channel = self.channels[number] = ChannelState(number)
        self.post_control(number, Open())
        return channel

    def forget(self, number: int) -> None:
        """Stop keeping a channel whose session is over (its last frames need no resending)."""
        self.channels.pop(number, None)

    def leave(self, number: int) -> None:
        """Leave a channel the server has not ended: queue an `End` on it (the session there ends), then forget it."""
        if number in self.channels:
            self.post_control(number, End(reason="the client left the session"))
            del self.channels[number]

    def take(self, entries: Iterable[Entry]) -> list[Control]:
        """Take the entries of one envelope from the server.

        New frames go to ``deliver``, frames already held are dropped, ended
        channels go to ``end``; the link's own controls are returned.

        Returns:
            The control objects sent on the link's channel (`Hello`, `Resumed`).

        Raises:
            LinkProtocolError: A control object that cannot be decoded.
        """
        link_controls: list[Control] = []
        channels = self.channels
        deliver = self._deliver
        for number, seq, ack, frame in entries:
            channel = channels.get(number)
            if seq:
                if channel is None:
                    continue  # a session the client has forgotten (closed): nobody waits for it
                if ack:
                    channel.acknowledged(ack)
                if seq <= channel.received:
                    continue  # sent again after a resumption, and held already
                channel.received = seq
                deliver(number, frame)
                continue
            control = self._decode_control(frame)
            if type(control) is Stepped and number == LINK_CHANNEL:
                self._take_stepped(control)
            elif number == LINK_CHANNEL:
                link_controls.append(control)
            elif isinstance(control, End) and channel is not None:
                del channels[number]
                self._end(number, control)
        return link_controls

    def _take_stepped(self, stepped: Stepped) -> None:
        """Take the replies of a `Stepped` as their frames would be taken: numbered, acknowledging, each once."""
        channels = self.channels
        taken: list[int] = []
        for position, (number, seq, ack, _) in enumerate(stepped.channels):
            channel = channels.get(number)
            if channel is None:
                continue
            if ack:
                channel.acknowledged(ack)
            if seq <= channel.received:
                continue
            channel.received = seq
            taken.append(position)
        self._batched(stepped, taken)

    def post_steps(self, steps: Steps) -> None:
        """Queue a `Steps` whose items were numbered already (`post_held`)."""
        self._outgoing.append((LINK_CHANNEL, 0, 0, self.codec.control(steps)))

    def resume(self) -> Entry:
        """The entry that opens a connection taking the link over: what the client holds of each channel."""
        received = [(number, channel.received) for number, channel in self.channels.items()]
        self._outgoing.clear()  # what was queued is sent again once the server says what it lacks
        return (LINK_CHANNEL, 0, 0, self.codec.control(Resume(received=received)))

    def resumed(self, resumed: Resumed) -> None:
        """Queue again what the server lacks, and end the sessions it no longer has.

        Args:
            resumed: The server's answer to `resume`.
        """
        live = dict(resumed.received)
        for number, channel in list(self.channels.items()):
            if number > resumed.opened:  # never reached the server: open it again, send everything
                self.post_control(number, Open())
                self._resend(channel, 0)
            elif number in live:
                self._resend(channel, live[number])
            else:
                del self.channels[number]
                self._end(number, End(reason="the server ended the session while the connection was down", code=1001))

    def _decode_control(self, frame: msgspec.Raw) -> Control:
        try:
            return self.codec.decode_control(frame)
        except msgspec.DecodeError as exc:
            raise LinkProtocolError(f"a control entry that cannot be read: {exc}") from exc


class TakenSteps:
    """The steps of a `Steps` the server takes: those numbered next on their channels, in order.

    Attributes:
        steps: The control.
        taken: ``(position, channel, request id)`` of each step to run; the
            others were held already, or their sessions have ended.
    """

    __slots__ = ("steps", "taken")

    def __init__(self, steps: Steps, taken: list[tuple[int, int, int]]) -> None:
        self.steps = steps
        self.taken = taken


class ServerLinkState(_LinkState):
    """The server's end: admits the channels the client opens, takes their frames, posts the replies.

    Attributes:
        opened: The highest channel the client has opened.
    """

    def __init__(self, codec: EnvelopeCodec) -> None:
        super().__init__(codec)
        self.opened = 0

    def take(self, entries: Iterable[Entry]) -> list[tuple[int, msgspec.Raw | Control | TakenSteps]]:
        """Take the entries of one envelope from the client.

        Returns:
            In order: ``(channel, frame)`` for each new frame of a session,
            ``(channel, control)`` for each control (`Open` on a new channel,
            `End` of a channel the client leaves, `Resume` or `End` on the link's),
            ``(0, TakenSteps)`` for a `Steps`.
            Frames already held are dropped, and so are frames of channels that
            have ended (their sessions are gone).

        Raises:
            LinkProtocolError: A control that cannot be read or is out of place
                (an `Open` of a channel not above every one opened before).
        """
        events: list[tuple[int, msgspec.Raw | Control | TakenSteps]] = []
        channels = self.channels
        for number, seq, ack, frame in entries:
            if seq:
                if self._next_on(number, seq, ack):
                    events.append((number, frame))
                continue
            try:
                control = self.codec.decode_control(frame)
            except msgspec.DecodeError as exc:
                raise LinkProtocolError(f"a control entry that cannot be read: {exc}") from exc
            if type(control) is Steps and number == LINK_CHANNEL:
                if len(control.channels) > self.codec.max_entries:
                    raise LinkProtocolError(f"a steps control holds at most {self.codec.max_entries} steps")
                taken: list[tuple[int, int, int]] = []
                for position, (channel, seq, ack, request_id) in enumerate(control.channels):
                    if not seq:
                        raise LinkProtocolError(f"a step on channel {channel} numbered 0")
                    if self._next_on(channel, seq, ack):
                        taken.append((position, channel, request_id))
                events.append((number, TakenSteps(control, taken)))
                continue
            if isinstance(control, Open):
                if number <= self.opened:
                    raise LinkProtocolError(f"channel {number} opened again (the last opened is {self.opened})")
                self.opened = number
                channels[number] = ChannelState(number)
            elif isinstance(control, End):
                if number != LINK_CHANNEL and number not in channels:
                    continue  # ended already
            elif not (isinstance(control, Resume) and number == LINK_CHANNEL):
                raise LinkProtocolError(f"a {type(control).__name__} control from the client")
            events.append((number, control))
        return events

    def _next_on(self, number: int, seq: int, ack: int) -> bool:
        """Take a frame's numbers: whether it is the next on its channel (else held already, or the channel ended).

        Raises:
            LinkProtocolError: A channel never opened, or a number skipped.
        """
        channel = self.channels.get(number)
        if channel is None:
            if number > self.opened:
                raise LinkProtocolError(f"a frame on channel {number}, which was never opened")
            return False  # ended: the frame has nobody to go to
        if ack:
            channel.acknowledged(ack)
        if seq <= channel.received:
            return False
        if seq != channel.received + 1:
            raise LinkProtocolError(f"frame {seq} on channel {number} after frame {channel.received}")
        channel.received = seq
        return True

    def post_stepped(self, items: list[StepItem], replies: msgspec.Raw) -> None:
        """Queue a `Stepped` whose items were numbered already (`post_held`)."""
        self._outgoing.append((LINK_CHANNEL, 0, 0, self.codec.control(Stepped(channels=items, replies=replies))))

    def end(self, number: int, reason: str, code: int) -> None:
        """Forget a channel whose session has ended, and tell the client (an `End` control)."""
        if self.channels.pop(number, None) is not None:
            self.post_control(number, End(reason=reason, code=code))

    def resumed(self, resume: Resume) -> None:
        """Answer a client that took the link over: say what the server holds, queue what the client lacks.

        Args:
            resume: The client's `Resume`.
        """
        self._outgoing.clear()
        held = dict(resume.received)
        channels = self.channels
        received = [(number, channel.received) for number, channel in channels.items()]
        self.post_control(LINK_CHANNEL, Resumed(received=received, opened=self.opened))
        for number, channel in channels.items():
            self._resend(channel, held.get(number, 0))

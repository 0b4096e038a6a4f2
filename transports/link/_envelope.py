"""The envelope of a link: many sessions' frames in one message, each numbered on its own channel.

A link is one connection that carries the sessions of many clients at once
(``docs/protocol.md``, "Links"). Each message on it is an *envelope*: an array
of entries, one per frame, every one ``[channel, seq, ack, frame]``:

- ``channel``: the session's number on the link, chosen by the client (``0`` is
  the link itself);
- ``seq``: the frame's number on its channel in its direction (1, 2, 3, ...), or
  ``0`` for a *control* entry, which is the link's own business and is never sent
  twice;
- ``ack``: the highest ``seq`` the sender holds of the other direction on that
  channel, so the other side may forget those frames;
- ``frame``: the session's frame, embedded whole (the very bytes a client's
  codec wrote: a JSON value in a JSON envelope, a MessagePack one in a
  MessagePack envelope), or a control object.

The link never looks inside a session's frame: it carries it as `msgspec.Raw`,
which is neither decoded nor re-encoded on the way. Sequence numbers and acks
make the link resumable: after a dropped connection each side sends again
what the other did not acknowledge, and drops what it already holds, so no
request runs twice and no reply is lost (`transports.link._state`).
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

import msgspec

from openenv._messages import StepRequest

__all__ = [
    "ENTRY_OVERHEAD",
    "LINK_CHANNEL",
    "Control",
    "End",
    "Entry",
    "EnvelopeCodec",
    "Hello",
    "Open",
    "Resume",
    "Resumed",
    "StepItem",
    "Stepped",
    "Steps",
    "fits",
]

LINK_CHANNEL = 0
"""The channel of the link's own control entries (`Hello`, `Resume`, `Resumed`)."""

ENTRY_OVERHEAD = 64
"""Bytes an entry may take besides its frame, at most: its three numbers and the punctuation around them."""

Entry: TypeAlias = tuple[int, int, int, msgspec.Raw]
"""One frame in an envelope: ``(channel, seq, ack, frame)``; ``seq`` 0 marks a control entry."""

_Number = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
# As decoded: a number out of range is no envelope (the link ends), never a frame dropped without a word.
_WireEntry: TypeAlias = tuple[_Number, _Number, _Number, msgspec.Raw]


class _Control(msgspec.Struct, tag_field="type", omit_defaults=True):
    """A control object: what a link says of itself or of a channel, in an entry whose ``seq`` is 0."""


class Open(_Control, tag="open"):
    """Client to server, on a new channel: open a session there.

    The client sends its session's frames right behind it, without waiting: the
    server takes them in order once the session is admitted, and answers the
    first one with the error that turned the session away, if it was.
    """


class End(_Control, tag="end"):
    """On a channel: the session there has ended; nothing more will come on it.

    From the server: the session ended (idle, the server stopping, a fatal error
    frame just sent, a reply over the client's message limit). From the client:
    it gave the session up without a ``close`` request (a request over the
    server's message limit, a frame that is not one value of the link's
    encoding), or leaves it (its ``close`` request, if any, went before).
    From the client on channel 0: it closes the link on purpose (its closing
    handshake follows), so the server keeps nothing for a resumption.

    Attributes:
        reason: Why (idle too long, the server stopping, a fatal error frame just sent, ...).
        code: The WebSocket close code a connection of its own would have closed with.
    """

    reason: str = ""
    code: int = 1000


class Hello(_Control, tag="hello"):
    """Server to client, the first entry of a new link (on channel 0).

    Attributes:
        token: The secret a new connection presents to take the link over after a drop.
        resume_timeout: Seconds the server keeps the link's sessions after its connection drops.
        max_message_size: The largest message the server takes, in bytes (``None``: no limit):
            the client sends no envelope larger, and gives up a frame that alone would be.
        batches: The server takes `Steps` (and answers with `Stepped`).
    """

    token: str
    resume_timeout: float
    max_message_size: int | None = None
    batches: bool = False


class Resume(_Control, tag="resume"):
    """Client to server, the first entry on a connection that takes a link over (on channel 0).

    Attributes:
        received: ``(channel, seq)`` for each of the client's channels: the
            highest frame it holds from the server.
    """

    received: list[tuple[int, int]] = []


class Resumed(_Control, tag="resumed"):
    """Server to client, the answer to `Resume` (on channel 0); the server's unacknowledged frames follow.

    Attributes:
        received: ``(channel, seq)`` for each live session: the highest frame
            the server holds from the client there. A channel the server saw
            opened (up to ``opened``) and does not list has ended.
        opened: The highest channel the server saw an `Open` for; the client
            opens again, and sends again, those above it.
    """

    received: list[tuple[int, int]] = []
    opened: int = 0


StepItem: TypeAlias = tuple[_Number, _Number, _Number, _Number]
"""One session's place in a `Steps` or `Stepped`: ``(channel, seq, ack, request id)``."""


class Steps(_Control, tag="steps"):
    """Client to server, on channel 0: one step in each of many sessions, their actions encoded as one array.

    Each item counts exactly as the entry ``[channel, seq, ack, {"type": "step",
    "id": id, "data": action}]`` would at the place of this control in its
    envelope: numbered on its channel, acknowledged, held until acknowledged,
    and sent again after a resumption as that very entry. Only to a server
    whose `Hello` says it ``batches``.

    Attributes:
        channels: ``(channel, seq, ack, id)`` of each step, in order.
        actions: The actions, one per item, as one array (in the link's encoding).
    """

    channels: list[StepItem] = []
    actions: msgspec.Raw = msgspec.Raw(b"[]")


class Stepped(_Control, tag="stepped"):
    """Server to client, on channel 0: the replies to steps of a `Steps`, as one message.

    Each item counts exactly as the observation or error frame on its channel
    with that ``seq`` would (held, sent again after a resumption as that
    frame). Steps of a `Steps` that could not be answered together (a session
    busy, an action that needs converting) are answered with ordinary frames.

    Attributes:
        channels: ``(channel, seq, ack, id)`` of each reply, in order.
        replies: The replies (``openenv._messages.StepBatchReply``): each
            observation as the environment returned it (``reward`` and
            ``done`` in it), or the error frame's data by position.
    """

    channels: list[StepItem] = []
    replies: msgspec.Raw = msgspec.Raw(b"{}")


Control: TypeAlias = Open | End | Hello | Resume | Resumed | Steps | Stepped
"""Every control object."""


class EnvelopeCodec:
    """Encodes and decodes envelopes and control objects in one encoding; built once per link.

    Args:
        encoding: ``"json"`` (text messages) or ``"msgpack"`` (binary ones): the
            encoding of the sessions' frames too.
        max_entries: The most entries a decoded envelope may hold.

    Raises:
        ValueError: An unknown encoding.
    """

    def __init__(self, encoding: Literal["json", "msgpack"], *, max_entries: int = 65536) -> None:
        self.encoding = encoding
        self.max_entries = max_entries
        if encoding == "json":
            self._encoder: msgspec.json.Encoder | msgspec.msgpack.Encoder = msgspec.json.Encoder()
            self._entries: msgspec.json.Decoder[list[Entry]] | msgspec.msgpack.Decoder[list[Entry]] = (
                msgspec.json.Decoder(list[_WireEntry])
            )
            self._control: msgspec.json.Decoder[Control] | msgspec.msgpack.Decoder[Control] = msgspec.json.Decoder(
                Control
            )
            self._actions: msgspec.json.Decoder[list[msgspec.Raw]] | msgspec.msgpack.Decoder[list[msgspec.Raw]] = (
                msgspec.json.Decoder(list[msgspec.Raw])
            )
        elif encoding == "msgpack":
            self._encoder = msgspec.msgpack.Encoder()
            self._entries = msgspec.msgpack.Decoder(list[_WireEntry])
            self._control = msgspec.msgpack.Decoder(Control)
            self._actions = msgspec.msgpack.Decoder(list[msgspec.Raw])
        else:
            raise ValueError(f"unknown encoding {encoding!r}; use 'json' or 'msgpack'")

    def encode(self, entries: list[Entry]) -> bytes:
        """One message holding ``entries``, in order.

        Args:
            entries: ``(channel, seq, ack, frame)`` each, the frame already encoded.

        Returns:
            The message.
        """
        return self._encoder.encode(entries)

    def encode_within(self, entries: list[Entry], limit: int | None) -> list[bytes]:
        """The messages holding ``entries`` in order, each no larger than ``limit`` bytes (``None``: one).

        An entry that alone does not fit (see `fits`) still gets a message of its own:
        the sender gives such a frame up before posting it.

        Args:
            entries: The entries to send.
            limit: The largest message the other side takes.

        Returns:
            One message or more.
        """
        if limit is None:
            return [self.encode(entries)]
        messages: list[bytes] = []
        group: list[Entry] = []
        size = 2  # the envelope's brackets
        for entry in entries:
            entry_size = len(entry[3]) + ENTRY_OVERHEAD
            if group and size + entry_size > limit:
                messages.append(self.encode(group))
                group, size = [], 2
            group.append(entry)
            size += entry_size
        if group:
            messages.append(self.encode(group))
        return messages

    def decode(self, message: bytes | bytearray | memoryview) -> list[Entry]:
        """The entries of one message; their frames are views into it, not decoded.

        Args:
            message: A whole message from the other side.

        Returns:
            The entries, in order.

        Raises:
            msgspec.DecodeError: The message is not an envelope (malformed, or an
                entry of the wrong shape), or holds more than ``max_entries``.
        """
        try:
            entries = self._entries.decode(message)
        except RecursionError as exc:  # msgspec's guard against nesting deeper than the stack allows
            raise msgspec.DecodeError(f"nested too deeply ({exc})") from None
        if len(entries) > self.max_entries:
            raise msgspec.DecodeError(f"an envelope holds at most {self.max_entries} entries, not {len(entries)}")
        return entries

    def split_actions(self, actions: msgspec.Raw | bytes) -> list[msgspec.Raw]:
        """The actions of a `Steps`, each left encoded.

        Raises:
            msgspec.DecodeError: They are not an array.
        """
        try:
            return self._actions.decode(actions)
        except RecursionError as exc:
            raise msgspec.DecodeError(f"nested too deeply ({exc})") from None

    def step_frame(self, action: msgspec.Raw, request_id: int) -> msgspec.Raw:
        """The frame a step of a `Steps` stands for: ``{"type": "step", "id": request_id, "data": action}``."""
        return msgspec.Raw(self._encoder.encode(StepRequest(data=action, id=request_id)))

    def control(self, control: Control) -> msgspec.Raw:
        """Encode a control object, to be carried in an entry whose ``seq`` is 0.

        Args:
            control: The control object.

        Returns:
            It, encoded.
        """
        return msgspec.Raw(self._encoder.encode(control))

    def decode_control(self, frame: msgspec.Raw) -> Control:
        """Decode the frame of a control entry.

        Args:
            frame: The frame of an entry whose ``seq`` is 0.

        Returns:
            The control object.

        Raises:
            msgspec.DecodeError: It is not a control object this side knows.
        """
        try:
            return self._control.decode(frame)
        except RecursionError as exc:
            raise msgspec.DecodeError(f"nested too deeply ({exc})") from None


def fits(frame_size: int, limit: int | None) -> bool:
    """Whether a frame of ``frame_size`` bytes fits in an envelope no larger than ``limit`` bytes."""
    return limit is None or frame_size + ENTRY_OVERHEAD + 2 <= limit

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
request runs twice and no reply is lost (`transports._link_state`).
"""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

__all__ = [
    "LINK_CHANNEL",
    "Control",
    "End",
    "Entry",
    "EnvelopeCodec",
    "Hello",
    "Open",
    "Resume",
    "Resumed",
]

LINK_CHANNEL = 0
"""The channel of the link's own control entries (`Hello`, `Resume`, `Resumed`)."""

Entry: TypeAlias = tuple[int, int, int, msgspec.Raw]
"""One frame in an envelope: ``(channel, seq, ack, frame)``; ``seq`` 0 marks a control entry."""


class _Control(msgspec.Struct, tag_field="type", omit_defaults=True):
    """A control object: what a link says of itself or of a channel, in an entry whose ``seq`` is 0."""


class Open(_Control, tag="open"):
    """Client to server, on a new channel: open a session there.

    The client sends its session's frames right behind it, without waiting: the
    server takes them in order once the session is admitted, and answers the
    first one with the error that turned the session away, if it was.
    """


class End(_Control, tag="end"):
    """Server to client, on a channel: the session there has ended; nothing more will come on it.

    Client to server, on a channel the server has not ended: the client leaves
    the session (without its ``close`` frame, say); the server ends it.

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
    """

    token: str
    resume_timeout: float


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


Control: TypeAlias = Open | End | Hello | Resume | Resumed
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
                msgspec.json.Decoder(list[Entry])
            )
            self._control: msgspec.json.Decoder[Control] | msgspec.msgpack.Decoder[Control] = msgspec.json.Decoder(
                Control
            )
        elif encoding == "msgpack":
            self._encoder = msgspec.msgpack.Encoder()
            self._entries = msgspec.msgpack.Decoder(list[Entry])
            self._control = msgspec.msgpack.Decoder(Control)
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
        entries = self._entries.decode(message)
        if len(entries) > self.max_entries:
            raise msgspec.DecodeError(f"an envelope holds at most {self.max_entries} entries, not {len(entries)}")
        return entries

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
        return self._control.decode(frame)

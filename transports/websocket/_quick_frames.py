"""The quick read and write of the frames a session is made of: whole, unfragmented data frames.

Both ends of a session mostly exchange small, whole text or binary frames, and
websockets' parser (a generator reading byte ranges through several layers)
costs far more than such a frame needs. `whole_data_frames` takes the bytes of
one socket read and returns the messages in it when they are nothing but
complete data frames (FIN set, no RSV bit, masked or not as the sending side
must, within the size limit, text in valid UTF-8); otherwise ``None``, and the
caller hands the bytes to the full parser (websockets' sans-I/O protocol),
which deals with everything else: control frames, fragments, partial frames,
malformed or oversized ones, extensions. So the quick read never judges a
frame: any doubt goes to the parser. `server_data_frame` frames one message as
a server sends it (unmasked, unfragmented), for a connection that is open with
no extensions. A reader that gave the parser some bytes may read quickly again
only once the parser holds no part of a frame: `FrameBoundaries` follows the
frame headers of those bytes to say when.
"""

from __future__ import annotations

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

__all__ = ["FrameBoundaries", "next_data_frame", "server_data_frame", "whole_data_frames"]

_TEXT = 0x81  # FIN, no RSV bit, opcode 1
_BINARY = 0x82  # FIN, no RSV bit, opcode 2
_MASKED = 0x80  # in the second byte


def whole_data_frames(data: bytes, max_size: int | None, *, masked: bool) -> list[tuple[bool, bytes]] | None:
    """The messages in ``data`` as ``(is_text, payload)``, if it holds only whole data frames.

    Args:
        data: Bytes read from a connection, starting at a frame.
        max_size: The largest payload allowed, or ``None`` for no limit.
        masked: Whether the frames must be masked: a client's are (the server
            reads them), a server's are not (the client reads them).

    Returns:
        The messages in order, payloads unmasked; ``None`` if any part of
        ``data`` is something else (the full parser must read it all).
    """
    messages = []
    position, end = 0, len(data)
    while position < end:
        frame = next_data_frame(data, position, max_size, masked=masked)
        if frame is None:
            return None
        is_text, payload, position = frame
        messages.append((is_text, payload))
    return messages


def next_data_frame(
    data: bytes, position: int, max_size: int | None, *, masked: bool
) -> tuple[bool, bytes, int] | None:
    """The whole data frame that starts at ``data[position]``, if it is one.

    Args:
        data: Bytes read from a connection.
        position: Where a frame starts in them.
        max_size: The largest payload allowed, or ``None`` for no limit.
        masked: Whether the frame must be masked (see `whole_data_frames`).

    Returns:
        ``(is_text, payload, end)``, the payload unmasked and ``end`` where the
        next frame starts; ``None`` if the bytes there are anything else (or
        not all there yet): the full parser must read them.
    """
    end = len(data)
    if end - position < 2:
        return None
    first, length = data[position], data[position + 1]
    if (first != _TEXT and first != _BINARY) or bool(length & _MASKED) is not masked:
        return None
    length &= ~_MASKED
    position += 2
    if length >= 126:  # the length follows: 16 bits, or 64
        size = 2 if length == 126 else 8
        if end - position < size:
            return None
        length = int.from_bytes(data[position : position + size], "big")
        position += size
    if masked:
        if end - position < 4:
            return None
        mask = data[position : position + 4]
        position += 4
    if end - position < length or (max_size is not None and length > max_size):
        return None
    payload = data[position : position + length]
    if masked:
        payload = apply_mask(payload, mask)
    if first == _TEXT and not _is_utf8(payload):
        return None  # the parser says what is wrong with it (a server closes with 1007)
    return first == _TEXT, payload, position + length


def _is_utf8(payload: bytes) -> bool:
    try:
        payload.decode()
    except UnicodeDecodeError:
        return False
    return True


def server_data_frame(payload: bytes, *, text: bool) -> bytes:
    """One whole, unmasked data frame holding ``payload``, as a server sends it without extensions.

    Args:
        payload: The message: UTF-8 for a text frame.
        text: A text frame; else a binary one.

    Returns:
        The frame's bytes.
    """
    first = _TEXT if text else _BINARY
    length = len(payload)
    if length < 126:
        header = bytes((first, length))
    elif length < 65536:
        header = bytes((first, 126)) + length.to_bytes(2, "big")
    else:
        header = bytes((first, 127)) + length.to_bytes(8, "big")
    return header + payload


class FrameBoundaries:
    """Whether the bytes given to a WebSocket parser so far end where a frame ends.

    A parser fed a read that ended inside a frame holds that part, and the next
    read begins inside the frame: the quick read must not take it for the start
    of one. Fed the same bytes as the parser, this follows the frames' headers
    (their lengths only, never their meaning) to where the last one ends.
    """

    def __init__(self) -> None:
        self._owed = 0  # bytes of the current frame still to come
        self._head = b""  # the start of a frame header split between reads

    @property
    def at_boundary(self) -> bool:
        """Whether the last byte fed ended a frame (or nothing was fed)."""
        return not self._owed and not self._head

    def feed(self, data: bytes) -> None:
        """Follow the frames through ``data``, the next bytes the parser is given."""
        if self._owed >= len(data):
            self._owed -= len(data)
            return
        if self._head:
            data, self._head = self._head + data, b""
        position, end = self._owed, len(data)
        self._owed = 0
        while position < end:
            size = _frame_size(data, position)
            if size is None:  # the header itself is split: keep its start for the next read
                self._head = data[position:]
                return
            position += size
        self._owed = position - end


def _frame_size(data: bytes, position: int) -> int | None:
    """The size (header and payload) of the frame starting at ``data[position]``; ``None`` if its header is cut."""
    available = len(data) - position
    if available < 2:
        return None
    second = data[position + 1]
    length = second & ~_MASKED
    header = 2 + (4 if second & _MASKED else 0)
    if length >= 126:
        extra = 2 if length == 126 else 8
        if available < 2 + extra:
            return None
        length = int.from_bytes(data[position + 2 : position + 2 + extra], "big")
        header += extra
    return header + length

"""A client's quick read of the frames a server answers with: whole, unfragmented data frames.

`whole_data_frames` takes the bytes of one socket read and returns the
messages in it when they are nothing but complete text or binary frames as a
server sends them without extensions (FIN set, no RSV bit, unmasked, within
the size limit); otherwise ``None``, and the caller hands the bytes to the
full parser (websockets' sans-I/O protocol), which deals with everything
else: control frames, fragments, partial frames, masked or malformed ones,
frames over the limit. So the quick read never judges a frame: any doubt goes
to the parser. What it takes, the parser would have read the same way (it
checks no UTF-8 either: a text frame's payload is handed on as bytes).
"""

from __future__ import annotations

__all__ = ["whole_data_frames"]

_TEXT = 0x81  # FIN, no RSV bit, opcode 1
_BINARY = 0x82  # FIN, no RSV bit, opcode 2
_MASKED = 0x80  # in the second byte


def whole_data_frames(data: bytes, max_size: int | None) -> list[tuple[bool, bytes]] | None:
    """The messages in ``data`` as ``(is_text, payload)``, if it holds only whole data frames.

    Args:
        data: Bytes read from a server's connection, starting at a frame.
        max_size: The largest payload allowed, or ``None`` for no limit.

    Returns:
        The messages in order; ``None`` if any part of ``data`` is something
        else (the full parser must read it all).
    """
    messages = []
    position, end = 0, len(data)
    while position < end:
        if end - position < 2:
            return None
        first, length = data[position], data[position + 1]
        if (first != _TEXT and first != _BINARY) or length & _MASKED:
            return None
        position += 2
        if length >= 126:  # the length follows: 16 bits, or 64
            size = 2 if length == 126 else 8
            if end - position < size:
                return None
            length = int.from_bytes(data[position : position + size], "big")
            position += size
        if end - position < length or (max_size is not None and length > max_size):
            return None
        messages.append((first == _TEXT, data[position : position + length]))
        position += length
    return messages

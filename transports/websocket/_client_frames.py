"""A server's quick read and write of the frames a WebSocket session is made of: whole, unfragmented data frames.

`whole_data_frames` takes the bytes of one socket read and returns the
messages in it, unmasked, when they are nothing but complete text or binary
frames (FIN set, no RSV bit, masked as a client's must be, a length under 64
KiB and within the limit, text in valid UTF-8); otherwise ``None``, and the caller hands the bytes
to the full parser (websockets' sans-I/O protocol), which deals with
everything else: control frames, fragments, partial frames, large or
malformed ones, extensions. So the quick read never judges a frame: any doubt
goes to the parser. `server_data_frame` frames one message as a server sends
it (unmasked, unfragmented), for a connection that is open with no extensions.
"""

from __future__ import annotations

try:
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover - websockets built without its C extension
    from websockets.utils import apply_mask

__all__ = ["server_data_frame", "whole_data_frames"]

_TEXT = 0x81  # FIN, opcode 1
_BINARY = 0x82  # FIN, opcode 2
_MASKED = 0x80


def whole_data_frames(data: bytes, max_size: int | None) -> list[tuple[bool, bytes]] | None:
    """The messages in ``data`` as ``(is_text, payload)``, if it holds only whole data frames.

    Args:
        data: Bytes read from a client's connection, starting at a frame.
        max_size: The largest payload allowed, or ``None`` for no limit.

    Returns:
        The messages in order, payloads unmasked; ``None`` if any part of
        ``data`` is something else (the full parser must read it all).
    """
    messages = []
    position, end = 0, len(data)
    while position < end:
        if end - position < 6:
            return None
        first, second = data[position], data[position + 1]
        if (first != _TEXT and first != _BINARY) or second < _MASKED:
            return None
        length = second & 0x7F
        position += 2
        if length == 126:
            if end - position < 6:
                return None
            length = int.from_bytes(data[position : position + 2], "big")
            position += 2
        elif length == 127:
            return None
        mask = data[position : position + 4]
        position += 4
        if end - position < length or (max_size is not None and length > max_size):
            return None
        payload = apply_mask(data[position : position + length], mask)
        if first == _TEXT and not _is_utf8(payload):
            return None  # the parser fails the connection with close code 1007
        messages.append((first == _TEXT, payload))
        position += length
    return messages


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

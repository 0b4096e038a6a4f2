"""The WebSocket subprotocols that negotiate openenv's extensions of OpenEnv's frames.

A client offers them in ``Sec-WebSocket-Protocol``; a server that selects one
speaks its dialect; a server that selects none (OpenEnv's reference) is spoken
to in plain OpenEnv frames: JSON text, no request ids.

| subprotocol          | frames                 | request ids |
|----------------------|------------------------|-------------|
| (none selected)      | JSON, text             | no          |
| ``openenv.v1.json``    | JSON, text             | yes         |
| ``openenv.v1.msgpack`` | MessagePack, binary    | yes         |

Each has a resumable variant (``openenv.v1.json.resumable``,
``openenv.v1.msgpack.resumable``): the same frames, and a session that survives
a dropped connection. The server's first frame is then a ``session`` frame
(`SessionFrame`) with the token a new connection presents in the
``OpenEnv-Resume`` handshake header to take the session over; the server's
side is `transports.websocket._resume`, the client's
`transports.websocket._resumption`. A server at capacity that queues the
session sends a ``queued`` frame (`QueuedFrame`) first, so that the client
waits for the ``session`` frame as long as the server's queue may keep it.
"""

from __future__ import annotations

from typing import Final

import msgspec

from openenv import Dialect

__all__ = [
    "JSON_SUBPROTOCOL",
    "MSGPACK_SUBPROTOCOL",
    "PLAIN",
    "RESUMABLE_SUBPROTOCOLS",
    "QueuedData",
    "QueuedFrame",
    "RESUME_HEADER",
    "SUBPROTOCOLS",
    "SessionData",
    "SessionFrame",
    "offered_subprotocols",
]

JSON_SUBPROTOCOL = "openenv.v1.json"
"""OpenEnv's JSON text frames, with request ids."""
MSGPACK_SUBPROTOCOL = "openenv.v1.msgpack"
"""The same frames in MessagePack, as binary WebSocket frames, with request ids."""

PLAIN = Dialect()
"""The dialect of a connection that selected no subprotocol: plain OpenEnv."""
SUBPROTOCOLS: dict[str, Dialect] = {
    JSON_SUBPROTOCOL: Dialect(encoding="json", request_ids=True),
    MSGPACK_SUBPROTOCOL: Dialect(encoding="msgpack", request_ids=True),
}
"""Every subprotocol openenv's client speaks, and the dialect it selects."""
RESUMABLE_SUBPROTOCOLS: dict[str, Dialect] = {f"{name}.resumable": dialect for name, dialect in SUBPROTOCOLS.items()}
"""The resumable variants, and their dialects (the same as the plain ones')."""

RESUME_HEADER: Final = "OpenEnv-Resume"
"""The handshake header that names the session a new connection takes over."""


class SessionData(msgspec.Struct):
    """What the ``session`` frame tells the client of a resumable session.

    Attributes:
        resume_token: The secret a new connection presents to take the session over.
        resume_timeout: Seconds the session waits for its client after its connection drops.
        last_request_id: The highest request id the server has received (0 on a new session).
    """

    resume_token: str
    resume_timeout: float
    last_request_id: int


class SessionFrame(msgspec.Struct):
    """The server's first frame on a resumable subprotocol: ``{"type": "session", "data": {...}}``.

    Attributes:
        type: Always ``"session"``.
        data: The session's token, timeout and last request id.
    """

    type: str
    data: SessionData


class QueuedData(msgspec.Struct):
    """What the ``queued`` frame tells the client of a resumable session that waits for a slot.

    Attributes:
        position: Its place in the server's queue (1: the next admitted).
        queue_timeout: Seconds the server lets a session wait in its queue; the
            ``session`` frame (or ``CAPACITY_REACHED``) comes within them.
    """

    position: int = 0
    queue_timeout: float = 0.0


class QueuedFrame(msgspec.Struct):
    """Before the ``session`` frame, when the server is at capacity and queues the session: ``{"type": "queued", ...}``.

    Attributes:
        type: Always ``"queued"``.
        data: Its place and the server's queue timeout.
    """

    type: str
    data: QueuedData


def offered_subprotocols(encoding: str = "json", *, resume: bool = True) -> list[str]:
    """The subprotocols a client offers, most preferred first.

    Args:
        encoding: ``"json"`` (the default: the same values an OpenEnv server
            gives) or ``"msgpack"`` (binary frames; JSON stays on offer as a
            fallback).
        resume: Offer each dialect's resumable variant first (a server that
            does not speak it selects the plain one).

    Returns:
        The list for the ``Sec-WebSocket-Protocol`` header.

    Raises:
        ValueError: An unknown encoding.
    """
    if encoding == "json":
        names = [JSON_SUBPROTOCOL]
    elif encoding == "msgpack":
        names = [MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL]
    else:
        raise ValueError(f"unknown encoding {encoding!r}; use 'json' or 'msgpack'")
    if not resume:
        return names
    return [variant for name in names for variant in (f"{name}.resumable", name)]

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
a dropped connection (see `transports.websocket._resume`). A client offers it
only if it can resume; the client in this package does not yet.
"""

from __future__ import annotations

from openenv import Dialect

__all__ = [
    "JSON_SUBPROTOCOL",
    "MSGPACK_SUBPROTOCOL",
    "PLAIN",
    "RESUMABLE_SUBPROTOCOLS",
    "SUBPROTOCOLS",
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
"""The resumable variants the server also speaks, and their dialects."""


def offered_subprotocols(encoding: str = "json") -> list[str]:
    """The subprotocols a client offers, most preferred first.

    Args:
        encoding: ``"json"`` (the default: the same values an OpenEnv server
            gives) or ``"msgpack"`` (binary frames; JSON stays on offer as a
            fallback).

    Returns:
        The list for the ``Sec-WebSocket-Protocol`` header.

    Raises:
        ValueError: An unknown encoding.
    """
    if encoding == "json":
        return [JSON_SUBPROTOCOL]
    if encoding == "msgpack":
        return [MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL]
    raise ValueError(f"unknown encoding {encoding!r}; use 'json' or 'msgpack'")

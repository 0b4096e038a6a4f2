"""The WebSocket subprotocols that negotiate openenv's extensions of OpenEnv's frames.

A client offers them in ``Sec-WebSocket-Protocol``; a server that selects one
speaks it; a server that selects none (OpenEnv's reference) is spoken to in
plain OpenEnv frames: JSON text, no request ids, one session per connection.

| subprotocol            | frames              | request ids | sessions per connection          |
|------------------------|---------------------|-------------|----------------------------------|
| (none selected)        | JSON, text          | no          | one                              |
| ``openenv.v1.json``    | JSON, text          | yes         | one                              |
| ``openenv.v1.msgpack`` | MessagePack, binary | yes         | one                              |
| ``openenv.v2.json``    | JSON, text          | yes         | many, in envelopes; resumable    |
| ``openenv.v2.msgpack`` | MessagePack, binary | yes         | many, in envelopes; resumable    |

A ``v2`` connection is a *link*: every message is an envelope of many sessions'
frames (`transports.link._envelope`), so all the sessions a process opens to one
server share one connection, and the frames they send in one turn of the event
loop travel as one message. It survives a dropped connection: a new one
presenting the link's token in the ``OpenEnv-Resume`` handshake header takes
every session over.
"""

from __future__ import annotations

from typing import Final

from openenv import Dialect

__all__ = [
    "JSON_SUBPROTOCOL",
    "LINK_JSON_SUBPROTOCOL",
    "LINK_MSGPACK_SUBPROTOCOL",
    "LINK_SUBPROTOCOLS",
    "MAX_MESSAGE_HEADER",
    "MSGPACK_SUBPROTOCOL",
    "PLAIN",
    "RESUME_HEADER",
    "RESUME_TIMEOUT_HEADER",
    "SPOKEN",
    "SUBPROTOCOLS",
    "dialect_of",
    "offered_subprotocols",
]

JSON_SUBPROTOCOL = "openenv.v1.json"
"""OpenEnv's JSON text frames, with request ids; one session per connection."""
MSGPACK_SUBPROTOCOL = "openenv.v1.msgpack"
"""The same frames in MessagePack, as binary WebSocket messages, with request ids."""
LINK_JSON_SUBPROTOCOL = "openenv.v2.json"
"""Many sessions' JSON frames in JSON envelopes (text messages): a link."""
LINK_MSGPACK_SUBPROTOCOL = "openenv.v2.msgpack"
"""Many sessions' MessagePack frames in MessagePack envelopes (binary messages): a link."""

PLAIN = Dialect()
"""The dialect of a connection that selected no subprotocol: plain OpenEnv."""
SUBPROTOCOLS: dict[str, Dialect] = {
    JSON_SUBPROTOCOL: Dialect(encoding="json", request_ids=True),
    MSGPACK_SUBPROTOCOL: Dialect(encoding="msgpack", request_ids=True),
}
"""The one-session subprotocols, and the dialect each selects."""
LINK_SUBPROTOCOLS: dict[str, Dialect] = {
    LINK_JSON_SUBPROTOCOL: Dialect(encoding="json", request_ids=True),
    LINK_MSGPACK_SUBPROTOCOL: Dialect(encoding="msgpack", request_ids=True),
}
"""The link subprotocols, and the dialect of the sessions' frames in each."""
SPOKEN: dict[str, Dialect] = {**LINK_SUBPROTOCOLS, **SUBPROTOCOLS}
"""Every subprotocol openenv speaks, client and server side."""

RESUME_HEADER: Final = "OpenEnv-Resume"
"""The handshake header that names the link a new connection takes over."""

RESUME_TIMEOUT_HEADER: Final = "OpenEnv-Resume-Timeout"
"""The handshake header in which a client says how long it would try to take a link over (0: never).

A link's server keeps its sessions that long at most after the connection drops.
"""

MAX_MESSAGE_HEADER: Final = "OpenEnv-Max-Message-Size"
"""The handshake header in which a client says the largest message it takes, in bytes (for a link's envelopes)."""


def dialect_of(subprotocol: str | None) -> Dialect:
    """The dialect a selected subprotocol speaks (`PLAIN` for none).

    Args:
        subprotocol: The subprotocol the server selected, one of `SPOKEN`, or ``None``.
    """
    return PLAIN if subprotocol is None else SPOKEN[subprotocol]


def offered_subprotocols(encoding: str = "json", *, share: bool = True) -> list[str]:
    """The subprotocols a client offers, most preferred first.

    Args:
        encoding: ``"json"`` (the default: the same values an OpenEnv server
            gives) or ``"msgpack"`` (binary messages; JSON stays on offer as a
            fallback).
        share: Offer the link subprotocols first (a server that does not speak
            them selects a one-session one).

    Returns:
        The list for the ``Sec-WebSocket-Protocol`` header.

    Raises:
        ValueError: An unknown encoding.
    """
    if encoding == "json":
        links, sessions = [LINK_JSON_SUBPROTOCOL], [JSON_SUBPROTOCOL]
    elif encoding == "msgpack":
        links = [LINK_MSGPACK_SUBPROTOCOL, LINK_JSON_SUBPROTOCOL]
        sessions = [MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL]
    else:
        raise ValueError(f"unknown encoding {encoding!r}; use 'json' or 'msgpack'")
    return [*links, *sessions] if share else sessions

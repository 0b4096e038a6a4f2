"""The HTTP long-polling protocol's names and limits, shared by its client and its server.

The whole protocol is documented in ``docs/http-polling.md``; in short, under the
server's base path:

| route                              | does                                                |
|------------------------------------|-----------------------------------------------------|
| ``POST   /poll/sessions``          | create a session; ``201`` with its id               |
| ``POST   /poll/sessions/{id}/frames`` | send one request frame (``OpenEnv-Seq``), get a reply |
| ``GET    /poll/sessions/{id}/frames`` | long-poll for the next reply frame                |
| ``DELETE /poll/sessions/{id}``     | end the session                                     |
| ``POST   /poll/links``             | create a link (many sessions); ``201`` with its id  |
| ``POST   /poll/links/{id}``        | send an envelope (``OpenEnv-Seq``), get what is there |
| ``GET    /poll/links/{id}``        | long-poll for the link's next entries              |
| ``DELETE /poll/links/{id}``        | end the link and every session on it               |

On the session routes frames travel as whole HTTP bodies, exactly the bytes the
other transports carry. Each frame is numbered in its direction
(``OpenEnv-Seq``); the client acknowledges the replies it holds
(``OpenEnv-Ack``), and the server keeps every reply until it is acknowledged,
so a request retried after a network error is never executed twice and a reply
is never lost.

On the link routes bodies are envelopes (`transports.link._envelope`): the frames of
many sessions, each on its channel. The client numbers its messages
(``OpenEnv-Seq``), the server numbers every entry it sends with its place in the
link's outgoing log and answers each request with every entry past the client's
acknowledgement (``OpenEnv-Ack``); the same two rules hold.
"""

from __future__ import annotations

from typing import Final

import msgspec

from openenv import Dialect

__all__ = [
    "ACK_HEADER",
    "Created",
    "QueuePlace",
    "Queued",
    "DEFAULT_MAX_WAIT",
    "ERROR_HEADER",
    "FRAMES_PATH",
    "IDEMPOTENCY_KEY_HEADER",
    "LINKS_PATH",
    "LINK_KEY_HEADER",
    "LINK_PATH",
    "LinkCreated",
    "MEDIA_TYPES",
    "RECEIVED_HEADER",
    "SEQ_HEADER",
    "SESSIONS_PATH",
    "SESSION_KEY_HEADER",
    "SESSION_PATH",
    "WAIT_HEADER",
    "dialect_for",
]

SESSIONS_PATH: Final = "/poll/sessions"
"""Creates a session (``POST``)."""
SESSION_PATH: Final = "/poll/sessions/{session_id}"
"""Ends a session (``DELETE``); ``{session_id}`` is the id ``POST /poll/sessions`` gave."""
FRAMES_PATH: Final = "/poll/sessions/{session_id}/frames"
"""Takes request frames (``POST``) and hands out reply frames (``GET``, and ``POST`` responses)."""

LINKS_PATH: Final = "/poll/links"
"""Creates a link (``POST``): one client's channel for many sessions."""
LINK_PATH: Final = "/poll/links/{link_id}"
"""Takes envelopes (``POST``), hands out the link's entries (``GET``, and ``POST`` responses), ends it (``DELETE``)."""

SEQ_HEADER: Final = "OpenEnv-Seq"
"""The sequence number of the frame in the message's body.

The client's numbering in a request (1, 2, 3, ... per session, or per link for
envelopes), the server's in a response (a reply's number; on a link, the place
in its log of the response's last entry).
"""
ACK_HEADER: Final = "OpenEnv-Ack"
"""On a frame request: the highest reply sequence number the client holds.

The server forgets those replies, and sends the next one.
"""
WAIT_HEADER: Final = "OpenEnv-Wait"
"""On a frame request: the seconds the server may hold the response waiting for a reply."""
RECEIVED_HEADER: Final = "OpenEnv-Received"
"""On a frame response: the highest request sequence number the server has accepted."""
ERROR_HEADER: Final = "OpenEnv-Error"
"""On the ``503`` of a refused session: the error code of the frame in its body."""
SESSION_KEY_HEADER: Final = "OpenEnv-Session-Key"
"""On every request to a session (frames, ``DELETE``): the secret key its creation gave.

The session id travels in URLs, which proxies and access logs record; the key
travels only in this header, so an id seen in a log cannot drive the session.
"""
LINK_KEY_HEADER: Final = "OpenEnv-Link-Key"
"""On every request to a link (envelopes, polls, ``DELETE``): the secret key its creation gave."""
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
"""On ``POST /poll/sessions``: makes a retried creation return the same session."""

MEDIA_TYPES: Final = {"json": "application/json", "msgpack": "application/msgpack"}
"""The media type of the frames of each encoding."""


class Created(msgspec.Struct):
    """The body of the ``201`` that creates a session (the server fills every field; a client needs only the id)."""

    session_id: str
    session_key: str | None = None
    encoding: str = "json"
    max_body_size: int | None = None
    max_wait: float | None = None


class LinkCreated(msgspec.Struct):
    """The body of the ``201`` that creates a link (the server fills every field; a client needs the id and key)."""

    link_id: str
    link_key: str
    encoding: str = "json"
    max_body_size: int | None = None
    max_wait: float | None = None


class QueuePlace(msgspec.Struct):
    """Where a creation waits in the server's queue for a slot.

    Attributes:
        position: Its place (1: the next admitted).
        queue_timeout: Seconds the server lets a session wait in its queue.
    """

    position: int = 0
    queue_timeout: float = 0.0


class Queued(msgspec.Struct):
    """The body of the ``202`` that says a creation waits in the queue for a slot: ask again, with the same key."""

    queued: QueuePlace


DEFAULT_MAX_WAIT: Final = 60.0
"""The longest the server holds a frame request by default, in seconds."""


def dialect_for(encoding: str) -> Dialect:
    """The dialect of a session that asked for ``encoding``: request ids are always on.

    Args:
        encoding: ``"json"`` or ``"msgpack"``.

    Returns:
        The dialect.

    Raises:
        ValueError: An unknown encoding.
    """
    if encoding not in MEDIA_TYPES:
        raise ValueError(f"unknown encoding {encoding!r}; use 'json' or 'msgpack'")
    return Dialect(encoding="msgpack" if encoding == "msgpack" else "json", request_ids=True)

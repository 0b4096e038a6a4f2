"""The server's resource bounds and their defaults, in one place (``docs/reliability.md`` tabulates them).

Constants only: the ASGI app, the runner, the command line and `openenv.serve`
all take their defaults from here (through `openenv.server`), so they cannot
drift apart, and none of them needs the server to read them.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "DEFAULT_HEADER_TIMEOUT",
    "DEFAULT_HTTP_IDLE_TIMEOUT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_IDLE_TIMEOUT",
]

DEFAULT_MAX_SESSIONS: Final = 256
"""The most sessions a server holds at once by default, over all transports."""

DEFAULT_SESSION_IDLE_TIMEOUT: Final = 600.0
"""Seconds a session may wait for its client by default before the server ends it."""

DEFAULT_HTTP_IDLE_TIMEOUT: Final = 300.0
"""Seconds an HTTP long-polling session may wait for its client by default.

Its client cannot be seen leaving, so a session nobody deletes must end some time.
"""

DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024 * 1024
"""The largest request a server accepts by default, in bytes: a WebSocket message or an HTTP body.

A larger one is refused as it arrives, before it is buffered whole.
"""

DEFAULT_HEADER_TIMEOUT: Final = 10.0
"""Seconds a connection may take to send a request's headers (a WebSocket handshake's too)."""

DEFAULT_MAX_CONNECTIONS: Final = 1000
"""The most connections a uvicorn server holds at once by default; beyond, requests get 503."""

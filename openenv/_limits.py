"""The client side's bounds and timeouts, each default in one place (``docs/reliability.md`` lists them).

Constants only, read by `EnvClient`, `EnvPool` and the transports' clients, so
that no two places can disagree on a default. A server's defaults are the
fields of `openenv.ServerConfig`.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "DEFAULT_CLIENT_CLOSE_TIMEOUT",
    "DEFAULT_CLIENT_MAX_MESSAGE_SIZE",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_PING_INTERVAL",
    "DEFAULT_PING_TIMEOUT",
    "DEFAULT_PLACEMENT_TIMEOUT",
    "DEFAULT_POLL_TIMEOUT",
    "DEFAULT_REPLY_TIMEOUT",
    "DEFAULT_RETRIES",
    "CLOSE_FRAME_TIMEOUT",
    "PARTING_FRAME_WAIT",
    "SEND_GRACE",
    "USE_CLIENT_DEFAULT",
    "UseClientDefault",
]


class UseClientDefault(enum.Enum):
    """The type of `USE_CLIENT_DEFAULT`, for the signatures that take it."""

    USE_CLIENT_DEFAULT = enum.auto()

    def __repr__(self) -> str:
        return "USE_CLIENT_DEFAULT"


USE_CLIENT_DEFAULT: Final = UseClientDefault.USE_CLIENT_DEFAULT
"""The default of a per-call ``timeout``: use the client's own `EnvClient.timeout`.

Pass ``timeout=None`` to wait without a limit, or a number of seconds.
"""

DEFAULT_REPLY_TIMEOUT: Final = 60.0
"""Seconds an `EnvClient` call waits for its reply by default (``timeout=``)."""

DEFAULT_CONNECT_TIMEOUT: Final = 10.0
"""Seconds a network transport may take to connect by default: DNS, TCP, TLS and the handshake."""

DEFAULT_CLIENT_CLOSE_TIMEOUT: Final = 5.0
"""Seconds a transport's close waits for the server's part (a closing handshake, a DELETE) by default."""

DEFAULT_PING_INTERVAL: Final = 20.0
"""Seconds between a WebSocket client's keepalive pings by default."""

DEFAULT_PING_TIMEOUT: Final = 20.0
"""Seconds a WebSocket client waits for the pong to a keepalive ping by default before the connection is dead."""

DEFAULT_POLL_TIMEOUT: Final = 20.0
"""Seconds an HTTP long-polling client asks the server to hold a request by default.

Below the idle timeouts of the proxies on the way (often 30 to 60 s).
"""

DEFAULT_RETRIES: Final = 5
"""How many times an HTTP long-polling client tries a request again after a network failure, by default."""

DEFAULT_CLIENT_MAX_MESSAGE_SIZE: Final = 100 * 2**20
"""The largest message a WebSocket client accepts by default, in bytes: OpenEnv's client's 100 MiB."""

DEFAULT_PLACEMENT_TIMEOUT: Final = 60.0
"""Seconds an `EnvPool` keeps trying to place a session on a server with room, by default."""

SEND_GRACE: Final = 1.0
"""Seconds a request's send may run past its call's deadline before the channel counts as stuck."""

PARTING_FRAME_WAIT: Final = 0.5
"""Seconds a client looks for an error frame the server sent just before closing the channel."""

CLOSE_FRAME_TIMEOUT: Final = 1.0
"""Seconds a closing client tries to send its ``close`` request before it closes the channel anyway."""

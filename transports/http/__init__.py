"""The HTTP long-polling transport: ``http+poll://`` and ``https+poll://`` URLs.

The client side is `HTTPPollingTransport` (on httpx); the server side is
`HTTPPollingEndpoint` (a session per HTTP session) with `HTTPLinkEndpoint`
(links: many sessions over one client's requests), which
`transports.server.app.create_app` mounts beside ``/ws`` (they need the server extra,
and are imported only when asked for). The protocol is documented in
``docs/http-polling.md``; its names are in `transports.http._protocol`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from transports.http._client import HTTPPollingTransport, polling_url

if TYPE_CHECKING:
    from transports.http._link_server import HTTPLinkEndpoint
    from transports.http._server import HTTPPollingEndpoint

__all__ = ["HTTPLinkEndpoint", "HTTPPollingEndpoint", "HTTPPollingTransport", "polling_url"]


def __getattr__(name: str) -> Any:
    # The server side needs Starlette (the server extra): import it only when asked for.
    if name == "HTTPPollingEndpoint":
        from transports.http._server import HTTPPollingEndpoint

        return HTTPPollingEndpoint
    if name == "HTTPLinkEndpoint":
        from transports.http._link_server import HTTPLinkEndpoint

        return HTTPLinkEndpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The WebSocket transport: ``ws://``, ``wss://``, ``http://`` and ``https://`` URLs.

The client side is `WebSocketTransport`; the subprotocol names say which dialects
a client offers and a server may select (see `transports.websocket._subprotocols`).
"""

from transports.websocket._client import WebSocketTransport
from transports.websocket._subprotocols import (
    JSON_SUBPROTOCOL,
    LINK_JSON_SUBPROTOCOL,
    LINK_MSGPACK_SUBPROTOCOL,
    LINK_SUBPROTOCOLS,
    MSGPACK_SUBPROTOCOL,
    SUBPROTOCOLS,
    offered_subprotocols,
)

__all__ = [
    "JSON_SUBPROTOCOL",
    "LINK_JSON_SUBPROTOCOL",
    "LINK_MSGPACK_SUBPROTOCOL",
    "LINK_SUBPROTOCOLS",
    "MSGPACK_SUBPROTOCOL",
    "SUBPROTOCOLS",
    "WebSocketTransport",
    "offered_subprotocols",
]

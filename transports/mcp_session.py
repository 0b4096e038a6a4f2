"""``http+mcp://`` and ``https+mcp://``: a session made over ``POST /mcp``, with a WebSocket attached to it.

OpenEnv 0.10's MCP "production mode", from openenv's side. On connect the
transport asks the server for a session (``openenv/session/create``), then
opens the WebSocket that carries the session's frames, attached to it
(``/ws?session_id=…``); on close, after the WebSocket, it closes the session
(``openenv/session/close``). Meanwhile the session is also reachable over
``POST /mcp`` by its `MCPSessionTransport.session_id`: an agent's MCP tool layer
can call the very environment the client steps. It works against openenv's
server and OpenEnv 0.10's.

```python
async with EchoEnv("http+mcp://127.0.0.1:8000", mode="production") as env:
    await env.reset()
    print(await env.call_tool("echo_message", message="hi"))  # JSON-RPC on the session's channel
    print(env.transport.session_id)  # POST /mcp {"params": {"session_id": ...}} reaches the same environment
```

The WebSocket is the one ``ws://`` gives (see `transports.websocket`), with the
same options; an attached connection speaks plain OpenEnv frames.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import anyio
import httpx

from openenv import CapacityReachedError, ConnectError, Transport, create_transport
from transports.shared._wrapping import WrappingTransport

__all__ = ["MCPSessionTransport"]

_CLOSE_TIMEOUT = 5.0
_SERVER_ERROR = -32000


def _http_url(url: str) -> str:
    scheme, _, rest = url.partition("://")
    base = "https" if scheme.lower() == "https+mcp" else "http"
    return f"{base}://{rest}".rstrip("/")


class MCPSessionTransport(WrappingTransport):
    """A session made over ``POST /mcp``, its frames on a WebSocket attached to it (see the module's docs).

    Args:
        url: ``http+mcp://host:port`` (or ``https+mcp://``), the server's base URL.
        connect_timeout: Seconds to make the session and open the WebSocket, each.
        headers: HTTP headers for the ``POST /mcp`` requests and the handshake
            (``{"Authorization": "Bearer …"}``).
        **options: Passed on to the WebSocket transport (``ping_interval``,
            ``max_message_size``, ...; see `transports.websocket.WebSocketTransport`).

    Attributes:
        url: The URL given.
        session_id: The server's id of the session, once connected; ``None`` before.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float = 10.0,
        headers: Mapping[str, str] | None = None,
        **options: Any,
    ) -> None:
        self.url = url
        self._base = _http_url(url)
        self._connect_timeout = connect_timeout
        self._headers = dict(headers or {})
        self._options = options
        self.session_id: str | None = None
        self._inner: Transport | None = None  # the attached WebSocket
        self._closed = False

    async def _rpc(self, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "method": method, "params": params, "id": 1}
        async with httpx.AsyncClient(headers=self._headers, timeout=timeout, trust_env=False) as http:
            response = await http.post(f"{self._base}/mcp", json=message)
        response.raise_for_status()
        reply: dict[str, Any] = response.json()
        return reply

    async def __aenter__(self) -> MCPSessionTransport:
        """Make the session, then open the WebSocket attached to it.

        Returns:
            The transport itself.

        Raises:
            CapacityReachedError: The server has no free session.
            ConnectError: The session could not be made, or the WebSocket opened.
        """
        try:
            reply = await self._rpc("openenv/session/create", {}, self._connect_timeout)
        except (httpx.HTTPError, ValueError) as exc:
            raise ConnectError(f"could not make an MCP session at {self._base}/mcp: {exc}") from exc
        error = reply.get("error")
        if isinstance(error, dict):
            raw = error.get("data")
            data: dict[str, Any] = raw if isinstance(raw, dict) else {}
            message = str(error.get("message", ""))
            if error.get("code") == _SERVER_ERROR and "max_sessions" in data:
                raise CapacityReachedError(message, data={"code": "CAPACITY_REACHED", "message": message, **data})
            raise ConnectError(f"could not make an MCP session at {self._base}/mcp: {message}")
        session_id = (reply.get("result") or {}).get("session_id")
        if not isinstance(session_id, str) or not session_id:
            raise ConnectError(f"the server at {self._base}/mcp made no session: {reply!r:.200}")
        self.session_id = session_id
        websocket = create_transport(
            f"{self._base}?session_id={session_id}",
            connect_timeout=self._connect_timeout,
            headers=self._headers,
            **self._options,
        )
        try:
            await websocket.__aenter__()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._close_session()
            raise
        self._wrap(websocket)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the WebSocket (stopping its tasks), then the session."""
        websocket = self._inner
        try:
            if websocket is not None:
                await websocket.__aexit__(exc_type, exc_value, traceback)
        finally:
            await self.aclose()

    def _is_open(self) -> bool:
        return self._inner is not None and not self._closed

    async def aclose(self) -> None:
        """Close the WebSocket, then the session (best effort, bounded); idempotent."""
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if self._inner is not None:
                await self._inner.aclose()
            await self._close_session()

    async def _close_session(self) -> None:
        session_id, self.session_id = self.session_id, None
        if session_id is None:
            return
        # Best effort: the server may be gone; it also ends the session once its WebSocket detaches.
        with anyio.move_on_after(_CLOSE_TIMEOUT), contextlib.suppress(httpx.HTTPError, ValueError):
            await self._rpc("openenv/session/close", {"session_id": session_id}, _CLOSE_TIMEOUT)

"""`EnvHost`: the Ray actor that serves many sessions of one environment over WebSocket.

Each actor runs openenv's ASGI app (`transports.server.runner.serve`) on an ephemeral
port of its node, on an event loop in a thread of its own; clients speak
``ws://`` to it directly, so a step costs what a WebSocket step costs, while Ray
places the actor, starts it and stops it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

__all__ = ["EnvHost"]


class EnvHost:
    """Serves ``factory``'s environments on a port of the actor's node (a plain class; Ray wraps it).

    Args:
        factory: The environment factory's ``"package.module:Factory"`` name.
        host: The address to listen on; the node's IP address when ``None``.
        server_options: Fields of `openenv.ServerConfig`, passed to `transports.server.runner.serve`.

    Raises:
        ImportError: The factory cannot be imported on this node.
        OSError: The address cannot be bound.
    """

    def __init__(self, factory: str, host: str | None, server_options: dict[str, Any]) -> None:
        import ray

        from transports.server.runner import serve

        self._host = host or ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self._node_id = ray.get_runtime_context().get_node_id()
        self._portal_cm: AbstractContextManager[BlockingPortal] = start_blocking_portal("asyncio")
        portal = self._portal_cm.__enter__()
        try:
            self._server_cm = portal.wrap_async_context_manager(
                serve(factory, host=self._host, port=0, **server_options)
            )
            self._server = self._server_cm.__enter__()
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            raise

    def address(self) -> tuple[str, str]:
        """Where to reach the server.

        Returns:
            Its base URL for the WebSocket transport (``ws://ip:port``) and the id
            of the Ray node it runs on.
        """
        return self._server.url.replace("http://", "ws://", 1), self._node_id

    def active_sessions(self) -> int:
        """How many sessions the server holds now."""
        return int(self._server.app.state.sessions.active)

"""Running the app on uvicorn (asyncio): configured as `openenv serve` sets it, and saying when it is ready."""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import anyio
from anyio.abc import TaskStatus

from openenv.server import ServerConfig
from transports.server.drivers._hypercorn_limits import fit_to_open_files
from transports.server.drivers._uvicorn_protocols import uvicorn_http_protocol, uvicorn_websocket_protocol
from transports.shared._public_io import public_io_only

__all__ = ["run_uvicorn"]

# Seconds between uvicorn's keepalive pings, and to wait for the pong (its defaults).
_WS_PING_INTERVAL = 20.0
_WS_PING_TIMEOUT = 20.0


async def run_uvicorn(
    app: Any,
    sock: socket.socket,
    config: ServerConfig,
    stop: anyio.Event,
    *,
    embedded: bool,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on uvicorn from ``sock`` until ``stop`` is set; ``task_status.started()`` once it serves.

    ``embedded``: in a program, logging through its own setup and leaving its signals alone.
    """
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    class EmbeddedServer(uvicorn.Server):
        """Uvicorn that reports readiness, and leaves signals to its caller."""

        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield  # never install signal handlers: `serve` is a library call, `run` handles them

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                task_status.started()

    log_level = config.log_level or "warning"
    public = config.public_io or public_io_only()
    uvicorn_config = uvicorn.Config(
        app,
        http=uvicorn_http_protocol(config.header_timeout, limit_reads=not public),
        limit_concurrency=fit_to_open_files(config.max_connections),
        ws="websockets-sansio" if public else uvicorn_websocket_protocol(),
        lifespan="on",
        interface="asgi3",
        log_config=None if embedded else LOGGING_CONFIG,
        log_level=log_level,
        access_log=log_level in ("debug", "trace"),
        ws_max_size=config.max_message_size,
        ws_ping_interval=_WS_PING_INTERVAL,
        ws_ping_timeout=_WS_PING_TIMEOUT,
        # Compressing small frames costs more CPU than it saves on a fast link.
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=max(1, round(config.shutdown_timeout)),
    )
    server = EmbeddedServer(uvicorn_config)

    async def exit_when_stopped() -> None:
        await stop.wait()
        server.should_exit = True

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(exit_when_stopped)
        try:
            await server.serve(sockets=[sock])
        except SystemExit as exc:  # uvicorn exits the process when the app's startup fails
            raise RuntimeError(f"uvicorn stopped (exit status {exc.code}); see its log") from None
        task_group.cancel_scope.cancel()

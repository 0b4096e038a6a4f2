"""Running the app on hypercorn, on asyncio or trio, and on hypercorn+websockets (trio)."""

from __future__ import annotations

import functools
import logging
import socket
from typing import Any, cast

import anyio
import sniffio
from anyio.abc import TaskStatus

from openenv.server import ServerConfig
from transports.server.drivers._hypercorn_limits import cap_connections, fit_to_open_files, refuse_compression
from transports.server.drivers._hypercorn_patches import add_trio_websocket_front, mend_trio_closing

__all__ = ["run_hypercorn"]

_PROBE_INTERVAL = 0.01


class _StartedAdapter:
    """Hands hypercorn's ``task_status.started(binds)`` on to anyio's ``started()``."""

    def __init__(self, task_status: TaskStatus[None]) -> None:
        self._task_status = task_status

    def started(self, value: object = None) -> None:
        self._task_status.started()


async def run_hypercorn(
    app: Any,
    sock: socket.socket,
    config: ServerConfig,
    stop: anyio.Event,
    *,
    embedded: bool,
    websocket_front: bool = False,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on hypercorn from ``sock`` until ``stop`` is set; ``task_status.started()`` once it serves.

    ``websocket_front``: on trio, serve WebSocket connections beside hypercorn
    (`transports.server.drivers._websocket_front`). ``embedded``: in a program, logging through
    its own setup.
    """
    from hypercorn.config import Config, Sockets
    from hypercorn.utils import wrap_app

    log_level = config.log_level or "warning"
    hypercorn_config = Config()
    hypercorn_config.loglevel = "DEBUG" if log_level == "trace" else log_level.upper()  # no TRACE level
    error_logger = logging.getLogger("hypercorn.error")
    error_logger.setLevel(hypercorn_config.loglevel)
    if not embedded:
        # A console handler as hypercorn's own, and its lines printed once: not again
        # by the root logger's handler, which an environment may have set up.
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"))
        error_logger.handlers = [handler]
        error_logger.propagate = False
    hypercorn_config.errorlog = error_logger  # embedded: the process's own logging setup, untouched
    hypercorn_config.accesslog = "-" if log_level in ("debug", "trace") else None
    hypercorn_config.websocket_max_message_size = config.max_message_size
    # Hypercorn closes a connection idle (no request in hand) this long: it also
    # bounds how long a client may take to send a request's headers.
    hypercorn_config.keep_alive_timeout = config.header_timeout
    # No keepalive pings (hypercorn's default): its ping task outlives a closed
    # connection by up to one interval, holding the socket and delaying shutdown.
    hypercorn_config.graceful_timeout = config.shutdown_timeout
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    wrapped = wrap_app(cast(Any, app), hypercorn_config.wsgi_max_body_size, "asgi")
    refuse_compression()
    max_connections = fit_to_open_files(config.max_connections)

    if sniffio.current_async_library() == "trio":
        from hypercorn.trio.run import worker_serve as trio_worker_serve

        mend_trio_closing()
        if websocket_front:
            add_trio_websocket_front()
        cap_connections(hypercorn_config, max_connections, "trio")  # outermost: counts the front's connections too
        hypercorn_config._openenv_websocket_front = websocket_front  # type: ignore[attr-defined]
        started: Any = _StartedAdapter(task_status)
        await trio_worker_serve(
            wrapped, hypercorn_config, sockets=sockets, shutdown_trigger=stop.wait, task_status=started
        )
        return

    from hypercorn.asyncio.run import worker_serve as asyncio_worker_serve

    cap_connections(hypercorn_config, max_connections, "asyncio")

    # Hypercorn on asyncio tells nobody when it is ready: ask it over HTTP.
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(
            functools.partial(
                asyncio_worker_serve, wrapped, hypercorn_config, sockets=sockets, shutdown_trigger=stop.wait
            )
        )
        host, port = sock.getsockname()[:2]
        await _wait_until_serving(host, port)
        task_status.started()


async def _wait_until_serving(host: str, port: int) -> None:
    """Return once an HTTP request to the server gets a response (any status)."""
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    while True:
        try:
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(request)
                if (await stream.receive()).startswith(b"HTTP/"):
                    return
        except (OSError, anyio.EndOfStream, anyio.BrokenResourceError):
            pass
        await anyio.sleep(_PROBE_INTERVAL)

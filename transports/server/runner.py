"""Running the app on a real ASGI server: embedded in an event loop, or blocking for the CLI.

- `serve` is an async context manager: it starts a server on a loopback port
  from inside a running event loop (asyncio or trio), yields a `RunningServer`
  once the server answers, and shuts it down gracefully on exit. It never
  touches the process's signal handlers.
- `run` blocks: it starts an event loop, serves until SIGINT or SIGTERM, then
  shuts down gracefully (a second signal cuts the grace short), as ASGI servers'
  own command lines do.

Which server runs the app: uvicorn on asyncio (the faster, measured on the
``/ws`` round trip); on trio (uvicorn is asyncio-only) hypercorn, with the
WebSocket connections served beside it through ``websockets``' sans-I/O
protocol (``hypercorn+websockets``: about half hypercorn's CPU per message;
see `transports.server.drivers._websocket_front`). Plain hypercorn can be asked for on
either backend.

This module binds the socket, runs a server on it for as long as asked, and
ends the sessions before the server stops. Each server has a driver of its own
(`transports.server.drivers._uvicorn`, `transports.server.drivers._hypercorn`); what openenv
changes in hypercorn on trio is in `transports.server.drivers._hypercorn_patches`, and the
servers' logging in `transports.server._logs`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, Unpack

import anyio
import msgspec
from anyio.abc import TaskStatus
from starlette.applications import Starlette

from openenv._config import explicit_fields
from openenv.server import ServeFunction, ServerConfig, ServerName, ServerOptions, server_config
from transports.admission._sessions import SHUTDOWN_REASON, SessionRegistry
from transports.server._logs import configure_console_logging, redact_access_logs
from transports.server.app import create_app
from transports.server.drivers._hypercorn import run_hypercorn
from transports.server.drivers._uvicorn import run_uvicorn
from transports.shared._public_io import PUBLIC_IO_ENV, public_io_only

__all__ = ["RunningServer", "ServerName", "current_backend", "run", "serve"]

logger = logging.getLogger("openenv.server")

_LISTEN_BACKLOG = 2048
# Seconds the sessions cut at the end of the shutdown's grace get to answer their clients.
_CUT_WAIT = 1.0


class RunningServer:
    """A server started by `serve`, and where to reach it.

    Args:
        app: The ASGI app being served.
        host: The address it listens on.
        port: The port it listens on.
        server: Which ASGI server runs it.

    Attributes:
        app: The ASGI app being served.
        host: The address it listens on.
        port: The port it listens on (the real one, also when 0 was asked for).
        server: Which server runs it: ``"uvicorn"``, ``"hypercorn"`` or ``"hypercorn+websockets"``.
    """

    def __init__(self, *, app: Starlette, host: str, port: int, server: ServerName) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.server = server
        self._stopped = anyio.Event()

    @property
    def url(self) -> str:
        """The base URL, ``http://host:port`` (what `openenv.EnvClient` takes, as OpenEnv's does)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def ws_url(self) -> str:
        """The WebSocket endpoint's URL, ``ws://host:port/ws``."""
        return "ws" + self.url[len("http") :] + "/ws"

    def __repr__(self) -> str:
        return f"<RunningServer {self.url} ({self.server})>"


def current_backend() -> str:
    """Name the async library running the current task: ``"asyncio"`` or ``"trio"``.

    Returns:
        The name of the library.

    Raises:
        RuntimeError: No event loop is running in this thread.
    """
    try:
        cancelled = anyio.get_cancelled_exc_class()
    except Exception as exc:  # anyio's NoEventLoopError is a RuntimeError
        raise RuntimeError("no async event loop is running in this thread") from exc
    return cancelled.__module__.partition(".")[0]


def _server_for(config: ServerConfig, backend: str) -> ServerName:
    """The server asked for, or the backend's default.

    With public I/O only, the default is hypercorn on both backends (its own
    bounds hold without openenv's code inside it), and hypercorn+websockets is
    served as plain hypercorn.
    """
    name = config.server
    if name == "uvicorn" and backend != "asyncio":
        raise RuntimeError(f"uvicorn runs on asyncio only, not {backend}; use server='hypercorn+websockets'")
    if name == "hypercorn+websockets" and backend != "trio":
        raise RuntimeError(f"hypercorn+websockets runs on trio only, not {backend}; use server='uvicorn'")
    if config.public_io or public_io_only():
        if name == "hypercorn+websockets":
            logger.warning("public I/O only (%s): serving on plain hypercorn, not hypercorn+websockets", PUBLIC_IO_ENV)
        return "uvicorn" if name == "uvicorn" else "hypercorn"
    return name or ("uvicorn" if backend == "asyncio" else "hypercorn+websockets")


# TCP keepalive on every connection (accepted sockets inherit it from the
# listener): a peer that vanished without a word (power lost, a network cut) is
# found out by the kernel after about a minute of silence, on every server,
# without ping tasks; its session then ends and frees its slot.
_KEEPALIVE_IDLE = 30
_KEEPALIVE_INTERVAL = 10
_KEEPALIVE_PROBES = 3


def _keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", _KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", _KEEPALIVE_PROBES),
    ):
        if hasattr(socket, option):  # Linux and most others; macOS lacks TCP_KEEPIDLE
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def _bind(host: str, port: int) -> socket.socket:
    """Bind and listen on ``(host, port)`` ourselves, so the port is known before serving."""
    addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _, address = addresses[0]
    sock = socket.socket(family, kind, proto)
    try:
        if hasattr(socket, "SO_REUSEADDR") and not hasattr(socket, "SO_EXCLUSIVEADDRUSE"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        _keep_alive(sock)
        sock.bind(address)
        sock.listen(_LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


# Each called as (app, sock, config, stop, embedded=, task_status=).
_DRIVERS: dict[ServerName, Callable[..., Awaitable[None]]] = {
    "uvicorn": run_uvicorn,
    "hypercorn": run_hypercorn,
    "hypercorn+websockets": functools.partial(run_hypercorn, websocket_front=True),
}


def _resolved(config: ServerConfig, *, embedded: bool) -> ServerConfig:
    """``config`` with its log level decided: warnings in a program, what it does on a command line."""
    return msgspec.structs.replace(config, log_level=config.log_level or ("warning" if embedded else "info"))


def _app_for(
    app_or_factory: Starlette | Callable[[], Any] | str, config: ServerConfig, given: set[str]
) -> tuple[Starlette, ServerConfig]:
    """The app to serve, and the config to serve it with.

    A factory gets `create_app` with ``config``. An app made by `create_app`
    keeps the options it was made with, and is served with them: one of them
    ``given`` here with another value is a mistake. Another app has no such
    options but the one the server enforces too (``max_message_size``).
    """
    if not isinstance(app_or_factory, Starlette):
        return create_app(app_or_factory, config=config), config
    own = getattr(app_or_factory.state, "config", None)
    if isinstance(own, ServerConfig):
        differing = {name for name in given & ServerConfig.APP_FIELDS if getattr(config, name) != getattr(own, name)}
        config = msgspec.structs.replace(config, **{name: getattr(own, name) for name in ServerConfig.APP_FIELDS})
    else:
        differing = given & ServerConfig.APP_FIELDS - {"max_message_size"}
    if differing:
        raise ValueError(f"{', '.join(sorted(differing))} are set in create_app(), not for a ready app")
    return app_or_factory, config


async def _end_sessions(app: Starlette, timeout: float) -> None:
    """Ask the app's sessions to end (idle ones now, busy ones after their reply); wait for them; then cut them.

    The servers would otherwise wait out their whole grace period for every
    open WebSocket (hypercorn), or close them without a reason (uvicorn: 1012).
    A session still busy once ``timeout`` has passed (a step longer than the
    grace) is cut: its step is cancelled, and its client told why (WebSocket
    close 1001, HTTP ``410``, "server shutting down") before the server
    stops, rather than the server cancelling its request (uvicorn logs each
    as an application error, with its traceback; an HTTP client gets ``500``).
    The grace is measured on the registry's clock (a test's, advanced by hand);
    the wait after the cut, a bound only, on the event loop's time.
    """
    registry = getattr(app.state, "sessions", None)
    if not isinstance(registry, SessionRegistry):
        return
    # Even with no session left: it also ends what waits on none (a link waiting for its client).
    registry.close_all(SHUTDOWN_REASON)
    if not registry.leases():
        return
    with registry.clock.move_on_after(timeout):
        await registry.wait_empty()
    if not registry.leases():
        return
    cut = registry.cut_all(SHUTDOWN_REASON)
    if cut:
        logger.warning("%d session(s) still busy after the %g s shutdown grace: ending them", cut, timeout)
    # Cancelled steps end at once; a plain environment's step holds its thread
    # to its end (the process does not wait for it): its session ends then.
    with anyio.move_on_after(_CUT_WAIT):
        await registry.wait_empty()


class _StartupWatch:
    """Passes an ASGI app through, noting whether its lifespan startup failed, and quieting its end.

    Hypercorn on trio logs a failed startup and serves regardless; this lets
    `serve` refuse to yield a server whose app did not start.

    Once `stopping` (the sessions were asked to end, then cut), a request the
    server cancels is expected: a session whose plain environment's step
    outlives the grace holds its thread, and its request, to the step's end.
    Uvicorn logs each such cancellation as an application error, with a
    traceback (and Starlette the lifespan's, which waits for them); this says
    it in one line instead.
    """

    def __init__(self, app: Starlette) -> None:
        self.app = app
        self.failure: str | None = None
        self.stopping = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            try:
                return await self.app(scope, receive, send)
            except anyio.get_cancelled_exc_class():
                if not (self.stopping and current_backend() == "asyncio"):
                    raise  # trio's servers cancel quietly; a Cancelled must reach its scope there
                logger.warning("a request still running at the end of the shutdown was cancelled")
                return

        async def watched_send(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed":
                # Starlette sends the whole traceback: its last line says what failed.
                lines = str(message.get("message") or "").strip().splitlines()
                self.failure = lines[-1] if lines else "lifespan startup failed"
            elif message["type"] == "lifespan.shutdown.failed" and self.stopping:
                lines = str(message.get("message") or "").strip().splitlines()
                if lines and lines[-1].startswith(("asyncio.exceptions.CancelledError", "CancelledError")):
                    message = {**message, "message": "sessions still running at the end of the shutdown were left"}
            await send(message)

        await self.app(scope, receive, watched_send)


@contextlib.asynccontextmanager
async def _serving(
    app: Starlette,
    *,
    host: str,
    port: int,
    config: ServerConfig,
    embedded: bool,
) -> AsyncIterator[RunningServer]:
    """Run ``app`` on a server for the block; the block's own exception comes out as itself.

    A server that fails to start raises `RuntimeError` (or `TimeoutError`) here; one
    that fails while the block runs stops serving, and `RuntimeError` is raised
    when the block ends (the block is not interrupted).
    """
    backend = current_backend()
    redact_access_logs()
    config = _resolved(config, embedded=embedded)
    name = _server_for(config, backend)
    watched = _StartupWatch(app)
    sock = _bind(host, port)
    server_errors: list[Exception] = []
    body_error: Exception | None = None
    started = False
    stop = anyio.Event()
    stopped = anyio.Event()
    cut_short = False  # the server outlived its shutdown bound and was cancelled

    async def run_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await _DRIVERS[name](watched, sock, config, stop, embedded=embedded, task_status=task_status)
        except Exception as exc:  # kept for the host: a task group would cancel the caller's block
            if cut_short:
                # Its teardown failed under the cancellation (hypercorn's worker_serve can): the stop is
                # ours, and the server is gone either way.
                logger.warning("the %s server failed as it was cut short after its shutdown grace: %r", name, exc)
            else:
                server_errors.append(exc)
        finally:
            stopped.set()

    try:
        bound_host, bound_port = sock.getsockname()[:2]
        async with anyio.create_task_group() as task_group:
            try:
                startup_timeout = config.startup_timeout
                with anyio.fail_after(startup_timeout):
                    await task_group.start(run_server)
                started = watched.failure is None
            except RuntimeError:  # the server exited before it was ready: see server_errors
                pass
            except TimeoutError:
                server_errors.append(TimeoutError(f"{name} did not start within {startup_timeout} s"))
            if not started:
                stop.set()
                with anyio.move_on_after(config.shutdown_timeout):
                    await stopped.wait()
                task_group.cancel_scope.cancel()
            else:
                running = RunningServer(app=app, host=bound_host, port=bound_port, server=name)
                task_group.start_soon(_set_when_set, stopped, running._stopped)
                try:
                    yield running
                except Exception as exc:
                    body_error = exc
                finally:
                    try:
                        await _end_sessions(app, config.shutdown_timeout)
                    finally:
                        watched.stopping = True
                        stop.set()
                        # Graceful first; the server bounds its own grace, this bounds the server.
                        with anyio.move_on_after(config.shutdown_timeout + 2.0):
                            await stopped.wait()
                        cut_short = not stopped.is_set()
                        task_group.cancel_scope.cancel()
    finally:
        sock.close()
    if body_error is not None:
        for error in server_errors:
            logger.error("the %s server failed", name, exc_info=error)
        raise body_error
    if not started:
        if watched.failure is not None:
            raise RuntimeError(f"the app failed to start: {watched.failure}")
        if server_errors and isinstance(server_errors[0], TimeoutError):
            raise server_errors[0]
        cause = server_errors[0] if server_errors else None
        raise RuntimeError(f"{name} failed to start the app: {cause}") from cause
    if server_errors:
        raise RuntimeError(f"the {name} server failed: {server_errors[0]}") from server_errors[0]


async def _set_when_set(event: anyio.Event, follower: anyio.Event) -> None:
    await event.wait()
    follower.set()


@contextlib.asynccontextmanager
async def serve(
    app_or_factory: Starlette | Callable[[], Any] | str,
    *,
    config: ServerConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    **options: Unpack[ServerOptions],
) -> AsyncIterator[RunningServer]:
    """Serve an environment from inside a running event loop, for the ``async with`` block.

    `openenv.serve` calls it, through the ``openenv.server`` entry point.

    Examples:
        ```python
        from openenv.examples.echo import EchoEnv, EchoEnvironment
        from transports.server.runner import serve

        async with serve(EchoEnvironment, max_sessions=2) as server:
            print(server.url, server.ws_url)  # http://127.0.0.1:<port> ws://127.0.0.1:<port>/ws
            async with EchoEnv(server.url) as env:
                await env.reset()
        ```

    Args:
        app_or_factory: The environment factory (a class, a function, or its
            ``"package.module:Factory"`` name), or an app made by `create_app`
            (served with the app's own options).
        config: The server's options (`openenv.ServerConfig`); the defaults
            when ``None``.
        host: The address to listen on.
        port: The port; 0 (the default) picks a free one, reported as
            `RunningServer.port`.
        **options: Fields of `openenv.ServerConfig` by name, replacing
            ``config``'s.

    Yields:
        The `RunningServer`, already serving. The block's own exception comes
        out as itself (not in an exception group).

    Raises:
        RuntimeError: No event loop runs; uvicorn was asked for on trio, or
            hypercorn+websockets on asyncio; the app
            failed to start (its lifespan raised); or the server failed while the
            block ran (raised when the block ends: the block is not interrupted,
            its requests fail).
        TypeError: An unknown option, or one of the wrong type.
        ValueError: An option out of its range or choices (an unknown
            ``server``), or the app's options differing from a ready app's.
        OSError: The address cannot be bound.
        TimeoutError: The server did not start within ``startup_timeout``.
    """
    checked = server_config(config, options)
    app, checked = _app_for(app_or_factory, checked, explicit_fields(config, options))
    async with _serving(app, host=host, port=port, config=checked, embedded=True) as running:
        yield running


if TYPE_CHECKING:  # openenv.serve hands its checked config here: mypy checks the signatures agree
    _serves_openenv: ServeFunction = serve


async def _serve_until_signalled(
    app: Starlette,
    *,
    host: str,
    port: int,
    config: ServerConfig,
    on_ready: Callable[[RunningServer], object] | None,
) -> None:
    failure: Exception | None = None
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        stop_requested = anyio.Event()
        async with anyio.create_task_group() as task_group:

            async def watch_signals() -> None:
                async for signum in signals:
                    if not stop_requested.is_set():
                        logger.info("%s received: shutting down", signal.Signals(signum).name)
                        stop_requested.set()
                    else:  # A second signal: stop waiting for open connections.
                        logger.warning("%s received again: exiting now", signal.Signals(signum).name)
                        task_group.cancel_scope.cancel()

            task_group.start_soon(watch_signals)
            try:
                async with _serving(app, host=host, port=port, config=config, embedded=False) as running:
                    if on_ready is not None:
                        on_ready(running)
                    # A server that stops on its own (it failed) ends the process: a
                    # supervisor can restart it, which it cannot do for a live process
                    # that no longer listens.
                    task_group.start_soon(_set_when_set, running._stopped, stop_requested)
                    await stop_requested.wait()
            except Exception as exc:
                # Raised below, as itself: the task group would wrap it in an exception group.
                failure = exc
            task_group.cancel_scope.cancel()
    if failure is not None:
        raise failure


def run(
    app_or_factory: Starlette | Callable[[], Any] | str,
    *,
    config: ServerConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    backend: Literal["asyncio", "trio"] = "asyncio",
    on_ready: Callable[[RunningServer], object] | None = None,
    **options: Unpack[ServerOptions],
) -> None:
    """Serve an environment until SIGINT (Ctrl-C) or SIGTERM; blocks. For the CLI and scripts.

    The first signal shuts the server down gracefully (open sessions get
    ``shutdown_timeout`` seconds); a second one exits at once. Call it from the
    main thread, with no event loop running. It is what ``openenv serve
    package.module:Factory --port 8000`` runs; in a script, write
    ``run(MyEnvironment, port=8000)`` under ``if __name__ == "__main__":``.
    Its server logs at ``"info"`` unless ``log_level`` says otherwise, with the
    server's usual console logging set up.

    Args:
        app_or_factory: As for `serve`.
        config: As for `serve`.
        host: The address to listen on.
        port: The port (0 picks a free one; ``on_ready`` learns which).
        backend: The event loop: ``"asyncio"`` or ``"trio"``.
        on_ready: Called with the `RunningServer` once it accepts connections.
        **options: As for `serve`.

    Raises:
        RuntimeError: uvicorn was asked for on trio, hypercorn+websockets on
            asyncio, or the app failed to start.
        TypeError: An unknown option, or one of the wrong type.
        ValueError: An option out of its range or choices (an unknown
            ``server``), or the app's options differing from a ready app's.
        OSError: The address cannot be bound.
    """
    checked = server_config(config, options)
    app, checked = _app_for(app_or_factory, checked, explicit_fields(config, options))
    checked = _resolved(checked, embedded=False)
    configure_console_logging(checked.log_level or "info")
    anyio.run(
        functools.partial(_serve_until_signalled, app, host=host, port=port, config=checked, on_ready=on_ready),
        backend=backend,
    )

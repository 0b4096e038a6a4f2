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
see `transports._websocket_front`). Plain hypercorn can be asked for on
either backend.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
from anyio.abc import TaskStatus
from starlette.applications import Starlette

from openenv.server import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
    ServeFunction,
)

from ._hypercorn_limits import cap_connections, fit_to_open_files, refuse_compression
from ._sessions import SHUTDOWN_REASON, SessionRegistry
from ._uvicorn_protocols import uvicorn_http_protocol, uvicorn_websocket_protocol
from ._websocket_front import ReplayedStream, is_websocket_upgrade, read_head, serve_websocket
from .app import create_app

__all__ = ["DEFAULT_WS_MAX_SIZE", "RunningServer", "ServerName", "current_backend", "run", "serve"]

logger = logging.getLogger("openenv.server")

ServerName = Literal["uvicorn", "hypercorn", "hypercorn+websockets"]
"""The servers that can run the app: uvicorn (asyncio only), hypercorn (asyncio or trio), or
hypercorn+websockets (trio only: hypercorn, with WebSocket connections served through
``websockets``' sans-I/O protocol instead of hypercorn's own; see `transports._websocket_front`)."""

_SERVER_NAMES = ("uvicorn", "hypercorn", "hypercorn+websockets")

DEFAULT_WS_MAX_SIZE = DEFAULT_MAX_MESSAGE_SIZE
"""The largest WebSocket message the server accepts by default: 16 MiB (the HTTP body limit too).

A message is refused as its frames arrive, before it is buffered whole; a larger
one ends its own connection (close code 1009).
"""

# Seconds between uvicorn's keepalive pings, and to wait for the pong (its defaults).
_WS_PING_INTERVAL = 20.0
_WS_PING_TIMEOUT = 20.0
_LISTEN_BACKLOG = 2048
# Seconds the sessions cut at the end of the shutdown's grace get to answer their clients.
_CUT_WAIT = 1.0
_PROBE_INTERVAL = 0.01


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


def _default_server(backend: str) -> ServerName:
    return "uvicorn" if backend == "asyncio" else "hypercorn+websockets"


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


class _Options:
    """What the server runners need besides the app and the socket."""

    def __init__(
        self,
        *,
        log_level: str,
        shutdown_timeout: float,
        embedded: bool,
        max_message_size: int = DEFAULT_WS_MAX_SIZE,
        header_timeout: float = DEFAULT_HEADER_TIMEOUT,
        max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        if not header_timeout > 0:
            raise ValueError(f"header_timeout must be positive, not {header_timeout}")
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be at least 1 (or None), not {max_connections}")
        self.log_level = log_level
        self.shutdown_timeout = shutdown_timeout
        self.embedded = embedded
        self.max_message_size = max_message_size
        self.header_timeout = header_timeout
        self.max_connections = fit_to_open_files(max_connections)


async def _run_uvicorn(
    app: Starlette,
    sock: socket.socket,
    options: _Options,
    stop: anyio.Event,
    *,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
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

    config = uvicorn.Config(
        app,
        http=uvicorn_http_protocol(options.header_timeout),
        limit_concurrency=options.max_connections,
        ws=uvicorn_websocket_protocol(),
        lifespan="on",
        interface="asgi3",
        log_config=None if options.embedded else LOGGING_CONFIG,
        log_level=options.log_level,
        access_log=options.log_level in ("debug", "trace"),
        ws_max_size=options.max_message_size,
        ws_ping_interval=_WS_PING_INTERVAL,
        ws_ping_timeout=_WS_PING_TIMEOUT,
        # Compressing small frames costs more CPU than it saves on a fast link.
        ws_per_message_deflate=False,
        timeout_graceful_shutdown=max(1, round(options.shutdown_timeout)),
    )
    server = EmbeddedServer(config)

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


class _StartedAdapter:
    """Hands hypercorn's ``task_status.started(binds)`` on to anyio's ``started()``."""

    def __init__(self, task_status: TaskStatus[None]) -> None:
        self._task_status = task_status

    def started(self, value: object = None) -> None:
        self._task_status.started()


async def _run_hypercorn(
    app: Starlette,
    sock: socket.socket,
    options: _Options,
    stop: anyio.Event,
    *,
    websocket_front: bool = False,
    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    from hypercorn.config import Config, Sockets
    from hypercorn.utils import wrap_app

    config = Config()
    config.loglevel = "DEBUG" if options.log_level == "trace" else options.log_level.upper()  # no TRACE level
    error_logger = logging.getLogger("hypercorn.error")
    error_logger.setLevel(config.loglevel)
    if not options.embedded:
        # A console handler as hypercorn's own, and its lines printed once: not again
        # by the root logger's handler, which an environment may have set up.
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"))
        error_logger.handlers = [handler]
        error_logger.propagate = False
    config.errorlog = error_logger  # embedded: the process's own logging setup, untouched
    config.accesslog = "-" if options.log_level in ("debug", "trace") else None
    config.websocket_max_message_size = options.max_message_size
    # Hypercorn closes a connection idle (no request in hand) this long: it also
    # bounds how long a client may take to send a request's headers.
    config.keep_alive_timeout = options.header_timeout
    # No keepalive pings (hypercorn's default): its ping task outlives a closed
    # connection by up to one interval, holding the socket and delaying shutdown.
    config.graceful_timeout = options.shutdown_timeout
    sockets = Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])
    wrapped = wrap_app(cast(Any, app), config.wsgi_max_body_size, "asgi")
    refuse_compression()

    if current_backend() == "trio":
        from hypercorn.trio.run import worker_serve as trio_worker_serve

        _mend_hypercorn_trio_closing()
        _add_hypercorn_trio_websocket_front()
        cap_connections(config, options.max_connections, "trio")  # outermost: counts the front's connections too
        config._openenv_websocket_front = websocket_front  # type: ignore[attr-defined]
        started: Any = _StartedAdapter(task_status)
        await trio_worker_serve(wrapped, config, sockets=sockets, shutdown_trigger=stop.wait, task_status=started)
        return

    from hypercorn.asyncio.run import worker_serve as asyncio_worker_serve

    cap_connections(config, options.max_connections, "asyncio")
    # Hypercorn on asyncio tells nobody when it is ready: ask it over HTTP.
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(
            functools.partial(asyncio_worker_serve, wrapped, config, sockets=sockets, shutdown_trigger=stop.wait)
        )
        host, port = sock.getsockname()[:2]
        await _wait_until_serving(host, port)
        task_status.started()


def _mend_hypercorn_trio_closing() -> None:
    """Keep a client closing its WebSocket from killing hypercorn's whole trio server.

    Hypercorn's trio connection half-closes its socket (``send_eof``) outside the
    lock its other writes take. A write that lands meanwhile (the closing
    handshake's answer, or the app's last frame when both ends close at once)
    raises `trio.BusyResourceError`, which nothing catches: it ends the server's
    task group, listener and every session with it, while the process lives on.
    The write is moot (the socket is being closed), so this treats it as the
    peer having gone, as hypercorn treats a broken socket. Idempotent.
    """
    import hypercorn.trio.run
    import hypercorn.trio.tcp_server
    from hypercorn.events import Closed
    from hypercorn.trio.tcp_server import TCPServer

    # Trio's own exception, taken from the hypercorn module that meets it (the
    # rest of openenv reaches trio only through anyio).
    tcp_server_module: Any = hypercorn.trio.tcp_server
    busy_error: type[Exception] = tcp_server_module.trio.BusyResourceError

    run_module: Any = hypercorn.trio.run  # the module whose TCPServer its worker_serve builds
    if getattr(run_module.TCPServer, "_openenv_mended", False):
        return

    class MendedTCPServer(TCPServer):
        _openenv_mended = True

        async def protocol_send(self, event: Any) -> None:
            try:
                await super().protocol_send(event)
            except busy_error:  # send_eof is closing the socket: the write is moot
                await self.protocol.handle(Closed())

    run_module.TCPServer = MendedTCPServer


def _add_hypercorn_trio_websocket_front() -> None:
    """Serve the WebSocket connections of hypercorn+websockets beside hypercorn on trio.

    Hypercorn's trio worker builds a ``TCPServer`` per connection; this one,
    for a server whose config has ``_openenv_websocket_front`` set, reads the
    request head first, serves a WebSocket upgrade itself (see
    `transports._websocket_front`), and hands anything else to hypercorn with
    the bytes already read. Other servers' connections go to hypercorn
    untouched. Idempotent.
    """
    import hypercorn.trio.run

    run_module: Any = hypercorn.trio.run  # the module whose TCPServer its worker_serve builds
    if getattr(run_module.TCPServer, "_openenv_fronted", False):
        return

    class FrontedTCPServer(run_module.TCPServer):  # type: ignore[misc]  # the mended class, if installed
        _openenv_fronted = True
        stream: Any  # trio's SocketStream, or the one that replays the head

        async def run(self) -> None:
            if not getattr(self.config, "_openenv_websocket_front", False):
                await super().run()
                return
            head = await self._read_head()
            if head is None:
                with contextlib.suppress(Exception):
                    await self.stream.aclose()
                return
            if not is_websocket_upgrade(head):
                self.stream = ReplayedStream(self.stream, head)
                await super().run()
                return
            sock = self.stream.socket
            try:
                client, server = sock.getpeername()[:2], sock.getsockname()[:2]
            except OSError:  # gone already
                with contextlib.suppress(Exception):
                    await self.stream.aclose()
                return
            watched = cast(Any, self.app).app  # hypercorn's wrapper around the ASGI app
            await serve_websocket(
                watched,
                self.stream,
                head,
                client=client,
                server=server,
                max_message_size=self.config.websocket_max_message_size,
                state=dict(self.state),
            )

        async def _read_head(self) -> bytes | None:
            """The request head, within the keep-alive timeout; ``None`` if it does not come, or the server stops."""
            head: bytes | None = None
            with anyio.move_on_after(self.config.keep_alive_timeout):
                async with anyio.create_task_group() as task_group:

                    async def cancel_when_terminated() -> None:
                        await self.context.terminated.wait()
                        task_group.cancel_scope.cancel()

                    task_group.start_soon(cancel_when_terminated)
                    head = await read_head(self.stream)
                    task_group.cancel_scope.cancel()
            return head

    run_module.TCPServer = FrontedTCPServer


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


_RUNNERS: dict[str, Callable[..., Awaitable[None]]] = {
    "uvicorn": _run_uvicorn,
    "hypercorn": _run_hypercorn,
    "hypercorn+websockets": functools.partial(_run_hypercorn, websocket_front=True),
}


def _app_for(app_or_factory: Starlette | Callable[[], Any] | str, **app_options: Any) -> Starlette:
    """The app to serve: ``app_or_factory`` itself, or `create_app` of it with the options given."""
    if isinstance(app_or_factory, Starlette):
        defaults = inspect.signature(create_app).parameters
        changed = sorted(name for name, value in app_options.items() if value != defaults[name].default)
        if changed:
            raise ValueError(f"{', '.join(changed)} are set in create_app(), not for a ready app")
        return app_or_factory
    return create_app(app_or_factory, **app_options)


async def _end_sessions(app: Starlette, timeout: float) -> None:
    """Ask the app's sessions to end (idle ones now, busy ones after their reply); wait for them; then cut them.

    The servers would otherwise wait out their whole grace period for every
    open WebSocket (hypercorn), or close them without a reason (uvicorn: 1012).
    A session still busy once ``timeout`` has passed (a step longer than the
    grace) is cut: its step is cancelled, and its client told why (WebSocket
    close 1001, HTTP ``410``, "server shutting down") before the server
    stops, rather than the server cancelling its request (uvicorn logs each
    as an application error, with its traceback; an HTTP client gets ``500``).
    """
    registry = getattr(app.state, "sessions", None)
    if not isinstance(registry, SessionRegistry) or not registry.leases():
        return
    registry.close_all(SHUTDOWN_REASON)
    with anyio.move_on_after(timeout):
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
    server: ServerName | None,
    options: _Options,
    startup_timeout: float,
) -> AsyncIterator[RunningServer]:
    """Run ``app`` on a server for the block; the block's own exception comes out as itself.

    A server that fails to start raises `RuntimeError` (or `TimeoutError`) here; one
    that fails while the block runs stops serving, and `RuntimeError` is raised
    when the block ends (the block is not interrupted).
    """
    backend = current_backend()
    _redact_access_logs()
    name: ServerName = server if server is not None else _default_server(backend)
    if name not in _RUNNERS:
        raise ValueError(f"unknown server {name!r}; use one of {', '.join(map(repr, _SERVER_NAMES))}")
    if name == "uvicorn" and backend != "asyncio":
        raise RuntimeError(f"uvicorn runs on asyncio only, not {backend}; use server='hypercorn+websockets'")
    if name == "hypercorn+websockets" and backend != "trio":
        raise RuntimeError(f"hypercorn+websockets runs on trio only, not {backend}; use server='uvicorn'")
    watched = _StartupWatch(app)
    sock = _bind(host, port)
    server_errors: list[Exception] = []
    body_error: Exception | None = None
    started = False
    stop = anyio.Event()
    stopped = anyio.Event()

    async def run_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await _RUNNERS[name](watched, sock, options, stop, task_status=task_status)
        except Exception as exc:  # kept for the host: a task group would cancel the caller's block
            server_errors.append(exc)
        finally:
            stopped.set()

    try:
        bound_host, bound_port = sock.getsockname()[:2]
        async with anyio.create_task_group() as task_group:
            try:
                with anyio.fail_after(startup_timeout):
                    await task_group.start(run_server)
                started = watched.failure is None
            except RuntimeError:  # the server exited before it was ready: see server_errors
                pass
            except TimeoutError:
                server_errors.append(TimeoutError(f"{name} did not start within {startup_timeout} s"))
            if not started:
                stop.set()
                with anyio.move_on_after(options.shutdown_timeout):
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
                        await _end_sessions(app, options.shutdown_timeout)
                    finally:
                        watched.stopping = True
                        stop.set()
                        # Graceful first; the server bounds its own grace, this bounds the server.
                        with anyio.move_on_after(options.shutdown_timeout + 2.0):
                            await stopped.wait()
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
    host: str = "127.0.0.1",
    port: int = 0,
    server: ServerName | None = None,
    max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    log_level: str = "warning",
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    max_message_size: int = DEFAULT_WS_MAX_SIZE,
    auth_token: str | Sequence[str] | None = None,
    allow_origins: Sequence[str] = (),
    error_details: bool = True,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    queue_timeout: float | None = None,
) -> AsyncIterator[RunningServer]:
    """Serve an environment from inside a running event loop, for the ``async with`` block.

    `openenv.serve` calls it, through the ``openenv.server`` entry point.

    Examples:
        ```python
        from openenv.examples.echo import EchoEnv, EchoEnvironment
        from transports.runner import serve

        async with serve(EchoEnvironment, max_sessions=2) as server:
            print(server.url, server.ws_url)  # http://127.0.0.1:<port> ws://127.0.0.1:<port>/ws
            async with EchoEnv(server.url) as env:
                await env.reset()
        ```

    Args:
        app_or_factory: The environment factory (a class, a function, or its
            ``"package.module:Factory"`` name), or an app made by `create_app`.
        host: The address to listen on.
        port: The port; 0 (the default) picks a free one, reported as
            `RunningServer.port`.
        server: ``"uvicorn"`` (asyncio only), ``"hypercorn"``, or
            ``"hypercorn+websockets"`` (trio only); by default uvicorn on
            asyncio and hypercorn+websockets on trio.
        max_sessions: See `create_app` (only with a factory).
        session_idle_timeout: See `create_app` (only with a factory).
        log_level: The level of the server's own loggers (``"warning"``,
            ``"info"``, ...); the process's logging configuration is not replaced.
        shutdown_timeout: Seconds open sessions get, on exit, to finish the
            request in hand before they are cut.
        startup_timeout: Seconds the server may take to start.
        max_message_size: The largest WebSocket message accepted, in bytes; a
            larger one ends its connection (close code 1009), never another's.
        auth_token: See `create_app` (only with a factory).
        allow_origins: See `create_app` (only with a factory).
        error_details: See `create_app` (only with a factory).
        header_timeout: Seconds a connection may take to send a request's
            headers (the WebSocket handshake's included), from its first byte
            or the connection's start; then it is closed.
        max_connections: The most connections at once (uvicorn only: beyond,
            requests get 503); ``None`` for no limit.
        queue_timeout: See `create_app` (only with a factory).

    Yields:
        The `RunningServer`, already serving. The block's own exception comes
        out as itself (not in an exception group).

    Raises:
        RuntimeError: No event loop runs; uvicorn was asked for on trio, or
            hypercorn+websockets on asyncio; the app
            failed to start (its lifespan raised); or the server failed while the
            block ran (raised when the block ends: the block is not interrupted,
            its requests fail).
        ValueError: An unknown ``server``, or session options with a ready app.
        OSError: The address cannot be bound.
        TimeoutError: The server did not start within ``startup_timeout``.
    """
    app = _app_for(
        app_or_factory,
        max_sessions=max_sessions,
        session_idle_timeout=session_idle_timeout,
        auth_token=auth_token,
        allow_origins=allow_origins,
        error_details=error_details,
        queue_timeout=queue_timeout,
    )
    options = _Options(
        log_level=log_level,
        shutdown_timeout=shutdown_timeout,
        embedded=True,
        max_message_size=max_message_size,
        header_timeout=header_timeout,
        max_connections=max_connections,
    )
    async with _serving(
        app, host=host, port=port, server=server, options=options, startup_timeout=startup_timeout
    ) as running:
        yield running


if TYPE_CHECKING:  # openenv.serve forwards its typed options here: mypy checks both signatures agree
    _serves_openenv: ServeFunction = serve


async def _serve_until_signalled(
    app: Starlette,
    *,
    host: str,
    port: int,
    server: ServerName | None,
    options: _Options,
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
                async with _serving(
                    app, host=host, port=port, server=server, options=options, startup_timeout=60.0
                ) as running:
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
    host: str = "127.0.0.1",
    port: int = 8000,
    backend: Literal["asyncio", "trio"] = "asyncio",
    server: ServerName | None = None,
    max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    log_level: str = "info",
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    max_message_size: int = DEFAULT_WS_MAX_SIZE,
    auth_token: str | Sequence[str] | None = None,
    allow_origins: Sequence[str] = (),
    error_details: bool = True,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    queue_timeout: float | None = None,
    on_ready: Callable[[RunningServer], object] | None = None,
) -> None:
    """Serve an environment until SIGINT (Ctrl-C) or SIGTERM; blocks. For the CLI and scripts.

    The first signal shuts the server down gracefully (open sessions get
    ``shutdown_timeout`` seconds); a second one exits at once. Call it from the
    main thread, with no event loop running. It is what ``openenv serve
    package.module:Factory --port 8000`` runs; in a script, write
    ``run(MyEnvironment, port=8000)`` under ``if __name__ == "__main__":``.

    Args:
        app_or_factory: As for `serve`.
        host: The address to listen on.
        port: The port (0 picks a free one; ``on_ready`` learns which).
        backend: The event loop: ``"asyncio"`` or ``"trio"``.
        server: As for `serve`: by default uvicorn on asyncio, hypercorn+websockets on trio.
        max_sessions: See `create_app` (only with a factory).
        session_idle_timeout: See `create_app` (only with a factory).
        log_level: The log level; the server's usual console logging is set up.
        shutdown_timeout: Seconds open connections get to finish after a signal.
        max_message_size: As for `serve`.
        auth_token: See `create_app` (only with a factory).
        allow_origins: See `create_app` (only with a factory).
        error_details: See `create_app` (only with a factory).
        header_timeout: As for `serve`.
        max_connections: As for `serve`.
        queue_timeout: See `create_app` (only with a factory).
        on_ready: Called with the `RunningServer` once it accepts connections.

    Raises:
        RuntimeError: uvicorn was asked for on trio, hypercorn+websockets on
            asyncio, or the app failed to start.
        ValueError: An unknown ``server``, or session options with a ready app.
        OSError: The address cannot be bound.
    """
    app = _app_for(
        app_or_factory,
        max_sessions=max_sessions,
        session_idle_timeout=session_idle_timeout,
        auth_token=auth_token,
        allow_origins=allow_origins,
        error_details=error_details,
        queue_timeout=queue_timeout,
    )
    _configure_console_logging(log_level)
    options = _Options(
        log_level=log_level,
        shutdown_timeout=shutdown_timeout,
        embedded=False,
        max_message_size=max_message_size,
        header_timeout=header_timeout,
        max_connections=max_connections,
    )
    anyio.run(
        functools.partial(
            _serve_until_signalled, app, host=host, port=port, server=server, options=options, on_ready=on_ready
        ),
        backend=backend,
    )


# A session id in a logged path: the id, not its key, but ids stay out of logs anyway.
_SESSION_IN_PATH = re.compile(r"(/poll/sessions/)[^/\s?\"]+")


class _RedactSessionIds(logging.Filter):
    """Replaces HTTP session ids in the servers' access-log lines with ``...``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_redact(arg) for arg in args)
        elif isinstance(args, dict):  # hypercorn's atoms: updated in place, keeping its class
            for key, value in list(args.items()):
                args[key] = _redact(value)
        record.msg = _redact(record.msg)
        return True


def _redact(value: Any) -> Any:
    return _SESSION_IN_PATH.sub(r"\1...", value) if isinstance(value, str) else value


def _redact_access_logs() -> None:
    """Keep session ids out of the access logs of both servers (idempotent)."""
    for name in ("uvicorn.access", "hypercorn.access"):
        access_logger = logging.getLogger(name)
        if not any(isinstance(existing, _RedactSessionIds) for existing in access_logger.filters):
            access_logger.addFilter(_RedactSessionIds())


def _configure_console_logging(log_level: str) -> None:
    """Log openenv's server messages to stderr, for a command line (the servers log their own).

    Each server line is printed once, by its own handler: not again by the root
    logger's, which an environment may set up (``logging.basicConfig()`` on
    import). uvicorn's configuration does the same for its loggers.
    """
    openenv_logger = logging.getLogger("openenv")
    if all(isinstance(handler, logging.NullHandler) for handler in openenv_logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        openenv_logger.addHandler(handler)
        openenv_logger.propagate = False
    openenv_logger.setLevel("DEBUG" if log_level == "trace" else log_level.upper())

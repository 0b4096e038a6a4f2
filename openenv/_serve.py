"""`openenv.serve`: serve an environment from inside an event loop, for tests and notebooks.

The server lives in `transports` (it needs an ASGI server: ``pip install
'openenv-anyio[server]'``). openenv never imports it: `serve` finds it through the
``openenv.server`` entry-point group (the entry named ``serve``), as a client
finds its transport through ``openenv.transports``, and only when called, so
importing openenv pulls in no I/O library. `ServeFunction` is the signature that
entry must have; mypy checks the built-in one against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from importlib.metadata import entry_points
from typing import Any, Literal, Protocol, cast

from ._limits import (
    DEFAULT_HEADER_TIMEOUT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_SESSION_IDLE_TIMEOUT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
)

__all__ = ["SERVER_ENTRY_POINT_GROUP", "RunningServer", "ServeFunction", "serve"]

SERVER_ENTRY_POINT_GROUP = "openenv.server"
"""The entry-point group `serve` finds its server in: the entry named ``serve``, a `ServeFunction`."""


class RunningServer(Protocol):
    """A server `serve` started, and where to reach it."""

    @property
    def app(self) -> Any:
        """The ASGI app being served."""

    @property
    def host(self) -> str:
        """The address it listens on."""

    @property
    def port(self) -> int:
        """The port it listens on (the real one, also when 0 was asked for)."""

    @property
    def server(self) -> str:
        """Which server runs it: ``"uvicorn"``, ``"hypercorn"`` or ``"hypercorn+websockets"``."""

    @property
    def url(self) -> str:
        """The base URL, ``http://host:port`` (what `openenv.EnvClient` takes)."""

    @property
    def ws_url(self) -> str:
        """The WebSocket endpoint's URL, ``ws://host:port/ws``."""


class ServeFunction(Protocol):
    """What the ``serve`` entry of ``openenv.server`` is: `serve`'s signature (see it for the options)."""

    def __call__(
        self,
        app_or_factory: Callable[..., Any] | str,
        /,
        *,
        host: str = ...,
        port: int = ...,
        server: Literal["uvicorn", "hypercorn", "hypercorn+websockets"] | None = ...,
        max_sessions: int | None = ...,
        session_idle_timeout: float | None = ...,
        log_level: str = ...,
        shutdown_timeout: float = ...,
        startup_timeout: float = ...,
        max_message_size: int = ...,
        auth_token: str | Sequence[str] | None = ...,
        allow_origins: Sequence[str] = ...,
        error_details: bool = ...,
        header_timeout: float = ...,
        max_connections: int | None = ...,
        queue_timeout: float | None = ...,
    ) -> AbstractAsyncContextManager[RunningServer]:
        """Start serving on entering; stop gracefully on leaving."""


def _server_entry() -> ServeFunction:
    """The ``serve`` entry of the ``openenv.server`` group, loaded."""
    hint = "openenv.serve needs the server extra: pip install 'openenv-anyio[server]'"
    found = entry_points(group=SERVER_ENTRY_POINT_GROUP, name="serve")
    if not found:
        raise ImportError(f"{hint} (no {SERVER_ENTRY_POINT_GROUP!r} entry point named 'serve' is installed)")
    try:
        return cast(ServeFunction, next(iter(found)).load())
    except ImportError as exc:
        raise ImportError(f"{hint} ({exc})") from exc


def serve(
    app_or_factory: Callable[..., Any] | str,
    /,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    server: Literal["uvicorn", "hypercorn", "hypercorn+websockets"] | None = None,
    max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    session_idle_timeout: float | None = DEFAULT_SESSION_IDLE_TIMEOUT,
    log_level: str = "warning",
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
    auth_token: str | Sequence[str] | None = None,
    allow_origins: Sequence[str] = (),
    error_details: bool = True,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
    queue_timeout: float | None = None,
) -> AbstractAsyncContextManager[RunningServer]:
    """Serve an environment on a local port for the duration of an ``async with`` block.

    For tests, notebooks and examples: the server runs in the caller's own event
    loop (asyncio or trio), speaks WebSocket and HTTP long-polling, and is shut
    down gracefully when the block ends. To serve from a command line, use
    ``openenv serve package.module:Factory``.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment

        async with openenv.serve(EchoEnvironment, port=0) as server:
            async with EchoEnv(server.url) as env:  # or "http+poll://" + the host and port
                await env.reset()
                result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "hi"}))
                print(result.observation.echoed_message)  # hi
        ```

    Args:
        app_or_factory: Builds one environment per session: an `Environment`
            subclass, a function, or its ``"package.module:Factory"`` name; or an
            ASGI app made by ``transports.app.create_app``.
        host: The address to listen on.
        port: The port; 0 (the default) picks a free one, reported as
            `RunningServer.port`.
        server: ``"uvicorn"`` (asyncio only), ``"hypercorn"``, or
            ``"hypercorn+websockets"`` (trio only: hypercorn, with WebSocket
            connections served by ``websockets``' protocol); by default uvicorn
            on asyncio and hypercorn+websockets on trio.
        max_sessions: The most sessions open at once over all transports;
            ``None`` for no limit (only with a factory).
        session_idle_timeout: Seconds a session may go without its client (no
            request in hand, no connection open to it) before the server ends
            it; ``None`` for never (only with a factory). A WebSocket session is
            never ended by it while its connection lasts.
        log_level: The level of the server's own loggers (``"warning"``,
            ``"info"``, ...); the process's logging configuration is not replaced.
        shutdown_timeout: Seconds open sessions get, on exit, to finish the
            request in hand before they are cut.
        startup_timeout: Seconds the server may take to start.
        max_message_size: The largest WebSocket message accepted, in bytes; a
            larger one ends its connection (close code 1009), never another's.
        auth_token: The bearer token every request but ``GET /health`` must
            carry (``Authorization: Bearer <token>``), or several (any one is
            accepted); ``None`` takes it from ``OPENENV_AUTH_TOKEN`` if that is
            set; ``()`` accepts requests without one (only with a factory).
        allow_origins: The browser origins (``"https://app.example"``; ``"*"``
            for any) whose requests are accepted, with CORS headers; requests
            without an ``Origin`` (every client but a browser) are not affected
            (only with a factory).
        error_details: Whether error replies say what failed on the server
            (``False``: generic messages; the log keeps the details; only with
            a factory).
        header_timeout: Seconds a connection may take to send a request's
            headers (the WebSocket handshake's included); then it is closed.
        max_connections: The most connections at once (uvicorn only: beyond,
            requests get 503); ``None`` for no limit.
        queue_timeout: Seconds a new session may wait for a slot when
            ``max_sessions`` are open, in arrival order; ``None`` refuses it at
            once with ``CAPACITY_REACHED`` (only with a factory).

    Returns:
        An async context manager; entering it starts the server and gives its
        `RunningServer` (``.url``, ``.ws_url``, ``.host``, ``.port``,
        ``.app``), leaving it shuts the server down gracefully.

    Raises:
        ImportError: The server extra is not installed (``pip install
            'openenv-anyio[server]'``), or, on entering, a named factory cannot be
            imported.
        TypeError: On entering, a factory that cannot build environments: not
            callable, or a client or message class (see
            `openenv.server.check_factory`).
        ValueError: On entering: an unknown ``server``, a bad factory name,
            session options with a ready app, or an option out of range.
        RuntimeError: On entering: no event loop runs, uvicorn was asked for on
            trio (or hypercorn+websockets on asyncio), or the app failed to start; on leaving: the server failed
            while the block ran.
        OSError: On entering: the address cannot be bound.
        TimeoutError: On entering: the server did not start within ``startup_timeout``.
    """
    return _server_entry()(
        app_or_factory,
        host=host,
        port=port,
        server=server,
        max_sessions=max_sessions,
        session_idle_timeout=session_idle_timeout,
        log_level=log_level,
        shutdown_timeout=shutdown_timeout,
        startup_timeout=startup_timeout,
        max_message_size=max_message_size,
        auth_token=auth_token,
        allow_origins=allow_origins,
        error_details=error_details,
        header_timeout=header_timeout,
        max_connections=max_connections,
        queue_timeout=queue_timeout,
    )

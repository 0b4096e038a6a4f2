"""`openenv.serve`: serve an environment from inside an event loop, for tests and notebooks.

The server lives in `transports` (it needs an ASGI server: ``pip install
'openenv-anyio[server]'``). openenv never imports it: `serve` finds it through the
``openenv.server`` entry-point group (the entry named ``serve``), as a client
finds its transport through ``openenv.transports``, and only when called, so
importing openenv pulls in no I/O library. `ServeFunction` is the signature that
entry must have; mypy checks the built-in one against it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from importlib.metadata import entry_points
from typing import Any, Protocol, Unpack, cast

from ._config import ServerConfig, ServerOptions, server_config

__all__ = ["SERVER_ENTRY_POINT_GROUP", "AppFunction", "RunningServer", "ServeFunction", "build_app", "serve"]

SERVER_ENTRY_POINT_GROUP = "openenv.server"
"""Where `serve` and `build_app` find the server.

Its entries: ``serve`` (a `ServeFunction`), and ``create_app`` and ``create_extensible_app``
(each an `AppFunction`).
"""


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
        config: ServerConfig,
        host: str,
        port: int,
    ) -> AbstractAsyncContextManager[RunningServer]:
        """Start serving on entering; stop gracefully on leaving."""


class AppFunction(Protocol):
    """What the ``create_app`` entry of ``openenv.server`` is: it builds the ASGI app that serves a factory."""

    def __call__(self, factory: Callable[..., Any], /, *, config: ServerConfig) -> Any:
        """The app: every transport's endpoint for ``factory``'s environments, bounded by ``config``."""


def _server_entry(name: str, caller: str) -> Any:
    """The entry ``name`` of the ``openenv.server`` group, loaded; ``caller`` is named in the error without it."""
    hint = f"{caller} needs the server extra: pip install 'openenv-anyio[server]'"
    found = entry_points(group=SERVER_ENTRY_POINT_GROUP, name=name)
    if not found:
        raise ImportError(f"{hint} (no {SERVER_ENTRY_POINT_GROUP!r} entry point named {name!r} is installed)")
    try:
        return next(iter(found)).load()
    except ImportError as exc:
        raise ImportError(f"{hint} ({exc})") from exc


def build_app(
    factory: Callable[..., Any], /, *, config: ServerConfig, caller: str = "build_app", extensible: bool = False
) -> Any:
    """The ASGI app that serves an environment factory, from the installed server (the ``create_app`` entry).

    For code in ``openenv`` that must hand back an app (``openenv.core``'s
    ``create_app``) without importing ``transports``.

    Args:
        factory: Builds one environment per session.
        config: The server's options.
        caller: What the user called, for the error when the server extra is missing.
        extensible: Behind a front that takes more routes, as upstream's FastAPI app does
            (the ``create_extensible_app`` entry).

    Returns:
        The app (a Starlette app, for the built-in server).

    Raises:
        ImportError: The server extra is not installed.
    """
    entry = "create_extensible_app" if extensible else "create_app"
    return cast(AppFunction, _server_entry(entry, caller))(factory, config=config)


def serve(
    app_or_factory: Callable[..., Any] | str,
    /,
    *,
    config: ServerConfig | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    **options: Unpack[ServerOptions],
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
            ASGI app made by ``transports.server.app.create_app``.
        config: The server's options (`ServerConfig`); the defaults when ``None``.
        host: The address to listen on.
        port: The port; 0 (the default) picks a free one, reported as
            `RunningServer.port`.
        **options: Fields of `ServerConfig` by name (``max_sessions=4``),
            replacing ``config``'s. The app's options (``max_sessions``,
            ``auth_token``, ...) are refused with an app made by ``create_app``:
            they are set there.

    Returns:
        An async context manager; entering it starts the server and gives its
        `RunningServer` (``.url``, ``.ws_url``, ``.host``, ``.port``,
        ``.app``), leaving it shuts the server down gracefully.

    Raises:
        ImportError: The server extra is not installed (``pip install
            'openenv-anyio[server]'``), or, on entering, a named factory cannot be
            imported.
        TypeError: An unknown option, or one of the wrong type (the message
            names it); on entering, a factory that cannot build environments:
            not callable, or a client or message class (see
            `openenv.server.check_factory`).
        ValueError: An option out of its range or choices (an unknown
            ``server``); on entering, a bad factory name, or the app's options
            with a ready app.
        RuntimeError: On entering: no event loop runs, uvicorn was asked for on
            trio (or hypercorn+websockets on asyncio), or the app failed to start; on leaving: the server failed
            while the block ran.
        OSError: On entering: the address cannot be bound.
        TimeoutError: On entering: the server did not start within ``startup_timeout``.
    """
    checked = server_config(config, options)
    serve_function = cast(ServeFunction, _server_entry("serve", "openenv.serve"))
    return serve_function(app_or_factory, config=checked, host=host, port=port)

"""`openenv.serve`: serve an environment from inside an event loop, for tests and notebooks.

The server lives in `transports` (it needs an ASGI server: ``pip install
'openenv[server]'``); this module imports it only when called, so importing
openenv never pulls in I/O libraries.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transports.runner import RunningServer

__all__ = ["serve"]


def serve(factory: Callable[[], Any] | str, **kwargs: Any) -> AbstractAsyncContextManager[RunningServer]:
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
        factory: Builds one environment per session: an `Environment` subclass, a
            function, or its ``"package.module:Factory"`` name.
        **kwargs: The options of `transports.runner.serve`: ``host``
            (``"127.0.0.1"``), ``port`` (0, the default: a free one),
            ``server`` (``"uvicorn"`` or ``"hypercorn"``; by default uvicorn on
            asyncio, hypercorn on trio), ``max_sessions`` (``None``: no limit),
            ``session_idle_timeout`` (seconds, ``None``: never), ``log_level``
            (``"warning"``), ``shutdown_timeout`` (5 s), ``startup_timeout``
            (30 s), ``max_message_size`` (bytes, 100 MiB), ``auth_token`` (a
            bearer token, or several, clients must send; by default
            ``OPENENV_AUTH_TOKEN``'s, if set) and ``allow_origins`` (browser
            origins accepted; by default none).

    Returns:
        An async context manager; entering it starts the server and gives its
        `transports.runner.RunningServer` (``.url``, ``.ws_url``, ``.host``,
        ``.port``, ``.app``), leaving it shuts the server down gracefully.

    Raises:
        ImportError: The server extra is not installed (``pip install
            'openenv[server]'``), or, on entering, a named factory cannot be
            imported.
        TypeError: An unknown option; on entering, a factory that cannot build
            environments: not callable, or a client or message class (see
            `openenv.server.check_factory`).
        ValueError: On entering: an unknown ``server``, a bad factory name, or
            an option out of range.
        RuntimeError: On entering: no event loop runs, uvicorn was asked for on
            trio, or the app failed to start; on leaving: the server failed
            while the block ran.
        OSError: On entering: the address cannot be bound.
        TimeoutError: On entering: the server did not start within ``startup_timeout``.
    """
    try:
        from transports.runner import serve as serve_app
    except ImportError as exc:
        raise ImportError(f"openenv.serve needs the server extra: pip install 'openenv[server]' ({exc})") from exc
    return serve_app(factory, **kwargs)

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

    Example:
        ```python
        async with openenv.serve(EchoEnvironment, port=0) as server:
            async with EchoEnv(server.url) as env:
                await env.reset()
        ```

    Args:
        factory: Builds one environment per session: an `Environment` subclass, a
            function, or its ``"package.module:Factory"`` name.
        **kwargs: ``host`` (``"127.0.0.1"``), ``port`` (0: a free one),
            ``server`` (``"uvicorn"`` or ``"hypercorn"``; by default uvicorn on
            asyncio, hypercorn on trio), ``max_sessions``,
            ``session_idle_timeout``, ``log_level``, ``shutdown_timeout``,
            ``startup_timeout``: see `transports.runner.serve`.

    Returns:
        An async context manager; entering it starts the server and gives its
        `RunningServer` (``.url``, ``.host``, ``.port``, ``.app``), leaving it
        shuts the server down gracefully.

    Raises:
        ImportError: The server extra is not installed.
    """
    try:
        from transports.runner import serve as serve_app
    except ImportError as exc:
        raise ImportError(f"openenv.serve needs the server extra: pip install 'openenv[server]' ({exc})") from exc
    return serve_app(factory, **kwargs)

"""``project://``: a local OpenEnv environment project, started for the session, in an environment of its own.

The URL names the project's directory (``project:///home/me/echo_env``, or
``project://envs/echo_env`` relative to the working directory). On connect the
transport has the project installed in a virtual environment of its own
(cached: made once per change of its ``pyproject.toml`` or lock file), starts
its server on a free loopback port, waits until it answers ``/health``, and
talks to it over WebSocket (``ws://``, with the same options). Every session of
the process on one project shares one server; the last to close stops it. See
`transports.project._launcher` for the details.

This is how an environment built on upstream OpenEnv's packages (which cannot
be installed beside openenv: both are imported as ``openenv``) runs beside
openenv's client: two environments, no clash. It is openenv's counterpart of
OpenEnv's ``from_env(..., use_docker=False)``. With ``server="openenv-anyio"`` the
same unchanged project is served by openenv-anyio's ``openenv.core`` instead, in its
own environment all the same (see `transports.project._launcher`).

```python
from openenv import EnvClient, EnvPool

async with EnvClient("project:///home/me/echo_env") as env:  # installs (once), starts, connects
    await env.reset()

async with EnvPool("project:///home/me/echo_env", size=8) as pool:  # one server for the eight
    await pool.reset()

async with EnvClient("project:///home/me/echo_env", server="openenv-anyio") as env:  # served by openenv
    await env.reset()
```
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

from openenv import ConnectError, Transport, create_transport
from transports.project._launcher import (
    DEFAULT_CACHE_DIR,
    DEFAULT_INSTALL_TIMEOUT,
    DEFAULT_STARTUP_TIMEOUT,
    LaunchError,
    check_project,
    check_server,
    launcher,
)
from transports.shared._wrapping import WrappingTransport

__all__ = ["ProjectTransport", "project_path"]


def project_path(url: str) -> Path:
    """The project directory a ``project://`` URL names.

    Args:
        url: ``project:///absolute/path`` or ``project://relative/path``.

    Returns:
        The path (not yet checked).

    Raises:
        ValueError: The URL is not a ``project://`` URL, or names no path.
    """
    scheme, separator, path = url.partition("://")
    if scheme.lower() != "project" or not separator or not path:
        raise ValueError(f"{url!r} is not a project:///path/to/project URL")
    return Path(path)


class ProjectTransport(WrappingTransport):
    """A session on a local environment project's own server, started on connect (see the module's docs).

    Args:
        url: ``project:///path/to/project``.
        cache_dir: Where project environments are kept
            (``$XDG_CACHE_HOME/openenv-launcher`` by default).
        python: The Python project environments are made from (this one by default).
        install_timeout: Seconds the project's environment may take to be made
            and installed (only when it must be: the first time, or after its
            ``pyproject.toml`` or lock file changed).
        startup_timeout: Seconds its server may take to answer ``GET /health``.
        server: What serves the project: ``"upstream"`` (the server its own dependencies
            bring, upstream OpenEnv's), or ``"openenv-anyio"``: this openenv-anyio, installed
            into the project's environment in place of upstream's ``openenv``, serves the
            same ``server/app.py`` through ``openenv.core``, with openenv's limits and speed.
        **options: Passed on to the WebSocket transport (``connect_timeout``,
            ``ping_interval``, ...; see `transports.websocket.WebSocketTransport`).

    Attributes:
        project: The project's directory, resolved.
        server: What serves it: ``"upstream"`` or ``"openenv-anyio"``.
        server_url: The base URL of the project's server once connected, else ``None``.

    Raises:
        ValueError: Not a ``project://`` URL, or the directory is not an OpenEnv
            environment project (no ``pyproject.toml`` or ``server/app.py``), or
            ``server`` is neither of the two.
    """

    def __init__(
        self,
        url: str,
        *,
        cache_dir: str | Path = DEFAULT_CACHE_DIR,
        python: str | None = None,
        install_timeout: float = DEFAULT_INSTALL_TIMEOUT,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        server: str = "upstream",
        **options: Any,
    ) -> None:
        self.url = url
        self.project = check_project(project_path(url))
        self.server = check_server(server)
        self._launcher = launcher(Path(cache_dir), python)
        self._install_timeout = install_timeout
        self._startup_timeout = startup_timeout
        self._options = options
        self.server_url: str | None = None
        self._inner: Transport | None = None
        self._acquired = False

    async def __aenter__(self) -> ProjectTransport:
        """Start (or share) the project's server, then connect to it.

        Returns:
            The transport itself.

        Raises:
            ConnectError: Installing or starting the project failed (the
                message has the tail of its output), or the connection did.
        """
        try:
            self.server_url = await self._launcher.acquire(
                self.project,
                install_timeout=self._install_timeout,
                startup_timeout=self._startup_timeout,
                server=self.server,
            )
        except LaunchError as exc:
            raise ConnectError(str(exc)) from exc
        self._acquired = True
        try:
            inner = create_transport(self.server_url, **self._options)
            await inner.__aenter__()
        except BaseException:
            await self._release()
            raise
        self._wrap(inner)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the connection (stopping its tasks); the last session of the project stops its server."""
        try:
            if self._inner is not None:
                await self._inner.__aexit__(exc_type, exc_value, traceback)
        finally:
            await self._release()

    def _is_open(self) -> bool:
        return self._inner is not None and self._acquired

    async def aclose(self) -> None:
        """Close the connection; the last session of the project stops its server. Idempotent."""
        if self._inner is not None:
            await self._inner.aclose()
        await self._release()

    async def _release(self) -> None:
        if self._acquired:
            self._acquired = False
            await self._launcher.release(self.project, server=self.server)

"""Launching a local OpenEnv environment project: a virtual environment of its own, a server on a free port.

A project in upstream OpenEnv's layout is a directory with ``pyproject.toml``
(its dependencies: OpenEnv's own packages, usually), ``server/app.py`` (the
ASGI app) and ``openenv.yaml`` (its ``app:``, ``server.app:app`` by default).
`Launcher.acquire` makes it a server and returns its URL:

1. a virtual environment of the project's own, under the cache directory, named
   by a hash of the project's path, ``pyproject.toml`` and lock file
   (``uv.lock``), and of the Python version: built once (with ``uv`` when it is
   on ``PATH``, else ``venv`` and ``pip``), reused while none of them change;
2. the project and ``uvicorn`` installed into it;
3. its app served by that environment's Python from the project's directory,
   on a loopback socket bound here and handed to the server (no port race),
   until ``GET /health`` answers.

With ``server="openenv-anyio"`` the project is served by openenv-anyio instead:
the environment gets this openenv-anyio (the same checkout or version, with its
``mcp`` extra, which brings ``openenv.core``), then the project through ``openenv
install``, which leaves upstream's ``openenv`` out; the same ``create_app`` call in
the project's ``server/app.py`` then builds openenv's app.

Launches are shared within the process: every `Launcher.acquire` of one project
(and one server) gets the same server, which stops (terminated, killed after a grace) at the
last `Launcher.release`. The server also stops on its own when this process
dies: it watches its standard input, a pipe from here, and exits at its end.
Nothing of OpenEnv's (ours or upstream's) is imported here: the project's
packages live only in its own environment, beside ours.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import httpx

__all__ = [
    "DEFAULT_CACHE_DIR",
    "DEFAULT_INSTALL_TIMEOUT",
    "DEFAULT_STARTUP_TIMEOUT",
    "LaunchError",
    "Launcher",
    "ProjectLayoutError",
    "SERVERS",
    "check_project",
    "check_server",
    "launcher",
    "openenv_anyio_requirement",
]

logger = logging.getLogger("openenv.launcher")

DEFAULT_CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "openenv-launcher"
"""Where project environments are kept by default (``$XDG_CACHE_HOME/openenv-launcher``)."""

DEFAULT_INSTALL_TIMEOUT = 1800.0
"""Seconds a project's environment may take to be made and installed, by default (once per change)."""
DEFAULT_STARTUP_TIMEOUT = 120.0
"""Seconds a project's server may take to answer ``GET /health``, by default."""

SERVERS = ("upstream", "openenv-anyio")
"""What may serve a project: its own dependencies (upstream OpenEnv's server), or openenv-anyio's."""
OPENENV_ANYIO_EXTRA = "mcp"
"""The extra of openenv-anyio a project's environment gets: ``openenv.core``, FastMCP, the server and the CLI."""

_MARKER = ".openenv-project-ok"
_STOP_GRACE = 5.0
_HEALTH_POLL = 0.1
_OUTPUT_LINES = 40

# Run by the project environment's Python, from the project's directory: serve the
# app on the socket handed over, and exit when our end of the stdin pipe closes.
_SERVE = r"""
import os, sys, threading
def watch():
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
sys.path.insert(0, os.getcwd())
import uvicorn
uvicorn.run(sys.argv[1], fd=int(sys.argv[2]), log_level="warning", lifespan="on")
"""


class LaunchError(RuntimeError):
    """The project could not be installed or started; the message says where it failed."""


class ProjectLayoutError(ValueError):
    """The directory is not an OpenEnv environment project (``pyproject.toml``, ``server/app.py``)."""


def _app_of(project: Path) -> str:
    """The ``app:`` of the project's ``openenv.yaml`` (a one-line ``key: value`` read; no YAML parser needed)."""
    manifest = project / "openenv.yaml"
    if manifest.is_file():
        for line in manifest.read_text(encoding="utf-8").splitlines():
            match = re.fullmatch(r"\s*app\s*:\s*['\"]?([\w.]+:[\w.]+)['\"]?\s*(#.*)?", line)
            if match:
                return match.group(1)
    return "server.app:app"


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().resolve()


def check_project(path: str | os.PathLike[str]) -> Path:
    """The project's directory, resolved, once it has the layout of one.

    Args:
        path: The project's directory.

    Returns:
        Its absolute path.

    Raises:
        ProjectLayoutError: No such directory, or no ``pyproject.toml`` or ``server/app.py`` in it.
    """
    project = _resolved(path)
    if not project.is_dir():
        raise ProjectLayoutError(f"{project} is not a directory")
    missing = [name for name in ("pyproject.toml", "server/app.py") if not (project / name).is_file()]
    if missing:
        raise ProjectLayoutError(
            f"{project} is not an OpenEnv environment project: it has no {' and no '.join(missing)}"
        )
    return project


def check_server(server: str) -> str:
    """The server asked for, once it is one of `SERVERS`.

    Args:
        server: ``"upstream"`` or ``"openenv-anyio"``.

    Raises:
        ValueError: Another value.
    """
    if server not in SERVERS:
        raise ValueError(f"server={server!r}: a project is served by {' or '.join(map(repr, SERVERS))}")
    return server


def openenv_anyio_requirement() -> list[str]:
    """What pip installs to put this openenv-anyio into a project's environment.

    The checkout it was installed from (editable or not), as pip recorded it; else its
    version from the index.

    Raises:
        LaunchError: openenv-anyio is not installed as a distribution (run from a bare source tree).
    """
    try:
        distribution = importlib.metadata.distribution("openenv-anyio")
    except importlib.metadata.PackageNotFoundError:
        raise LaunchError(
            "server='openenv-anyio' installs this openenv-anyio into the project's environment, and it is not "
            "installed: pip install -e '.[core]' in its checkout first"
        ) from None
    recorded = distribution.read_text("direct_url.json")
    if recorded:
        origin = json.loads(recorded)
        url = str(origin.get("url", ""))
        if url.startswith("file://"):
            folder = urllib.request.url2pathname(urllib.parse.urlparse(url).path)
            target = f"{folder}[{OPENENV_ANYIO_EXTRA}]"
            return ["-e", target] if origin.get("dir_info", {}).get("editable") else [target]
    return [f"openenv-anyio[{OPENENV_ANYIO_EXTRA}]=={distribution.version}"]


def environment_key(project: Path, python: str, server: str = "upstream") -> str:
    """The name of a project's environment: a hash of what its installation depends on."""
    digest = hashlib.sha256()
    digest.update(str(project).encode())
    for name in ("pyproject.toml", "uv.lock"):
        file = project / name
        digest.update(name.encode() + (file.read_bytes() if file.is_file() else b"-"))
    digest.update(python.encode())
    if server != "upstream":  # upstream's keys stay as they were: environments made before are reused
        digest.update(server.encode() + " ".join(openenv_anyio_requirement()).encode())
    return f"{project.name}-{digest.hexdigest()[:16]}"


@dataclass
class _Launch:
    """One project's server, shared by every acquirer."""

    project: Path
    server: str = "upstream"
    users: int = 0
    url: str | None = None
    process: anyio.abc.Process | None = None
    ready: anyio.Event = field(default_factory=anyio.Event)
    failure: BaseException | None = None
    log: Path | None = None

    def output_tail(self) -> str:
        """The last lines the server wrote."""
        if self.log is None or not self.log.is_file():
            return "(none)"
        lines = self.log.read_text(errors="replace").splitlines()[-_OUTPUT_LINES:]
        return "\n".join(lines) or "(none)"


class Launcher:
    """Installs and starts environment projects, each once per process (see the module's docs).

    Args:
        cache_dir: Where project environments are kept.
        python: The Python the environments are made from (``sys.executable`` by default).
    """

    def __init__(self, *, cache_dir: Path = DEFAULT_CACHE_DIR, python: str | None = None) -> None:
        self.cache_dir = Path(cache_dir)
        self.python = python or sys.executable
        self._launches: dict[tuple[Path, str], _Launch] = {}
        self._lock = threading.Lock()

    async def acquire(
        self,
        path: str | os.PathLike[str],
        *,
        install_timeout: float = DEFAULT_INSTALL_TIMEOUT,
        startup_timeout: float = DEFAULT_STARTUP_TIMEOUT,
        server: str = "upstream",
    ) -> str:
        """Start the project's server, or share the one running; return its base URL.

        Args:
            path: The project's directory.
            install_timeout: Seconds its environment may take to be made and installed.
            startup_timeout: Seconds its server may take to answer ``GET /health``.
            server: What serves it: ``"upstream"`` (its own dependencies) or ``"openenv-anyio"``.

        Returns:
            The server's base URL, ``http://127.0.0.1:<port>``.

        Raises:
            ProjectLayoutError: The directory is not a project.
            LaunchError: Installing or starting it failed (with the tail of its output).
        """
        project = check_project(path)
        key = (project, check_server(server))
        with self._lock:
            launch = self._launches.get(key)
            first = launch is None
            if launch is None:
                launch = self._launches[key] = _Launch(project, server)
            launch.users += 1
        try:
            if first:
                try:
                    await self._start(launch, install_timeout, startup_timeout)
                except BaseException as exc:
                    launch.failure = exc
                    raise
                finally:
                    launch.ready.set()
            else:
                await launch.ready.wait()
                if launch.failure is not None:
                    raise LaunchError(f"{project} failed to start: {launch.failure}")
        except BaseException:
            await self.release(project, server=server)
            raise
        assert launch.url is not None
        return launch.url

    async def release(self, path: str | os.PathLike[str], *, server: str = "upstream") -> None:
        """Let go of a project's server; the last to let go stops it.

        Args:
            path: The project's directory, as given to `acquire`.
            server: The server, as given to `acquire`.
        """
        key = (_resolved(path), server)
        with self._lock:
            launch = self._launches.get(key)
            if launch is None:
                return
            launch.users -= 1
            if launch.users > 0:
                return
            del self._launches[key]
        await _stop(launch)

    # -- installing -------------------------------------------------------------------

    async def environment(self, project: Path, server: str = "upstream") -> Path:
        """The Python of the project's environment, made and installed first if need be.

        Args:
            project: The project's directory (see `check_project`).
            server: What will serve it (see `SERVERS`): what the environment gets.

        Returns:
            The path of the environment's ``python``.

        Raises:
            LaunchError: Making or installing the environment failed.
        """
        venv = self.cache_dir / environment_key(project, self.python, server)
        python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        if (venv / _MARKER).is_file() and python.exists():
            return python
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        async with _file_lock(self.cache_dir / f".{venv.name}.lock"):
            if (venv / _MARKER).is_file() and python.exists():
                return python  # another process made it meanwhile
            if venv.exists():
                shutil.rmtree(venv)  # half made: start over
            uv = shutil.which("uv")
            logger.info("installing %s into %s (%s)", project, venv, "uv" if uv else "pip")
            if server == "openenv-anyio":
                # pip, not uv: `openenv install` runs pip in the environment, and uv's have none.
                await _run([self.python, "-m", "venv", str(venv)], "python -m venv")
                quiet = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
                await _run([*quiet, *openenv_anyio_requirement()], "installing openenv-anyio")
                command = venv / ("Scripts/openenv.exe" if os.name == "nt" else "bin/openenv")
                await _run([str(command), "install", str(project), "--quiet"], f"openenv install {project.name}")
            elif uv:
                await _run([uv, "venv", "--quiet", "--python", self.python, str(venv)], "uv venv")
                install = [uv, "pip", "install", "--quiet", "--python", str(python), str(project), "uvicorn"]
                await _run(install, f"installing {project.name}")
            else:
                await _run([self.python, "-m", "venv", str(venv)], "python -m venv")
                install = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
                await _run([*install, str(project), "uvicorn"], f"installing {project.name}")
            (venv / _MARKER).write_text(f"{project}\n")
        return python

    # -- serving ------------------------------------------------------------------------

    async def _start(self, launch: _Launch, install_timeout: float, startup_timeout: float) -> None:
        with anyio.fail_after(install_timeout):
            python = await self.environment(launch.project, launch.server)
        # The server writes to a file (a pipe nobody reads would fill, and stall it).
        launch.log = python.parent.parent / "server.log"
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", 0))
            listener.listen(2048)
            listener.set_inheritable(True)
            port = listener.getsockname()[1]
            with open(launch.log, "wb") as log:  # noqa: ASYNC230 - a local file, opened once per launch
                launch.process = await anyio.open_process(
                    [str(python), "-c", _SERVE, _app_of(launch.project), str(listener.fileno())],
                    cwd=launch.project,
                    env=_child_environment(),
                    pass_fds=[listener.fileno()],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        finally:
            listener.close()  # the server holds its own copy now
        launch.url = f"http://127.0.0.1:{port}"
        try:
            await self._wait_healthy(launch, startup_timeout)
        except BaseException:
            await _stop(launch)
            raise

    async def _wait_healthy(self, launch: _Launch, timeout: float) -> None:
        process = launch.process
        assert process is not None
        assert launch.url is not None
        with anyio.move_on_after(timeout):
            async with httpx.AsyncClient(timeout=5.0, trust_env=False) as http:
                while process.returncode is None:
                    with contextlib.suppress(httpx.HTTPError):
                        if (await http.get(f"{launch.url}/health")).status_code == 200:
                            return
                    await anyio.sleep(_HEALTH_POLL)
        tail = launch.output_tail()
        if process.returncode is None:
            raise LaunchError(f"{launch.project} did not answer /health within {timeout} s; its output:\n{tail}")
        raise LaunchError(f"{launch.project}'s server exited with {process.returncode}; its output:\n{tail}")


async def _stop(launch: _Launch) -> None:
    """Stop the launch's server: end its stdin, terminate it, kill it after a grace; bounded, shielded."""
    process, launch.process = launch.process, None
    if process is None:
        return
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(Exception):
            if process.stdin is not None:
                await process.stdin.aclose()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            with anyio.move_on_after(_STOP_GRACE):
                await process.wait()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        with contextlib.suppress(Exception):
            await process.aclose()


def _child_environment() -> dict[str, str]:
    """Our environment, minus what would put our packages (or a venv of ours) before the project's."""
    environment = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        environment.pop(name, None)
    environment["PYTHONNOUSERSITE"] = "1"
    environment["PYTHONUNBUFFERED"] = "1"
    return environment


async def _run(command: list[str], what: str) -> None:
    try:
        done = await anyio.run_process(command, check=False, stderr=-2, env=_child_environment())
    except OSError as exc:
        raise LaunchError(f"{what} could not start: {exc}") from exc
    if done.returncode != 0:
        output = done.stdout.decode(errors="replace")[-4000:]
        raise LaunchError(f"{what} failed (exit {done.returncode}):\n{output}")


@contextlib.asynccontextmanager
async def _file_lock(path: Path):  # type: ignore[no-untyped-def]
    """An inter-process lock on ``path`` (other processes may build the same environment)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no locking where there is no fcntl
        yield
        return
    with open(path, "a+") as handle:  # noqa: ASYNC230 - a local lock file
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await anyio.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


_launchers: dict[tuple[Path, str | None], Launcher] = {}
_launchers_lock = threading.Lock()


def launcher(cache_dir: Path = DEFAULT_CACHE_DIR, python: str | None = None) -> Launcher:
    """The process's launcher for a cache directory and a Python (launches are shared through it).

    Args:
        cache_dir: Where project environments are kept.
        python: The Python the environments are made from.

    Returns:
        The one `Launcher` for them.
    """
    key = (Path(cache_dir).expanduser().resolve(), python)
    with _launchers_lock:
        found = _launchers.get(key)
        if found is None:
            found = _launchers[key] = Launcher(cache_dir=key[0], python=python)
        return found

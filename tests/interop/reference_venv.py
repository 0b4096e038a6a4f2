"""Throwaway virtual environments holding the reference OpenEnv releases from PyPI.

Two references: ``openenv==0.10.0`` (upstream's current release, published as
``openenv``) and ``openenv-core==0.3.0`` (the one this project first matched).
Each installs a top-level package named ``openenv``, which clashes with ours, so
each lives in a venv of its own and is only ever run as a subprocess
(``reference_server.py``, ``reference_client.py``, ``probe_reference.py`` and the
other scripts in this folder run under both).

A `PackageVenv` is made, cached and reused the same way from a list of commands: an
environment package from PyPI beside upstream's ``openenv`` or beside ours
(``tests/dropin/test_dipg_safety.py``).

Stdlib only, so the test side can import it without pulling anything in.

    python tests/interop/reference_venv.py                  # build both ahead (the suite builds them on first use)
    python tests/interop/reference_venv.py --only 0.10.0    # one of them
    python tests/interop/reference_venv.py --force          # rebuild from scratch

Location: ``$OPENENV_REFERENCE_VENV`` (0.3.0) or ``$OPENENV_REFERENCE_VENV_0_10``
(0.10.0) if set, else ``~/.cache/openenv-tests/reference-<version>``. A marker
file is written only after a successful install and import check; a venv
without a matching marker is rebuilt.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Reference:
    """One reference release: what to install, and where its venv lives."""

    distribution: str
    version: str
    env_var: str
    size: str  # measured on disk, for the note the test suite prints before building it

    @property
    def requirements(self) -> tuple[str, ...]:
        # uvicorn and websockets are dependencies of both releases already; listed so
        # the venv still has them if a later packaging change drops them.
        return (f"{self.distribution}=={self.version}", "uvicorn", "websockets")

    @property
    def default_dir(self) -> Path:
        return Path.home() / ".cache" / "openenv-tests" / f"reference-{self.version}"

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}"

    @property
    def identity(self) -> dict[str, object]:
        """What the venv's marker must record for the venv to be reused."""
        return {"requirements": list(self.requirements)}

    def install_commands(self, python: Path) -> list[list[str]]:
        """The commands that fill a fresh venv whose interpreter is ``python``."""
        return [[str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *self.requirements]]

    @property
    def check_code(self) -> str:
        """Python run in the venv once it is filled: it fails if the venv is unusable, else prints versions (JSON)."""
        return _CHECK_CODE.replace("{distribution}", self.distribution)


@dataclass(frozen=True)
class PackageVenv:
    """A throwaway venv made by a list of commands: an environment package beside one ``openenv`` or another.

    Built, checked, marked and reused as a `Reference`'s venv is (`ensure_reference_python` takes either).
    Each step is a command whose first word is a program of the venv's ``bin/`` (``python``, ``openenv``,
    ...); ``check`` is Python run in it last, which fails if the venv is unusable and prints a JSON
    object (versions) as its last line. ``distribution`` at ``version`` is installed in it: the cheap
    check made before each reuse. The venv is rebuilt when its steps change, or the contents of a file
    named in ``inputs`` (an editable install's ``pyproject.toml``, whose requirements it installed).
    """

    name: str
    """Its folder under ``~/.cache/openenv-tests``."""
    distribution: str
    version: str
    steps: tuple[tuple[str, ...], ...]
    check: str
    inputs: tuple[Path, ...] = ()
    env_var: str | None = None
    """An environment variable that, when set, says where the venv lives instead."""
    size: str = "unmeasured"

    @property
    def default_dir(self) -> Path:
        return Path.home() / ".cache" / "openenv-tests" / self.name

    @property
    def label(self) -> str:
        return self.name

    @property
    def identity(self) -> dict[str, object]:
        identity: dict[str, object] = {"steps": [list(step) for step in self.steps]}
        if self.inputs:
            identity["inputs"] = {str(path): hashlib.sha256(path.read_bytes()).hexdigest() for path in self.inputs}
        return identity

    def install_commands(self, python: Path) -> list[list[str]]:
        return [[str(python.parent / step[0]), *step[1:]] for step in self.steps]

    @property
    def check_code(self) -> str:
        return self.check


OPENENV_CORE_0_3 = Reference("openenv-core", "0.3.0", "OPENENV_REFERENCE_VENV", "~474 MB")
"""openenv-core 0.3.0: the reference the project first matched, still checked."""
OPENENV_0_10 = Reference("openenv", "0.10.0", "OPENENV_REFERENCE_VENV_0_10", "~478 MB")
"""openenv 0.10.0 (upstream, published as ``openenv`` since 0.3.1): the current reference."""
REFERENCES = (OPENENV_0_10, OPENENV_CORE_0_3)

MARKER_NAME = ".openenv-reference-ok"
MARKER_FORMAT = 1

HERE = Path(__file__).resolve().parent
SERVER_SCRIPT = HERE / "reference_server.py"
CLIENT_SCRIPT = HERE / "reference_client.py"
PROBE_SCRIPT = HERE / "probe_reference.py"

VENV_TIMEOUT_S = 300.0
PIP_TIMEOUT_S = 1200.0  # the reference pulls in gradio, fastmcp, openai, ...
CHECK_TIMEOUT_S = 120.0
LOCK_TIMEOUT_S = PIP_TIMEOUT_S + VENV_TIMEOUT_S + 2 * CHECK_TIMEOUT_S

# Run inside the venv after install: proves the imports we rely on work and
# reports versions for the marker. ``{distribution}`` is the reference's own.
_CHECK_CODE = r"""
import json, sys
from importlib import metadata
import openenv
from openenv.core import GenericEnvClient, create_app
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.mcp_client import MCPToolClient
import uvicorn, websockets
assert openenv.__file__.startswith(sys.prefix), openenv.__file__
print(json.dumps({d: metadata.version(d) for d in
    ("{distribution}", "fastapi", "starlette", "pydantic", "uvicorn", "websockets")}))
"""


class ReferenceVenvError(RuntimeError):
    """The reference venv could not be built or is unusable."""


def venv_dir(cache_dir: Path | None = None, *, reference: Reference | PackageVenv) -> Path:
    """Where a reference venv lives: argument, then its environment variable, then its default."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(reference.env_var) if reference.env_var else None
    if env:
        return Path(env).expanduser()
    return reference.default_dir


def _venv_python(path: Path) -> Path:
    if os.name == "nt":
        return path / "Scripts" / "python.exe"
    return path / "bin" / "python"


def reference_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for subprocesses run with the reference python.

    Drops PYTHONPATH/PYTHONHOME (which could put *our* ``openenv`` on the
    path), disables user site-packages, the web UI of the reference server and
    any HTTP(S) proxy for loopback.
    """
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "ENABLE_WEB_INTERFACE"):
        env.pop(key, None)
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    no_proxy = ",".join(x for x in (env.get("NO_PROXY", ""), "127.0.0.1,localhost") if x)
    env["NO_PROXY"] = env["no_proxy"] = no_proxy
    if extra:
        env.update(extra)
    return env


def _neutral_cwd() -> str:
    # ``python -c`` puts the cwd first on sys.path; from the repo root that
    # would import *our* ``openenv`` instead of the reference's.
    # This folder holds no ``openenv`` package, so it is a safe cwd.
    return str(HERE)


def _run(cmd: Sequence[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            list(cmd),
            cwd=_neutral_cwd(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            env=reference_env({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}),
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.output if isinstance(exc.output, str) else (exc.output or b"").decode("utf-8", "replace")
        raise ReferenceVenvError(f"{what} timed out after {timeout:.0f}s:\n{out[-4000:]}") from None
    if proc.returncode != 0:
        raise ReferenceVenvError(f"{what} failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}")
    return proc


def _expected_marker(reference: Reference | PackageVenv) -> dict[str, object]:
    return {
        "format": MARKER_FORMAT,
        **reference.identity,
        "base_python": ".".join(map(str, sys.version_info[:2])),
    }


def _is_valid(path: Path, reference: Reference | PackageVenv) -> bool:
    marker = path / MARKER_NAME
    python = _venv_python(path)
    if not marker.is_file() or not python.exists():
        return False
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    expected = _expected_marker(reference)
    if any(data.get(k) != v for k, v in expected.items()):
        return False
    # Cheap liveness check (the base interpreter may have gone away).
    try:
        proc = subprocess.run(
            [str(python), "-c", f"from importlib import metadata; print(metadata.version({reference.distribution!r}))"],
            cwd=_neutral_cwd(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=reference_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == reference.version


def _safe_remove(path: Path) -> None:
    """Remove a stale venv, refusing to delete anything that does not look like one."""
    if not path.exists():
        return
    if path.is_dir() and (not any(path.iterdir()) or (path / "pyvenv.cfg").is_file()):
        shutil.rmtree(path)
        return
    raise ReferenceVenvError(
        f"{path} exists but is not a virtual environment; refusing to delete it. "
        "Remove it or point the reference's environment variable elsewhere."
    )


@contextlib.contextmanager
def _build_lock(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Inter-process lock (e.g. pytest-xdist workers) next to the venv dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.parent / f".{path.name}.lock"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: no locking
        yield
        return
    with open(lock_path, "a+") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise ReferenceVenvError(f"timed out waiting for build lock {lock_path}") from None
                time.sleep(0.5)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _build(path: Path, reference: Reference | PackageVenv, log=None) -> None:
    def say(msg: str) -> None:
        if log is not None:
            log(msg)

    _safe_remove(path)
    say(f"creating venv at {path}")
    _run([sys.executable, "-m", "venv", str(path)], VENV_TIMEOUT_S, "python -m venv")
    python = _venv_python(path)
    for command in reference.install_commands(python):
        # A word's first line only: a ``python -c`` step's code shows as its opening line.
        words = [Path(command[0]).name, *command[1:]]
        shown = " ".join(word.strip().splitlines()[0] if word.strip() else word for word in words)
        say(f"{shown} (may take a few minutes)")
        _run(command, PIP_TIMEOUT_S, shown)
    proc = _run([str(python), "-c", reference.check_code], CHECK_TIMEOUT_S, "import check")
    versions = json.loads(proc.stdout.strip().splitlines()[-1])
    marker = dict(_expected_marker(reference), versions=versions, built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    tmp = path / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(tmp, path / MARKER_NAME)
    say(f"ready: {versions}")


def ensure_reference_python(
    cache_dir: Path | None = None, *, reference: Reference | PackageVenv, force: bool = False, log=None
) -> Path:
    """Return the python of a venv with the ``reference`` release (or a `PackageVenv`), building it if needed.

    Reused when its marker file matches; otherwise (missing, half-built, other
    requirements) it is deleted and rebuilt. Raises ReferenceVenvError on
    failure (pip and venv steps are bounded by timeouts).
    """
    path = venv_dir(cache_dir, reference=reference).resolve()
    if not force and _is_valid(path, reference):
        return _venv_python(path)
    commands = len(reference.install_commands(_venv_python(path)))
    with _build_lock(path, LOCK_TIMEOUT_S + (commands - 1) * PIP_TIMEOUT_S):
        if force or not _is_valid(path, reference):  # another process may have built it meanwhile
            _build(path, reference, log=log)
    return _venv_python(path)


def reference_versions(cache_dir: Path | None = None, *, reference: Reference | PackageVenv) -> dict[str, str]:
    """Versions recorded in the marker (the reference's distribution, uvicorn, websockets, ...)."""
    data = json.loads((venv_dir(cache_dir, reference=reference).resolve() / MARKER_NAME).read_text())
    return dict(data.get("versions", {}))


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_process(process: subprocess.Popen[Any], timeout: float = 10.0) -> None:
    """Terminate a server process and wait for it; kill it if it outlives ``timeout`` seconds."""
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


class ReferenceServer:
    """A running ``reference_server.py`` subprocess; use as a context manager.

    ``port=0`` (default) lets the server bind an ephemeral port itself and
    report it on its ``READY <port>`` line, so there is no pick-then-bind race.
    """

    def __init__(
        self,
        python: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        max_sessions: int | None = None,
        startup_timeout: float = 60.0,
        max_lifetime: float = 900.0,
        extra_args: Sequence[str] = (),
        environment: dict[str, str] | None = None,
    ) -> None:
        self.python = Path(python)
        self.host = host
        self.requested_port = port
        self.max_sessions = max_sessions
        self.startup_timeout = startup_timeout
        self.max_lifetime = max_lifetime
        self.extra_args = list(extra_args)
        self.environment = environment
        """More environment variables for the server (``PYTHONPATH`` for an ``--app``'s package)."""
        self.proc: subprocess.Popen[str] | None = None
        self.port: int | None = None
        self.log_tail: collections.deque[str] = collections.deque(maxlen=200)
        """The server's last output lines (stdout and stderr), for diagnostics."""

    @property
    def base_url(self) -> str:
        assert self.port is not None, "server not started"
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        assert self.port is not None, "server not started"
        return f"ws://{self.host}:{self.port}/ws"

    def start(self) -> ReferenceServer:
        cmd = [
            str(self.python),
            str(SERVER_SCRIPT),
            "--host",
            self.host,
            "--port",
            str(self.requested_port),
            "--stdin-watchdog",
            "--max-lifetime",
            str(self.max_lifetime),
        ]
        if self.max_sessions is not None:
            cmd += ["--max-sessions", str(self.max_sessions)]
        cmd += self.extra_args
        self.proc = subprocess.Popen(
            cmd,
            cwd=_neutral_cwd(),
            stdin=subprocess.PIPE,  # closing it (or our death) stops the server
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=reference_env(self.environment),
        )
        self.port = _wait_ready(self.proc, self.startup_timeout)
        # Keep reading both pipes: the reference logs a traceback at every
        # WebSocket close, and a full pipe (64 KiB) would freeze the server.
        for stream in (self.proc.stdout, self.proc.stderr):
            threading.Thread(target=_drain, args=(stream, self.log_tail), daemon=True).start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            stop_process(proc, timeout)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            with contextlib.suppress(Exception):
                stream.close()  # type: ignore[union-attr]

    def __enter__(self) -> ReferenceServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _drain(stream: Any, tail: collections.deque[str]) -> None:
    """Read ``stream`` to its end, keeping its last lines in ``tail``."""
    with contextlib.suppress(Exception):  # the pipe closed under us: done
        for line in stream:
            tail.append(line)


def _wait_ready(proc: subprocess.Popen[str], timeout: float) -> int:
    """Read the server's stdout until ``READY <port>``; bounded by ``timeout``."""
    import selectors

    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = ""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if not sel.select(min(remaining, 0.5)):
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:  # EOF: the server died
                break
            buf += line
            if line.startswith("READY "):
                return int(line.split()[1])
    err = ""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    with contextlib.suppress(Exception):
        err = proc.stderr.read()[-4000:]  # type: ignore[union-attr]
    raise ReferenceVenvError(
        f"reference server not ready within {timeout:.0f}s (exit={proc.returncode}); "
        f"stdout={buf[-2000:]!r}\nstderr:\n{err}"
    )


def run_reference_client(url: str, *args: str, python: Path, timeout: float = 60.0) -> list[dict]:
    """Run ``reference_client.py URL [args]`` with a reference's ``python``; return its JSON lines as dicts."""
    proc = subprocess.run(
        [str(python), str(CLIENT_SCRIPT), url, *args],
        cwd=_neutral_cwd(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=reference_env(),
    )
    if proc.returncode != 0:
        raise ReferenceVenvError(
            f"reference client exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="venv location (needs --only; default: see above)")
    parser.add_argument("--only", choices=[r.version for r in REFERENCES], help="build this reference only")
    parser.add_argument("--force", action="store_true", help="rebuild even if a valid venv exists")
    args = parser.parse_args(argv)
    if args.dir is not None and args.only is None:
        parser.error("--dir is the location of one venv: name which with --only 0.10.0 or --only 0.3.0")
    chosen = [r for r in REFERENCES if args.only in (None, r.version)]
    for reference in chosen:
        try:
            python = ensure_reference_python(
                args.dir if args.only else None,
                reference=reference,
                force=args.force,
                log=lambda m: print(m, file=sys.stderr, flush=True),
            )
        except ReferenceVenvError as exc:
            print(f"error: {reference.label}: {exc}", file=sys.stderr)
            return 1
        print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Throwaway virtual environment holding the reference ``openenv-core==0.3.0``.

The reference distribution installs a top-level package named ``openenv`` (plus
a deprecated ``openenv_core`` shim), which clashes with ours. It therefore lives
in its own venv and is only ever run as a subprocess (``reference_server.py``,
``reference_client.py``, ``probe_reference.py`` in this folder).

Stdlib only, so the test side can import it without pulling anything in.

    python tests/interop/reference_venv.py          # prebuild (CI does this)
    python tests/interop/reference_venv.py --force  # rebuild from scratch

Location: ``$OPENENV_REFERENCE_VENV`` if set, else
``~/.cache/openenv-tests/reference-0.3.0``. A marker file is written only after
a successful install and import check; a venv without a matching marker is
rebuilt.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

REFERENCE_VERSION = "0.3.0"
REQUIREMENTS: tuple[str, ...] = (
    f"openenv-core=={REFERENCE_VERSION}",
    # Both are dependencies of openenv-core 0.3.0 already; listed so the venv
    # still has them if a later packaging change drops them.
    "uvicorn",
    "websockets",
)
ENV_VAR = "OPENENV_REFERENCE_VENV"
DEFAULT_DIR = Path.home() / ".cache" / "openenv-tests" / f"reference-{REFERENCE_VERSION}"
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
# reports versions for the marker.
_CHECK_CODE = r"""
import json, sys
from importlib import metadata
import openenv
from openenv.core import GenericEnvClient, create_app
from openenv.core.env_server.types import Action, Observation, State
import uvicorn, websockets
assert openenv.__file__.startswith(sys.prefix), openenv.__file__
print(json.dumps({d: metadata.version(d) for d in
    ("openenv-core", "fastapi", "starlette", "pydantic", "uvicorn", "websockets")}))
"""


class ReferenceVenvError(RuntimeError):
    """The reference venv could not be built or is unusable."""


def venv_dir(cache_dir: Path | None = None) -> Path:
    """Where the reference venv lives: argument, then $OPENENV_REFERENCE_VENV, then default."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    return DEFAULT_DIR


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


def _expected_marker() -> dict[str, object]:
    return {
        "format": MARKER_FORMAT,
        "requirements": list(REQUIREMENTS),
        "base_python": ".".join(map(str, sys.version_info[:2])),
    }


def _is_valid(path: Path) -> bool:
    marker = path / MARKER_NAME
    python = _venv_python(path)
    if not marker.is_file() or not python.exists():
        return False
    try:
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    expected = _expected_marker()
    if any(data.get(k) != v for k, v in expected.items()):
        return False
    # Cheap liveness check (the base interpreter may have gone away).
    try:
        proc = subprocess.run(
            [str(python), "-c", "from importlib import metadata; print(metadata.version('openenv-core'))"],
            cwd=_neutral_cwd(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            env=reference_env(),
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == REFERENCE_VERSION


def _safe_remove(path: Path) -> None:
    """Remove a stale venv, refusing to delete anything that does not look like one."""
    if not path.exists():
        return
    if path.is_dir() and (not any(path.iterdir()) or (path / "pyvenv.cfg").is_file()):
        shutil.rmtree(path)
        return
    raise ReferenceVenvError(
        f"{path} exists but is not a virtual environment; refusing to delete it. "
        f"Remove it or point {ENV_VAR} elsewhere."
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


def _build(path: Path, log=None) -> None:
    def say(msg: str) -> None:
        if log is not None:
            log(msg)

    _safe_remove(path)
    say(f"creating venv at {path}")
    _run([sys.executable, "-m", "venv", str(path)], VENV_TIMEOUT_S, "python -m venv")
    python = _venv_python(path)
    say(f"pip install {' '.join(REQUIREMENTS)} (may take a few minutes)")
    _run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *REQUIREMENTS],
        PIP_TIMEOUT_S,
        "pip install",
    )
    proc = _run([str(python), "-c", _CHECK_CODE], CHECK_TIMEOUT_S, "import check")
    versions = json.loads(proc.stdout.strip().splitlines()[-1])
    marker = dict(_expected_marker(), versions=versions, built_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    tmp = path / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(tmp, path / MARKER_NAME)
    say(f"ready: {versions}")


def ensure_reference_python(cache_dir: Path | None = None, *, force: bool = False, log=None) -> Path:
    """Return the python of a venv with ``openenv-core==0.3.0``, building it if needed.

    Reused when its marker file matches; otherwise (missing, half-built, other
    requirements) it is deleted and rebuilt. Raises ReferenceVenvError on
    failure (pip and venv steps are bounded by timeouts).
    """
    path = venv_dir(cache_dir).resolve()
    if not force and _is_valid(path):
        return _venv_python(path)
    with _build_lock(path):
        if force or not _is_valid(path):  # another process may have built it meanwhile
            _build(path, log=log)
    return _venv_python(path)


def reference_versions(cache_dir: Path | None = None) -> dict[str, str]:
    """Versions recorded in the marker (openenv-core, uvicorn, websockets, ...)."""
    data = json.loads((venv_dir(cache_dir).resolve() / MARKER_NAME).read_text())
    return dict(data.get("versions", {}))


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind to port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ReferenceServer:
    """A running ``reference_server.py`` subprocess; use as a context manager.

    ``port=0`` (default) lets the server bind an ephemeral port itself and
    report it on its ``READY <port>`` line, so there is no pick-then-bind race.
    """

    def __init__(
        self,
        python: Path | None = None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        max_sessions: int | None = None,
        startup_timeout: float = 60.0,
        max_lifetime: float = 900.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.python = Path(python) if python is not None else ensure_reference_python()
        self.host = host
        self.requested_port = port
        self.max_sessions = max_sessions
        self.startup_timeout = startup_timeout
        self.max_lifetime = max_lifetime
        self.extra_args = list(extra_args)
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
            env=reference_env(),
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
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
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


def run_reference_client(url: str, *args: str, python: Path | None = None, timeout: float = 60.0) -> list[dict]:
    """Run ``reference_client.py URL [args]``; return its JSON lines as dicts."""
    python = Path(python) if python is not None else ensure_reference_python()
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
    parser.add_argument("--dir", type=Path, default=None, help=f"venv location (default ${ENV_VAR} or {DEFAULT_DIR})")
    parser.add_argument("--force", action="store_true", help="rebuild even if a valid venv exists")
    args = parser.parse_args(argv)
    try:
        python = ensure_reference_python(
            args.dir, force=args.force, log=lambda m: print(m, file=sys.stderr, flush=True)
        )
    except ReferenceVenvError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(python)
    return 0


if __name__ == "__main__":
    sys.exit(main())

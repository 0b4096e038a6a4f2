"""Server and client processes for the benchmark scripts: started, awaited, always stopped.

Every server is a process of its own on loopback, in a context manager that
terminates it (then kills it) on the way out, whatever happened; every client
is a subprocess run to completion under a timeout that prints one JSON line.
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks._procfs import cpu_seconds as cpu_seconds  # re-exported: the benchmarks take it from here
from tests.interop.reference_venv import ReferenceServer, reference_env, stop_process

ROOT = Path(__file__).resolve().parents[2]
REFERENCE_CLIENT = ROOT / "tests" / "interop" / "reference_bench_client.py"


@dataclass(frozen=True)
class Server:
    """A running server process: where to reach it and its pid (for its memory)."""

    url: str
    pid: int


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no server on port {port} after {timeout} s")


def _read_ready(process: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    """The port on the server's ``READY <port>`` line, waiting at most ``timeout`` seconds for it."""
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout):
            raise RuntimeError(f"server printed nothing in {timeout} s")
    line = process.stdout.readline().decode()  # a line is there (or EOF): this does not block for long
    if not line.startswith("READY "):
        raise RuntimeError(f"server did not start: {line!r}")
    return int(line.split()[1])


def our_env(tree: Path = ROOT) -> dict[str, str]:
    """The environment for processes run with our python: ``tree`` (this checkout) first on the path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    return env


@contextmanager
def server_process(
    command: Sequence[str], port: int | None, tree: Path = ROOT, environment: dict[str, str] | None = None
) -> Iterator[Server]:
    """Run a server process from ``tree``'s code; its port is ``port``, or read from its ``READY <port>`` line.

    ``environment`` adds variables; its ``PYTHONPATH`` comes after ``tree``.
    """
    env = our_env(tree)
    for name, value in (environment or {}).items():
        env[name] = os.pathsep.join([env[name], value]) if name == "PYTHONPATH" else value
    process = subprocess.Popen(
        command,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )
    try:
        if port is None:
            port = _read_ready(process)
        else:
            _wait_for_port(port, process)
        yield Server(f"http://127.0.0.1:{port}", process.pid)
    finally:
        stop_process(process)
        if process.stdout is not None:
            process.stdout.close()


@contextmanager
def our_server(factory: str, backend: str, *options: str) -> Iterator[Server]:
    """``openenv serve FACTORY`` on ``backend`` (uvicorn for asyncio, hypercorn+websockets for trio)."""
    port = free_port()
    command = [sys.executable, "-m", "transports.cli", "serve", factory, "--port", str(port), "--backend", backend]
    with server_process([*command, "--log-level", "warning", *options], port) as server:
        yield server


@contextmanager
def ws_floor_server() -> Iterator[Server]:
    """The raw ``websockets`` echo server (`tests.benchmarks.ws_floor`)."""
    with server_process([sys.executable, "-m", "tests.benchmarks.ws_floor", "server"], None) as server:
        yield Server(server.url.replace("http://", "ws://", 1), server.pid)


@contextmanager
def protocol_floor_server() -> Iterator[Server]:
    """Raw asyncio Protocols answering pre-built frames (`tests.benchmarks.protocol_floor`)."""
    with server_process([sys.executable, "-m", "tests.benchmarks.protocol_floor", "server"], None) as server:
        yield server


@contextmanager
def http_floor_server(backend: str) -> Iterator[Server]:
    """The bare Starlette route (`tests.benchmarks.http_floor`); the URL is the route's."""
    command = [sys.executable, "-m", "tests.benchmarks.http_floor", "server", "--backend", backend]
    with server_process(command, None) as server:
        yield Server(f"{server.url}/step", server.pid)


@contextmanager
def reference_server(python: Path, *options: str, max_sessions: int = 4) -> Iterator[Server]:
    """A reference echo server (``tests/interop/reference_server.py``) in its own venv: the one ``python`` runs."""
    with ReferenceServer(python, max_sessions=max_sessions, extra_args=options) as server:
        assert server.proc is not None
        yield Server(server.base_url, server.proc.pid)


def run_client(
    command: Sequence[str], *, timeout: float, reference: bool = False, tree: Path = ROOT
) -> dict[str, object]:
    """Run a client process to completion; return the JSON object it printed (alone, or on its last line).

    ``reference`` runs it as the reference's clients must run: its venv's
    environment, from a folder holding no ``openenv`` package. Otherwise it
    runs ``tree``'s code (this checkout, or another one: an earlier commit's).
    """
    env, cwd = (reference_env(), REFERENCE_CLIENT.parent) if reference else (our_env(tree), tree)
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"client failed: {' '.join(command)}\n{done.stderr[-3000:]}")
    try:  # one (maybe indented) JSON document, as openenv bench --json prints
        result: dict[str, object] = json.loads(done.stdout)
    except ValueError:  # or log lines first, then a JSON line
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return result

"""The ``openenv`` command's failures, as a user meets them: one line on stderr, exit status 1 or 2, no traceback.

Each test runs the real command in a subprocess. A missing extra is simulated
the way Python reports one: the module is blocked in ``sys.modules``, so
importing it raises ``ModuleNotFoundError``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from openenv.examples.echo import EchoEnvironment
from transports.cli._errors import listen_error
from transports.server.runner import run

ECHO = "openenv.examples.echo:EchoEnvironment"
_WAIT = 120.0  # generous: a command that has not failed by then is serving, which is the bug


def _openenv(*args: str, without: str | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """Run ``openenv ARGS`` (with module ``without`` not installed); return its exit status and stderr."""
    block = f"sys.modules[{without!r}] = None; " if without else ""
    code = f"import sys; {block}from transports.cli._commands import main; main(prog_name='openenv')"
    try:
        result = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=_WAIT, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"openenv {' '.join(args)} did not fail: it ran on ({exc.stderr!r})")
    return result.returncode, result.stderr


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error: "), stderr
    return lines[0]


@contextmanager
def _port_in_use() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        yield taken.getsockname()[1]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_serve_on_a_port_in_use(backend: str) -> None:
    with _port_in_use() as port:
        status, stderr = _openenv("serve", ECHO, "--port", str(port), "--backend", backend)
    assert status == 1
    line = _one_line(stderr)
    assert f"127.0.0.1:{port}" in line
    assert "the port is in use" in line
    assert "pick another --port" in line


def test_serve_on_an_address_not_of_this_machine() -> None:
    # TEST-NET-1 (RFC 5737): never a local address, and binding to it fails without a packet sent.
    status, stderr = _openenv("serve", ECHO, "--host", "192.0.2.1", "--port", "0")
    assert status == 1
    assert "192.0.2.1 is not an address of this machine; give one of its addresses, or 0.0.0.0" in _one_line(stderr)


def test_what_a_host_that_does_not_resolve_is_told() -> None:
    # Not through the command: resolving a name could leave the machine (tests stay on loopback).
    line = listen_error(socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "no-such-host", 8000)
    assert line.startswith("cannot listen on 'no-such-host': no such host here; give an address such as 127.0.0.1")


def test_serve_with_uvicorn_on_trio() -> None:
    status, stderr = _openenv("serve", ECHO, "--backend", "trio", "--server", "uvicorn")
    assert status == 2
    assert "use --server hypercorn, or --backend asyncio" in _one_line(stderr)


def test_serve_with_hypercorn_and_websockets_on_asyncio() -> None:
    status, stderr = _openenv("serve", ECHO, "--server", "hypercorn+websockets")
    assert status == 2
    assert "runs on trio only: use --backend trio, or --server uvicorn" in _one_line(stderr)


@pytest.mark.parametrize("command", [["serve", ECHO], ["bench", "ws://127.0.0.1:1"]])
def test_commands_without_the_server_extra(command: list[str]) -> None:
    status, stderr = _openenv(*command, without="starlette")
    if command[0] == "bench":  # bench is a client: it needs no server, and fails only to connect
        assert status == 1
        assert "pip install" not in _one_line(stderr)
        return
    assert status == 1
    assert _one_line(stderr) == "Error: starlette is not installed: pip install 'openenv-anyio[server]'"


@pytest.mark.parametrize("library", ["click", "rich"])
def test_the_openenv_script_without_the_cli_extra_says_what_to_install(library: str) -> None:
    # What the installed `openenv` script runs (pyproject.toml's [project.scripts]).
    code = f"import sys; sys.modules[{library!r}] = None; from transports.cli._entry import main; main()"
    result = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=_WAIT)
    assert result.returncode == 1
    assert _one_line(result.stderr) == f"Error: the openenv command needs {library}: pip install 'openenv-anyio[cli]'"


def test_bench_without_rich_says_what_to_install() -> None:
    status, stderr = _openenv("bench", "ws://127.0.0.1:1", without="rich")
    assert status == 1
    assert _one_line(stderr) == "Error: rich is not installed: pip install 'openenv-anyio[cli]'"


def test_demo_without_the_server_extra_runs_what_it_can() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None; "
        "from transports.cli._commands import main; main(prog_name='openenv')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "demo", "--backend", "asyncio"], capture_output=True, text=True, timeout=_WAIT
    )
    assert result.returncode == 0, result.stderr
    skipped = "WebSocket: skipped (no server: starlette is not installed (pip install 'openenv-anyio[server]'))"
    assert skipped in result.stdout
    assert "all good" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "command",
    [["serve", ECHO, "--backend", "trio"], ["demo", "--backend", "trio"], ["bench", "ws://x", "--backend", "trio"]],
)
def test_trio_asked_for_but_not_installed(command: list[str]) -> None:
    status, stderr = _openenv(*command, without="trio")
    assert status == 1
    assert _one_line(stderr) == "Error: trio is not installed: pip install 'openenv-anyio[trio]'"


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        ("openenv.examples.echo:EchoEnv", "EchoEnv is a client class (an EnvClient), not an environment"),
        ("openenv.examples.echo:CallToolAction", "CallToolAction is a message class (an Action"),
        ("openenv.examples.echo:EchoObservation", "EchoObservation is a message class"),
        ("openenv.examples.echo:no_such_name", "has no attribute 'no_such_name'"),
        ("no_such_module_here:Env", "no module named 'no_such_module_here' in "),
        ("no-colon", "is not of the form 'package.module:Factory'"),
    ],
)
def test_serve_refuses_what_is_not_an_environment_factory(factory: str, expected: str) -> None:
    status, stderr = _openenv("serve", factory, "--port", "0")
    assert status == 2
    line = _one_line(stderr)
    assert expected in line
    if factory.startswith("openenv.examples.echo:"):
        assert "openenv.examples.echo:EchoEnvironment" in line  # what to serve instead


def test_serve_a_module_that_raises_on_import(tmp_path: Path) -> None:
    (tmp_path / "broken_env.py").write_text("raise RuntimeError('a bug in the module')\n")
    status, stderr = _openenv("serve", "broken_env:Env", "--port", "0", cwd=tmp_path)
    assert status == 2
    line = _one_line(stderr)
    assert "RuntimeError: a bug in the module" in line
    assert "--debug" in line


def test_debug_shows_the_traceback_too() -> None:
    with _port_in_use() as port:
        status, stderr = _openenv("--debug", "serve", ECHO, "--port", str(port))
    assert status == 1
    assert "Traceback (most recent call last)" in stderr
    assert stderr.strip().splitlines()[-1].startswith("Error: cannot listen on")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve"], "Missing argument 'FACTORY' (openenv serve -h for help)"),
        (["serve", ECHO, "--port", "http"], "Invalid value for '--port'"),
        (["serve", ECHO, "--no-such-flag"], "No such option '--no-such-flag'"),
        (["bench", "ws://x", "--steps", "5", "--seconds", "1"], "give --steps or --seconds, not both"),
        (["no-such-command"], "No such command 'no-such-command'"),
    ],
)
def test_usage_errors_are_one_line_too(args: list[str], expected: str) -> None:
    status, stderr = _openenv(*args)
    assert status == 2
    assert expected in _one_line(stderr)


def test_run_raises_the_os_error_itself() -> None:
    """`transports.server.runner.run` raises what its docstring says, not an exception group around it."""
    with _port_in_use() as port, pytest.raises(OSError, match="in use"):
        run(EchoEnvironment, port=port, log_level="warning")


def test_the_command_line_imports_without_the_server_extra() -> None:
    script = textwrap.dedent(
        """
        import sys
        sys.modules['starlette'] = None
        import openenv, transports.cli
        print('imported')
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=_WAIT)
    assert result.stdout.strip() == "imported", result.stderr

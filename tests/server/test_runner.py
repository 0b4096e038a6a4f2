"""Running the app: the embedded `serve` on both backends, and the ``openenv`` command line."""

from __future__ import annotations

import contextlib
import inspect
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette

import openenv
from openenv.examples.echo import EchoEnvironment
from tests.helpers import ManualClock, free_port
from tests.server.test_server_app import RawWebSocket, WebSocketClosed
from transports.cli._commands import main
from transports.server import runner
from transports.server.app import create_app
from transports.server.runner import ServerName, current_backend, serve

LIMIT = 10  # seconds: the bound of every wait in the async tests
CLI = [sys.executable, "-m", "transports.cli"]


# -- embedded --------------------------------------------------------------------


@pytest.mark.anyio
async def test_current_backend(anyio_backend: str) -> None:
    assert current_backend() == anyio_backend


def test_current_backend_outside_a_loop() -> None:
    with pytest.raises(RuntimeError, match="no async event loop"):
        current_backend()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_serve_starts_on_a_free_port_and_stops(anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serve(EchoEnvironment) as server:
            assert server.host == "127.0.0.1"
            assert server.port > 0
            assert server.url == f"http://127.0.0.1:{server.port}"
            assert server.ws_url == f"ws://127.0.0.1:{server.port}/ws"
            assert server.server == ("uvicorn" if anyio_backend == "asyncio" else "hypercorn+websockets")
            async with httpx.AsyncClient() as client:
                response = await client.get(f"{server.url}/health")
            assert response.json() == {"status": "healthy"}
        # Stopped: the port no longer accepts.
        with pytest.raises(OSError, match=r"(?i)refused|connection attempts failed"):
            await anyio.connect_tcp("127.0.0.1", server.port)


@pytest.mark.anyio
async def test_hypercorn_on_asyncio_too() -> None:
    with anyio.fail_after(LIMIT):
        async with serve(create_app(EchoEnvironment), server="hypercorn") as server:
            assert server.server == "hypercorn"
            async with RawWebSocket.connect(server.ws_url) as ws:
                assert (await ws.request('{"type":"reset"}'))["type"] == "observation"
                await ws.close()


@pytest.mark.anyio
async def test_bad_server_choices(anyio_backend: str) -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(ValueError, match="unknown server"):
            async with serve(EchoEnvironment, server="gunicorn"):  # type: ignore[arg-type]
                pass
        if anyio_backend == "trio":
            with pytest.raises(RuntimeError, match="asyncio only"):
                async with serve(EchoEnvironment, server="uvicorn"):
                    pass
        else:
            with pytest.raises(RuntimeError, match="trio only"):
                async with serve(EchoEnvironment, server="hypercorn+websockets"):
                    pass
        with pytest.raises(ValueError, match="create_app"):
            async with serve(create_app(EchoEnvironment), max_sessions=2):
                pass


@pytest.mark.anyio
async def test_the_body_exception_comes_out_as_itself() -> None:
    with anyio.fail_after(LIMIT), pytest.raises(KeyError, match="mine"):
        async with serve(EchoEnvironment):
            raise KeyError("mine")


@asynccontextmanager
async def failing_lifespan(app: Starlette) -> AsyncIterator[None]:
    raise ValueError("no database")
    yield  # pragma: no cover


@pytest.mark.anyio
@pytest.mark.parametrize("server", ["uvicorn", "hypercorn"])
async def test_an_app_that_fails_to_start(anyio_backend: str, server: ServerName) -> None:
    if server == "uvicorn" and anyio_backend == "trio":
        # uvicorn runs on asyncio only: asking for it under trio is refused before anything starts.
        with anyio.fail_after(LIMIT), pytest.raises(RuntimeError, match="asyncio"):
            async with serve(Starlette(lifespan=failing_lifespan), server=server):
                pytest.fail("the block must not run")
        return
    with anyio.fail_after(LIMIT), pytest.raises(RuntimeError, match="failed to start: ValueError: no database"):
        async with serve(Starlette(lifespan=failing_lifespan), server=server):
            pytest.fail("the block must not run")


@pytest.mark.anyio
async def test_a_server_cut_short_after_its_shutdown_grace_is_no_failure_of_the_block(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that outlives its grace is cancelled; what its teardown raises then is logged, not raised."""

    async def stubborn(*args: object, task_status: anyio.abc.TaskStatus[None], **kwargs: object) -> None:
        task_status.started()
        try:
            await anyio.sleep_forever()  # deaf to the stop
        finally:
            raise RuntimeError("InvalidStateError in its teardown")  # as hypercorn's worker_serve, cancelled

    monkeypatch.setitem(runner._DRIVERS, "hypercorn", stubborn)
    with anyio.fail_after(LIMIT):
        async with serve(EchoEnvironment, server="hypercorn", shutdown_timeout=0.1) as server:
            assert server.server == "hypercorn"
    assert "the hypercorn server failed as it was cut short after its shutdown grace" in caplog.text
    assert "InvalidStateError in its teardown" in caplog.text


@pytest.mark.anyio
async def test_a_busy_port_is_an_os_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with anyio.fail_after(LIMIT), pytest.raises(OSError, match=r"(?i)in use"):
            async with serve(EchoEnvironment, port=taken.getsockname()[1]):
                pass


@pytest.mark.anyio
async def test_stopping_ends_open_sessions_politely() -> None:
    closed = anyio.Event()
    codes: list[tuple[int | None, str]] = []

    async def hold_session(url: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with RawWebSocket.connect(url) as ws:
            await ws.request('{"type":"reset"}')
            task_status.started()
            try:
                await ws.receive()
            except WebSocketClosed as exc:
                codes.append((exc.code, exc.reason))
            closed.set()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            # A grace period longer than the test's bound: the session must be asked to end at once.
            async with serve(EchoEnvironment, shutdown_timeout=10 * LIMIT) as server:
                await task_group.start(hold_session, server.ws_url)
            await closed.wait()
    assert codes == [(1001, "server shutting down")]


class EndlessStepEnv(openenv.Environment):  # type: ignore[type-arg]
    """A step that never ends by itself: it outlives any shutdown grace."""

    stepping: anyio.Event

    async def reset(self, **kwargs: object) -> dict[str, str]:
        return {}

    async def step(self, action: object) -> dict[str, str]:
        type(self).stepping.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    def state(self) -> dict[str, str]:
        return {}


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_a_step_outliving_the_shutdown_grace_is_ended_with_the_reason(
    scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    EndlessStepEnv.stepping = anyio.Event()
    errors: list[BaseException] = []

    async def step_forever(client: openenv.EnvClient[object, object, object]) -> None:
        try:
            await client.step({})
        except openenv.OpenEnvError as exc:
            errors.append(exc)
        finally:
            await client.aclose()

    clock = ManualClock()  # the app's: the shutdown's grace runs out when the test says
    with anyio.fail_after(LIMIT), caplog.at_level("WARNING"):
        # The server stops first (the block's end), then the task group waits for the client's step.
        async with (
            anyio.create_task_group() as task_group,
            serve(create_app(EndlessStepEnv, clock=clock), shutdown_timeout=1.0) as server,
        ):
            client: openenv.EnvClient[object, object, object] = openenv.EnvClient(
                server.url.replace("http", scheme, 1), timeout=None
            )
            await client.connect()  # closed from another task: no owner block
            task_group.start_soon(step_forever, client)
            await EndlessStepEnv.stepping.wait()
            # Runs once the block has ended and the shutdown waits out its grace for the busy session.
            task_group.start_soon(clock.advance_when_blocked, 1.0)
    assert len(errors) == 1
    assert isinstance(errors[0], openenv.ConnectionClosed)
    assert "server shutting down" in str(errors[0])  # WebSocket close 1001, or HTTP 410: not a 500
    assert "still busy after the 1 s shutdown grace" in caplog.text
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
    assert "Traceback" not in caplog.text


@pytest.mark.anyio
async def test_openenv_serve_delegates_to_the_runner() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve("openenv.examples.echo:EchoEnvironment", port=0) as server,
            httpx.AsyncClient() as client,
        ):
            assert (await client.get(f"{server.url}/metadata")).json()["name"] == "EchoEnvironment"


# -- the command line -------------------------------------------------------------


@contextlib.contextmanager
def running(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def wait_for_health(url: str, process: subprocess.Popen[str], timeout: float = 30.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, f"the server exited: {process.communicate()}"
        try:
            return httpx.get(f"{url}/health", timeout=1.0)
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_openenv_serve_command(backend: str) -> None:
    port = free_port()
    args = [*CLI, "serve", "openenv.examples.echo:EchoEnvironment", "--port", str(port), "--backend", backend]
    options = [
        "--max-sessions",
        "4",
        "--http-idle-timeout",
        "30",
        "--max-message-size",
        "65536",
        "--log-level",
        "warning",
        "--metrics",
    ]
    with running([*args, *options]) as process:
        response = wait_for_health(f"http://127.0.0.1:{port}", process)
        assert response.json() == {"status": "healthy"}
        assert "openenv_sessions_open" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert httpx.get(f"http://127.0.0.1:{port}/metadata", timeout=5).json()["name"] == "EchoEnvironment"
        # HTTP long-polling is served beside WebSocket.
        created = httpx.post(f"http://127.0.0.1:{port}/poll/sessions", timeout=5)
        assert created.status_code == 201
        session = f"http://127.0.0.1:{port}/poll/sessions/{created.json()['session_id']}"
        key = {"OpenEnv-Session-Key": created.json()["session_key"]}
        # --max-message-size bounds HTTP request frames too.
        oversize = httpx.post(
            f"{session}/frames",
            content=b'{"type":"step","id":1,"data":{"pad":"' + b"x" * 70_000 + b'"}}',
            headers={
                "Content-Type": "application/json",
                "OpenEnv-Seq": "1",
                "OpenEnv-Ack": "0",
                "OpenEnv-Wait": "0",
                **key,
            },
            timeout=5,
        )
        assert oversize.status_code == 413
        assert httpx.delete(session, headers=key, timeout=5).status_code == 204
        # Ctrl-C: a graceful shutdown, and a clean exit.
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=15)
        assert process.returncode == 0, stderr
        assert f"on http://127.0.0.1:{port}" in stderr
        # The URLs a client takes, as printed: EnvClient appends /ws itself.
        assert f"clients connect to ws://127.0.0.1:{port} (WebSocket) or http+poll://127.0.0.1:{port}" in stderr


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_each_server_line_is_printed_once_when_the_environment_logs_through_the_root_logger(
    backend: str, tmp_path: Path
) -> None:
    (tmp_path / "rooted.py").write_text(
        "import logging\n"
        "from openenv.examples.echo import EchoEnvironment\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "class Env(EchoEnvironment):\n"
        "    pass\n"
    )
    port = free_port()
    args = [*CLI, "serve", "rooted:Env", "--port", str(port), "--backend", backend, "--app-dir", str(tmp_path)]
    with running(args) as process:
        wait_for_health(f"http://127.0.0.1:{port}", process)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert sum("SIGINT received" in line for line in lines) == 1, stderr
    assert sum("Running on" in line or "Started server process" in line for line in lines) == 1, stderr


def test_openenv_demo_command() -> None:
    result = subprocess.run([*CLI, "demo"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "== asyncio ==" in result.stdout
    assert "== trio ==" in result.stdout
    assert "all good" in result.stdout
    assert "FAILED" not in result.stdout
    assert result.stdout.count("HTTP long-polling http+poll://") == 3  # async on each backend, blocking once


def test_version_and_help() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0
    assert openenv.__version__ in result.output
    result = runner.invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "serve" in result.output
    assert "demo" in result.output
    for command in ("serve", "demo", "bench"):  # plain text: no reStructuredText markup in a terminal
        help_text = runner.invoke(main, [command, "--help"]).output
        assert "``" not in help_text, help_text
    assert "EVENT_LOOP_CLOCK" in str(inspect.signature(openenv.EnvClient))  # help(EnvClient): no object address


def test_serve_rejects_a_bad_factory(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "no_such_module_here:Env", "--app-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "FACTORY" in result.output
    # Where it was looked for, and what to do: the folder that holds it, or --app-dir.
    assert f"no module named 'no_such_module_here' in {tmp_path}" in result.output
    assert "--app-dir" in result.output
    (tmp_path / "needs_a_dependency.py").write_text("import no_such_dependency_here\n")
    result = CliRunner().invoke(main, ["serve", "needs_a_dependency:Env", "--app-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "importing needs_a_dependency failed: No module named 'no_such_dependency_here'; pip install" in (
        result.output
    )

"""A soak of faults against one server: it must end where it began, and its good sessions must never notice.

Bounded in time and loopback only. Each round mixes what the probe of issue 13
threw at a server: abrupt disconnects mid-step, garbage and oversize frames,
malformed JSON, slow headers, refusals at capacity. Afterwards the server holds
no session slot, has closed every environment it built, and holds no more file
descriptors than before; a well-behaved session ran through it all.
A server frozen mid-step (SIGSTOP) is noticed by the client's keepalive, and a
server that fails ends its process (hypercorn on trio, without the runner's fix
for it, as the failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

import openenv
from tests.helpers import free_port, wait_for_port
from tests.test_hostile_clients import (
    MessageEnv,
    RawWebSocket,
    ServerName,
    registry_of,
    serving,
    wait_until,
)

# The fixtures that run each test on each server: uvicorn and hypercorn on asyncio, hypercorn on trio.
from tests.test_hostile_clients import anyio_backend as anyio_backend
from tests.test_hostile_clients import backend_and_server as backend_and_server
from tests.test_hostile_clients import server_name as server_name
from tests.test_server_app import MessageAction, WireEchoEnv

pytestmark = pytest.mark.anyio

LIMIT = 120
ROUNDS = 10
ROOT = Path(__file__).resolve().parents[1]


class TrackedEnv(WireEchoEnv):
    """The echo environment, counting those built and closed."""

    built: ClassVar[int] = 0
    closed_count: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        TrackedEnv.built += 1

    async def close(self) -> None:
        TrackedEnv.closed_count += 1


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _abrupt(url: str) -> None:
    """Starts a slow step, then drops the connection without a closing handshake."""
    async with RawWebSocket.connect(url) as ws:
        await ws.send_text('{"type":"step","data":{"message":"slow","delay":1}}')


async def _garbage(server: Any) -> None:
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(b"\x00\xff" * 256)
        with anyio.move_on_after(2):
            try:
                while await stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass


async def _malformed(url: str) -> None:
    async with RawWebSocket.connect(url) as ws:
        for frame in ('{"type":', '{"type":"step","data":{"message":1e999}}', "[" * 3000 + "]" * 3000):
            await ws.send_text(frame)
            assert (await ws.receive_json())["type"] == "error"
        await ws.close()


async def _oversize(url: str) -> None:
    async with RawWebSocket.connect(url) as ws:
        await ws.send_text('{"type":"step","data":{"message":"' + "x" * 300_000 + '"}}')
        await ws.expect_close()


async def _half_request(server: Any) -> None:
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(b"GET /ws HTTP/1.1\r\nHost: x\r\n")
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass


@pytest.fixture(autouse=True)
def _count_from_zero() -> None:
    TrackedEnv.built = TrackedEnv.closed_count = 0


async def test_a_soak_of_faults_leaves_the_server_as_it_was(server_name: ServerName) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(
            server_name, TrackedEnv, max_sessions=64, max_message_size=256 * 1024, header_timeout=0.5
        ) as server:
            url = server.ws_url
            async with MessageEnv(server.url) as good:
                await good.reset()
                baseline_fds = _open_fds()
                for round_number in range(ROUNDS):
                    async with anyio.create_task_group() as task_group:
                        for _ in range(4):
                            task_group.start_soon(_abrupt, url)
                        task_group.start_soon(_garbage, server)
                        task_group.start_soon(_malformed, url)
                        task_group.start_soon(_oversize, url)
                        task_group.start_soon(_half_request, server)
                    step = await good.step(MessageAction(message=f"round {round_number}"))
                    assert step.observation.echoed_message == f"round {round_number}"
                # Every abandoned session ends (its slow step is cut), and gives back all it held.
                await wait_until(lambda: registry_of(server).active == 1, "only the good session is left")
                await wait_until(lambda: TrackedEnv.closed_count == TrackedEnv.built - 1, "every environment closed")
                await wait_until(lambda: _open_fds() <= baseline_fds, "no file descriptor kept")
                assert (await good.state()).step_count == ROUNDS


async def test_a_server_frozen_mid_step_is_noticed_by_the_keepalive(
    anyio_backend: str,
    server_name: ServerName,
) -> None:
    port = free_port()
    command = [
        sys.executable, "-m", "transports.cli", "serve", "tests.envs:AsyncMessageEchoEnv",
        "--port", str(port), "--backend", anyio_backend, "--server", server_name, "--log-level", "warning",
    ]  # fmt: skip
    process = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block; waits below are bounded
        command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.DEVNULL
    )
    try:
        with anyio.fail_after(LIMIT):
            await wait_for_port(port)
            async with openenv.EnvClient(f"ws://127.0.0.1:{port}", ping_interval=0.2, ping_timeout=0.5) as env:
                assert (await env.step({"message": "alive"})).reward == 5.0

                async def freeze_mid_step() -> None:
                    await anyio.wait_all_tasks_blocked()  # the step has gone out; the client waits for its reply
                    process.send_signal(signal.SIGSTOP)

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(freeze_mid_step)
                    with pytest.raises(openenv.ConnectionClosed):
                        await env.step({"message": "sleep:60"})
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)


_UNMENDED_TRIO_SERVER = """
import sys
import transports._hypercorn_driver as driver
import transports.runner as runner
from tests.test_server_app import WireEchoEnv

driver.mend_trio_closing = lambda: None  # hypercorn as it is: it dies on these refusals
runner.run(WireEchoEnv, port=int(sys.argv[1]), backend="trio", server="hypercorn", max_sessions=1, log_level="critical")
"""


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_server_that_fails_ends_its_process(anyio_backend: str) -> None:
    """A server that stops serving must not leave a live process behind, which no supervisor would restart."""
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 - starting it does not block; waits below are bounded
        [sys.executable, "-c", _UNMENDED_TRIO_SERVER, str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        with anyio.fail_after(LIMIT):
            url = f"ws://127.0.0.1:{port}/ws"
            await wait_for_port(port)
            async with RawWebSocket.connect(url) as holder:
                await holder.request('{"type":"reset"}')
                while process.poll() is None:
                    async with anyio.create_task_group() as task_group:
                        for manner in range(12):
                            task_group.start_soon(_refused_quietly, url, manner % 3)
    finally:
        if process.poll() is None:
            process.kill()
        _, errors = process.communicate(timeout=10)
    assert process.returncode not in (0, -signal.SIGKILL)  # it ended by itself, with a failure
    assert b"the hypercorn server failed" in errors


async def _refused_quietly(url: str, manner: int) -> None:
    try:
        async with RawWebSocket.connect(url) as ws:
            await ws.receive_json()
            if manner == 0:
                await ws.close()
            elif manner == 1:
                await ws.send_text('{"type":"reset"}')
                await ws.close()
    except Exception:
        pass

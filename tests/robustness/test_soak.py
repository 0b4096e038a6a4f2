"""A soak of faults against one server: it must end where it began, and its good sessions must never notice.

Bounded in time and loopback only. Each round mixes what the probes of issues
13 and 23 threw at a server: abrupt disconnects mid-step, garbage and oversize
frames, malformed JSON, slow headers, refusals at capacity, HTTP sessions that
never acknowledge their replies and vanish, request bodies that never come,
compressed frames. Afterwards the server holds no session slot, has closed
every environment it built, holds no more file descriptors than before, and
its memory (RSS) is back near where it was; a well-behaved session ran
through it all.
A server frozen mid-step (SIGSTOP) is noticed by the client's keepalive, and a
server that fails ends its process (hypercorn on trio, without the runner's fix
for it, as the failure).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import anyio
import httpx
import pytest

import openenv
from tests.helpers import ManualClock, all_tasks_blocked, free_port, wait_for_port
from tests.robustness.test_hostile_clients import (
    MessageEnv,
    RawWebSocket,
    ServerName,
    _poll_session,
    registry_of,
    serving,
    wait_until,
)

# The fixtures that run each test on each server: uvicorn and hypercorn on asyncio, hypercorn on trio.
from tests.robustness.test_hostile_clients import anyio_backend as anyio_backend
from tests.robustness.test_hostile_clients import backend_and_server as backend_and_server
from tests.robustness.test_hostile_clients import server_name as server_name
from tests.robustness.test_hostile_networks import _compressed_frame, _handshake
from tests.server.test_server_app import MessageAction, WireEchoEnv
from transports.server.app import create_app

pytestmark = pytest.mark.anyio

LIMIT = 120
ROUNDS = 10
ROOT = Path(__file__).resolve().parents[2]


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


_STEP = b'{"type":"step","id":%d,"data":{"message":"' + b"z" * 200_000 + b'"}}'


async def _unacknowledged(server: Any) -> None:
    """An HTTP session that steps with large frames, never acknowledges a reply, and vanishes."""
    async with httpx.AsyncClient(timeout=LIMIT) as http:
        session = await _poll_session(http, server)
        for seq in range(1, 5):
            await session.post(seq, _STEP % seq)


async def _body_never_sent(server: Any) -> None:
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(b"POST /reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n{")
        try:
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass


async def _compressed(server: Any) -> None:
    """Offers permessage-deflate, then sends 16 MiB of zeros deflated (which hypercorn inflated whole)."""
    async with await anyio.connect_tcp(server.host, server.port) as stream:
        await stream.send(_handshake(server, extra=("Sec-WebSocket-Extensions: permessage-deflate",)).encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += await stream.receive()
        try:
            await stream.send(_compressed_frame(16 * 1024 * 1024))
            while await stream.receive():
                pass
        except (anyio.EndOfStream, anyio.BrokenResourceError):
            pass


def _rss_in_use() -> float:
    """The process's resident memory in MiB, once the allocator has handed back what it holds free.

    glibc keeps memory freed after a burst of large messages (about 30 MiB here)
    for the next allocations; that is not the server's, so it is returned first
    (malloc_trim), where the C library can.
    """
    gc.collect()
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


_LIBC_NAME = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_LIBC_NAME) if _LIBC_NAME else None

# MiB the soak may leave resident beyond the baseline (about 1 MiB after ten rounds moving some 70 MiB).
RSS_MARGIN = 10.0


@pytest.fixture(autouse=True)
def _count_from_zero() -> None:
    TrackedEnv.built = TrackedEnv.closed_count = 0


async def test_a_soak_of_faults_leaves_the_server_as_it_was(server_name: ServerName) -> None:
    app = create_app(TrackedEnv, max_sessions=64, max_message_size=256 * 1024, http_idle_timeout=0.5, body_timeout=0.5)
    with anyio.fail_after(LIMIT):
        async with serving(server_name, app, header_timeout=0.5) as server:
            server.app.state.http_polling.linger = 0.5  # ended sessions' unfetched replies go soon
            url = server.ws_url

            async def one_round() -> None:
                async with anyio.create_task_group() as task_group:
                    for _ in range(4):
                        task_group.start_soon(_abrupt, url)
                        task_group.start_soon(_unacknowledged, server)
                    task_group.start_soon(_garbage, server)
                    task_group.start_soon(_malformed, url)
                    task_group.start_soon(_oversize, url)
                    task_group.start_soon(_half_request, server)
                    task_group.start_soon(_body_never_sent, server)
                    task_group.start_soon(_compressed, server)

            async def all_over() -> None:
                # Every abandoned session ends (its slow step is cut), and gives back all it held.
                await wait_until(lambda: registry_of(server).active == 1, "only the good session is left")
                await wait_until(lambda: server.app.state.http_polling.session_count == 0, "HTTP sessions forgotten")
                await wait_until(lambda: TrackedEnv.closed_count == TrackedEnv.built - 1, "every environment closed")

            async with MessageEnv(server.url) as good:
                await good.reset()
                await one_round()  # the first of everything (imports, caches) is not the soak's
                await all_over()
                baseline_fds = _open_fds()
                baseline_rss = _rss_in_use()
                for round_number in range(ROUNDS):
                    await one_round()
                    step = await good.step(MessageAction(message=f"round {round_number}"))
                    assert step.observation.echoed_message == f"round {round_number}"
                await all_over()
                await wait_until(lambda: _open_fds() <= baseline_fds, "no file descriptor kept")
                assert _rss_in_use() <= baseline_rss + RSS_MARGIN, "memory kept"
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
            # The keepalive, and the resumption it starts, on the client's clock: no ping is missed
            # before the freeze on a loaded machine, and the resumption's 30 s pass at once after it.
            # No reply timeout: only the keepalive can end the step.
            clock = ManualClock()
            async with openenv.EnvClient(
                f"ws://127.0.0.1:{port}", ping_interval=10, ping_timeout=20, timeout=None, clock=clock
            ) as env:
                assert (await env.step({"message": "alive"})).reward == 5.0

                async def freeze_mid_step() -> None:
                    await all_tasks_blocked()  # the step has gone out; the client waits for its reply
                    process.send_signal(signal.SIGSTOP)
                    await clock.keep_advancing(5)

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(freeze_mid_step)
                    with pytest.raises(openenv.ConnectionClosed, match="keepalive"):
                        await env.step({"message": "sleep:60"})
                    task_group.cancel_scope.cancel()
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)


_UNMENDED_TRIO_SERVER = """
import sys
import transports.server.drivers._hypercorn as driver
import transports.server.runner as runner
from tests.server.test_server_app import WireEchoEnv

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

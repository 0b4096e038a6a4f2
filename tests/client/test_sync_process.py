"""The blocking facade in a real process: Ctrl-C (a real SIGINT) interrupts it, and it never keeps a process alive.

Each test runs a small script in a subprocess, as a user would, over WebSocket and
HTTP long-polling, with the facade on asyncio and on trio. The servers run in
this process (under the test's own backend); a silent one is a listening socket
that accepts connections and never answers.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import anyio
import pytest

import openenv
from tests.envs import AsyncCounterEnv, CountAction, CountObservation
from tests.serving import factory_path

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT")

SCHEMES = ["ws", "http+poll"]
SYNC_BACKENDS = ["asyncio", "trio"]

# Generous: a process that is not done by then is hung, which is the bug.
_PROCESS_WAIT = 60.0

_CONNECT_THEN_WAIT = """
import sys
from openenv import EnvClient
url, backend = sys.argv[1:3]
env = EnvClient(url, connect_timeout=None).sync(backend=backend)
print("connecting", flush=True)
try:
    env.connect()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    raise
print("connected, unexpectedly", flush=True)
"""

_STEP_THEN_WAIT = """
import sys
from openenv import EnvClient
url, backend = sys.argv[1:3]
with EnvClient(url).sync(backend=backend) as env:
    env.reset()
    print("stepping", flush=True)
    try:
        env.step({}, timeout=None)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
print("closed", flush=True)
"""

# The step by 0 waits on the server until the test releases it; Ctrl-C lands meanwhile.
_STEP_INTERRUPTED_THEN_ANOTHER = """
import sys
from openenv import EnvClient
url, backend = sys.argv[1:3]
with EnvClient(url).sync(backend=backend) as env:
    env.reset()
    print("stepping", flush=True)
    try:
        env.step({"by": 0}, timeout=None)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    print(env.step({"by": 2}).observation["count"], flush=True)
print("closed", flush=True)
"""

_FORK_WITH_A_CLIENT = """
import os, sys
from openenv import ClientStateError, EnvClient
url, backend = sys.argv[1:3]
with EnvClient(url).sync(backend=backend) as env:
    env.step({"by": 1})
    pid = os.fork()
    if pid == 0:  # the child: the parent's client is not its own
        try:
            env.step({"by": 1})
        except ClientStateError as exc:
            print("child:", exc, flush=True)
            sys.exit(0)  # leaving the block closes nothing of the parent's
        sys.exit(1)
    _, status = os.waitpid(pid, 0)
    print("child exited", os.waitstatus_to_exitcode(status), flush=True)
    print("parent", env.step({"by": 1}).observation["count"], flush=True)
"""

_LEAVE_OPEN = """
import sys
from openenv import EnvClient
url, backend = sys.argv[1:3]
env = EnvClient(url).sync(backend=backend).connect()
env.reset()
print("done, client left open", flush=True)
"""

# The user's steps: a third client meets a full server, the error is caught, the client never closed.
_CAPACITY_CAUGHT_THEN_WAIT = """
import sys, time
import openenv
from openenv import EnvClient
url, backend = sys.argv[1:3]
first = EnvClient(url).sync(backend=backend).connect()
first.reset()
second = EnvClient(url).sync(backend=backend).connect()
try:
    second.reset()
except openenv.CapacityReachedError:
    print("capacity reached", flush=True)
while True:  # a user's loop; naps, as a Ctrl-C landing just before one long wait begins is seen only when it ends
    time.sleep(0.1)
"""


class _StepsUntilReleased(AsyncCounterEnv):
    """Its step sets `stepping`, then waits for `released` (the client has given up by then)."""

    stepping: ClassVar[anyio.Event]
    released: ClassVar[anyio.Event]

    async def step(self, action: CountAction) -> CountObservation:
        type(self).stepping.set()
        await type(self).released.wait()
        return await super().step(action)


class _WaitsOnStepByZero(AsyncCounterEnv):
    """A step by 0 sets `stepping`, then waits for `released`; the others count at once."""

    stepping: ClassVar[anyio.Event]
    released: ClassVar[anyio.Event]

    async def step(self, action: CountAction) -> CountObservation:
        if action.by == 0:
            type(self).stepping.set()
            await type(self).released.wait()
        return await super().step(action)


def _start(script: str, url: str, backend: str) -> subprocess.Popen[str]:
    # faulthandler: a hung process shows where each of its threads is (see `_finish`).
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        [sys.executable, "-W", "always::ResourceWarning", "-c", textwrap.dedent(script), url, backend],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        stdout, stderr = process.communicate(timeout=_PROCESS_WAIT)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack to stderr
        try:
            stdout, stderr = process.communicate(timeout=_PROCESS_WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        pytest.fail(f"the process hung; its output, then its threads' stacks:\n{stdout}\n{stderr}")
    return process.returncode, stdout, stderr


def _read_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    # A byte at a time, from the pipe itself: what follows the line stays there for `_finish`, whose
    # `communicate` reads the pipe, not the buffer a `readline` would have filled with the lines after it.
    fd, line = process.stdout.fileno(), bytearray()
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:  # the process died early: show why
            pytest.fail(f"the process ended early:\n{_finish(process)}")
        line += byte
    return line.decode().strip()


@contextmanager
def _silent_server() -> Iterator[tuple[socket.socket, int]]:
    """A listening socket that accepts connections and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(_PROCESS_WAIT)
        yield listener, listener.getsockname()[1]


@pytest.mark.parametrize("backend", SYNC_BACKENDS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_ctrl_c_while_connecting_interrupts_at_once(scheme: str, backend: str) -> None:
    with _silent_server() as (listener, port):
        process = _start(_CONNECT_THEN_WAIT, f"{scheme}://127.0.0.1:{port}", backend)
        assert _read_line(process) == "connecting"
        connection, _ = listener.accept()  # the client is now waiting for an answer
        with connection:
            process.send_signal(signal.SIGINT)
            returncode, stdout, stderr = _finish(process)
    assert stdout.strip() == "interrupted", stderr
    assert "KeyboardInterrupt" in stderr
    assert returncode != 0


@pytest.mark.anyio
@pytest.mark.parametrize("backend", SYNC_BACKENDS)
@pytest.mark.parametrize("scheme", SCHEMES)
async def test_ctrl_c_during_a_step_interrupts_it_and_the_client_closes(scheme: str, backend: str) -> None:
    _StepsUntilReleased.stepping, _StepsUntilReleased.released = anyio.Event(), anyio.Event()
    async with openenv.serve(_StepsUntilReleased) as server:
        url = server.url.replace("http://", f"{scheme}://", 1)
        process = _start(_STEP_THEN_WAIT, url, backend)
        try:
            assert await anyio.to_thread.run_sync(_read_line, process) == "stepping"
            with anyio.fail_after(_PROCESS_WAIT):
                await _StepsUntilReleased.stepping.wait()  # the client is now waiting for the reply
            process.send_signal(signal.SIGINT)
            assert await anyio.to_thread.run_sync(_read_line, process) == "interrupted"
            _StepsUntilReleased.released.set()  # a late reply, for the closing client to drop
            returncode, stdout, stderr = await anyio.to_thread.run_sync(_finish, process)
        finally:
            if process.poll() is None:
                process.kill()
    assert stdout.split() == ["closed"], stderr
    assert returncode == 0, stderr


@pytest.mark.anyio
@pytest.mark.parametrize("backend", SYNC_BACKENDS)
@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_client_left_open_lets_the_process_exit_and_warns(scheme: str, backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv)) as server:
        url = server.url.replace("http://", f"{scheme}://", 1)
        process = _start(_LEAVE_OPEN, url, backend)
        returncode, stdout, stderr = await anyio.to_thread.run_sync(_finish, process)
    assert returncode == 0, stderr
    assert stdout.strip() == "done, client left open"
    assert "ResourceWarning: unclosed <SyncEnvClient" in stderr


@pytest.mark.anyio
@pytest.mark.parametrize("backend", SYNC_BACKENDS)
@pytest.mark.parametrize("scheme", SCHEMES)
async def test_ctrl_c_ends_a_process_holding_a_client_refused_for_capacity(scheme: str, backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv), max_sessions=1) as server:
        url = server.url.replace("http://", f"{scheme}://", 1)
        process = _start(_CAPACITY_CAUGHT_THEN_WAIT, url, backend)
        try:
            assert await anyio.to_thread.run_sync(_read_line, process) == "capacity reached"
            process.send_signal(signal.SIGINT)
            returncode, _, stderr = await anyio.to_thread.run_sync(_finish, process)
        finally:
            if process.poll() is None:
                process.kill()
    assert "KeyboardInterrupt" in stderr
    assert "ResourceWarning: unclosed <SyncEnvClient" in stderr
    assert returncode != 0


@pytest.mark.anyio
@pytest.mark.parametrize("backend", SYNC_BACKENDS)
async def test_ctrl_c_during_a_step_on_the_lane_leaves_the_client_usable(backend: str) -> None:
    _WaitsOnStepByZero.stepping, _WaitsOnStepByZero.released = anyio.Event(), anyio.Event()
    async with openenv.serve(_WaitsOnStepByZero) as server:
        process = _start(_STEP_INTERRUPTED_THEN_ANOTHER, server.url, backend)
        try:
            with anyio.fail_after(_PROCESS_WAIT):  # a line that never comes fails the test (its reader is let go)
                assert await anyio.to_thread.run_sync(_read_line, process, abandon_on_cancel=True) == "stepping"
                await _WaitsOnStepByZero.stepping.wait()  # the client's thread now waits on the socket
                process.send_signal(signal.SIGINT)
                assert await anyio.to_thread.run_sync(_read_line, process, abandon_on_cancel=True) == "interrupted"
            _WaitsOnStepByZero.released.set()  # a late reply: the next step must not take it for its own
            returncode, stdout, stderr = await anyio.to_thread.run_sync(_finish, process)
        finally:
            if process.poll() is None:
                process.kill()
    assert stdout.split() == ["2", "closed"], stderr
    assert returncode == 0, stderr


@pytest.mark.anyio
@pytest.mark.parametrize("backend", SYNC_BACKENDS)
async def test_a_forked_child_is_refused_the_parent_s_client_and_the_parent_goes_on(backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv)) as server:
        process = _start(_FORK_WITH_A_CLIENT, server.url, backend)
        returncode, stdout, stderr = await anyio.to_thread.run_sync(_finish, process)
    assert returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0] == (
        "child: this SyncEnvClient was connected in the parent process, before the fork; make a new one in this process"
    )
    assert lines[1:] == ["child exited 0", "parent 2"]
    assert "unclosed" not in stderr

"""Plain (sync) environment methods, and a tool environment's plain tools, on a thread of their session's own.

Isolation, order, and no thread left behind.
"""

from __future__ import annotations

import gc
import json
import threading
from typing import Any, ClassVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

import openenv
from openenv import Action, EnvClient, EnvPool, Observation, State
from openenv._tools import runs_plain_steps
from openenv._worker import Call, CallBatch, SessionWorker, wait_for
from openenv.examples.echo import EchoEnvironment
from openenv.server import Environment, ServerSession
from tests.envs import SyncCounterEnv

pytestmark = pytest.mark.anyio

# Bounds every wait on a thread: generous, as the machine may be loaded.
WAIT = 10.0
# How long a test gives what must not happen yet (a close queued beside a running step) to show.
NOT_BEFORE = 0.5


class GateAction(Action):
    block: bool = False


class GateObservation(Observation):
    thread: int = 0


class GatedEnv(Environment[GateAction, GateObservation, State]):
    """A plain ``step`` that, when asked, blocks its thread until the test opens the gate."""

    entered: ClassVar[threading.Event] = threading.Event()
    gate: ClassVar[threading.Event] = threading.Event()
    timed_out: ClassVar[list[bool]] = []

    def reset(self, **kwargs: Any) -> GateObservation:
        return GateObservation(thread=threading.get_ident())

    def step(self, action: GateAction) -> GateObservation:
        if action.block:
            GatedEnv.entered.set()
            # Bounded: if the event loop were stalled, the test could not open it.
            GatedEnv.timed_out.append(not GatedEnv.gate.wait(WAIT))
        return GateObservation(thread=threading.get_ident())

    @property
    def state(self) -> State:
        return State()


class GatedClient(EnvClient[GateAction, GateObservation, State]):
    pass


@pytest.fixture(autouse=True)
def _reset_gate() -> None:
    GatedEnv.entered.clear()
    GatedEnv.gate.clear()
    GatedEnv.timed_out.clear()


async def ask(session: ServerSession, message: Any) -> Any:
    with anyio.fail_after(WAIT):
        reply = await session.handle(json.dumps(message).encode())
    return None if reply is None else json.loads(reply)


async def test_a_blocking_step_never_stalls_the_other_sessions() -> None:
    async with (
        openenv.serve(GatedEnv, port=0) as server,
        GatedClient(server.url) as blocked,
        GatedClient(server.url) as other,
        anyio.create_task_group() as group,
    ):
        await blocked.reset()
        await other.reset()
        group.start_soon(blocked.step, GateAction(block=True))
        await anyio.to_thread.run_sync(GatedEnv.entered.wait, WAIT)
        # The first session's step holds its thread; the second one's goes through.
        for _ in range(3):
            with anyio.fail_after(WAIT):
                result = await other.step(GateAction())
            assert not result.done
        GatedEnv.gate.set()
    assert GatedEnv.timed_out == [False]


async def test_a_long_call_on_the_session_thread_ends_when_stopped() -> None:
    worker = SessionWorker()
    started, stop = threading.Event(), threading.Event()

    def serve() -> str:
        started.set()
        return "stopped" if stop.wait(WAIT) else "timed out"

    assert await worker.run_until_stopped(lambda: "done", stop.set) == "done"
    assert not stop.is_set()  # stop is for a cancelled caller only
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run_until_stopped, serve, stop.set)
            await anyio.to_thread.run_sync(started.wait, WAIT)
            group.cancel_scope.cancel()
    assert stop.is_set()
    with pytest.raises(ZeroDivisionError):
        await worker.run_until_stopped(lambda: 1 / 0, stop.set)
    await worker.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run_until_stopped(str, stop.set)


async def test_one_sessions_calls_run_on_one_thread_one_at_a_time() -> None:
    session = ServerSession(SyncCounterEnv())
    await ask(session, {"type": "reset"})
    async with anyio.create_task_group() as group:
        # Concurrent requests on one session (SyncCounterEnv raises if entered twice at once).
        for _ in range(50):
            group.start_soon(ask, session, {"type": "step", "data": {"by": 1, "delay": 0.0005}})
    reply = await ask(session, {"type": "state"})
    assert reply["data"]["count"] == 50
    assert len(SyncCounterEnv.threads) == 1
    assert threading.get_ident() not in SyncCounterEnv.threads
    await session.aclose()


async def test_each_session_has_its_own_thread() -> None:
    first, second = ServerSession(GatedEnv()), ServerSession(GatedEnv())
    one = (await ask(first, {"type": "reset"}))["data"]["observation"]["thread"]
    two = (await ask(second, {"type": "reset"}))["data"]["observation"]["thread"]
    assert one != two
    assert (await ask(first, {"type": "step", "data": {}}))["data"]["observation"]["thread"] == one
    await first.aclose()
    await second.aclose()


def worker_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "openenv-session"]


async def test_a_thousand_sessions_leave_no_threads_behind() -> None:
    before = set(threading.enumerate())
    sessions = [ServerSession(SyncCounterEnv()) for _ in range(1000)]
    for session in sessions:
        await ask(session, {"type": "step", "data": {"by": 1}})
    started = set(worker_threads()) - before
    assert len(started) == 1000
    async with anyio.create_task_group() as group:
        for session in sessions:
            group.start_soon(session.aclose)
    for thread in started:
        thread.join(WAIT)
    assert set(threading.enumerate()) <= before


async def test_closing_sessions_that_never_ran_a_plain_call_starts_no_thread() -> None:
    before = set(threading.enumerate())
    sessions = [ServerSession(SyncCounterEnv()) for _ in range(1000)]
    async with anyio.create_task_group() as group:
        for session in sessions:
            group.start_soon(session.aclose)  # the inherited close() does nothing: no thread for it
    assert set(threading.enumerate()) <= before


async def test_a_session_dropped_without_closing_lets_its_thread_go() -> None:
    session = ServerSession(GatedEnv())
    ident = (await ask(session, {"type": "reset"}))["data"]["observation"]["thread"]
    [thread] = [thread for thread in worker_threads() if thread.ident == ident]
    del session
    gc.collect()
    thread.join(WAIT)
    assert not thread.is_alive()


async def test_a_plain_close_runs_on_the_sessions_thread_after_its_calls() -> None:
    ran_on: list[int] = []

    class ClosingEnv(GatedEnv):
        def close(self) -> None:
            ran_on.append(threading.get_ident())

    session = ServerSession(ClosingEnv())
    thread = (await ask(session, {"type": "reset"}))["data"]["observation"]["thread"]
    with anyio.fail_after(WAIT):
        await session.aclose()
    assert ran_on == [thread]


async def test_the_worker_hands_back_results_and_errors() -> None:
    worker = SessionWorker()
    assert worker.thread is None
    assert await worker.run(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ZeroDivisionError):
        await worker.run(lambda: 1 / 0)
    # A slow call is awaited on the event loop rather than waited for inline.
    assert await worker.run(lambda: threading.Event().wait(0.01) or "slow") == "slow"
    assert await worker.run(str, 7) == "7"
    thread = worker.thread
    assert thread is not None
    await worker.aclose()
    await worker.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run(str, 1)
    thread.join(WAIT)
    assert not thread.is_alive()


async def test_a_cancelled_caller_waits_for_its_call_to_finish() -> None:
    worker = SessionWorker()
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def blocking() -> None:
        started.set()
        release.wait(WAIT)
        finished.append("call")

    async def caller() -> None:
        try:
            await worker.run(blocking)
        finally:
            finished.append("caller")

    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as group:
            group.start_soon(caller)
            await anyio.to_thread.run_sync(started.wait, WAIT)
            group.cancel_scope.cancel()
            release.set()
    assert finished == ["call", "caller"]
    await worker.aclose()


class Move(Action):
    steps: int = 1


class ThreadedToolbox(openenv.MCPEnvironment[openenv.CallToolAction | Move, Observation, State]):
    """A tool environment whose plain tools, ``step_other`` and ``state`` note the thread they run on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def reset(self, **kwargs: Any) -> Observation:
        self.threads.append(threading.get_ident())
        return Observation()

    @property
    def state(self) -> State:
        self.threads.append(threading.get_ident())
        return State()

    @openenv.tool
    def where(self) -> int:
        """The thread this plain tool runs on."""
        self.threads.append(threading.get_ident())
        return threading.get_ident()

    def step_other(self, action: Move) -> Observation:
        self.threads.append(threading.get_ident())
        return Observation(reward=action.steps)


async def test_a_tool_environments_plain_methods_share_the_sessions_thread() -> None:
    env = ThreadedToolbox()
    session = ServerSession(env)
    await ask(session, {"type": "reset"})
    call = {"type": "call_tool", "tool_name": "where", "arguments": {}}
    assert (await ask(session, {"type": "step", "data": call}))["data"]["observation"]["result"] is not None
    assert (await ask(session, {"type": "step", "data": {"steps": 2}}))["data"]["reward"] == 2
    mcp = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "where"}}
    assert "result" in (await ask(session, {"type": "mcp", "data": mcp}))["data"]
    await ask(session, {"type": "state"})
    # reset, the tool (as a step), step_other, the tool (as an mcp frame), state: one thread.
    assert len(env.threads) == 5
    [thread] = [thread for thread in worker_threads() if thread.ident == env.threads[0]]
    assert set(env.threads) == {thread.ident}
    await session.aclose()
    thread.join(WAIT)
    assert not thread.is_alive()


async def test_a_tool_environments_plain_tools_run_one_at_a_time() -> None:
    class Overlapping(ThreadedToolbox):
        inside = 0
        overlapped = False

        @openenv.tool
        def hold(self) -> None:
            """Note whether another call is inside at the same time."""
            self.inside += 1
            self.overlapped |= self.inside > 1
            threading.Event().wait(0.0005)
            self.inside -= 1

    env = Overlapping()
    session = ServerSession(env)
    call = {"type": "step", "data": {"type": "call_tool", "tool_name": "hold", "arguments": {}}}
    async with anyio.create_task_group() as group:
        for _ in range(20):
            group.start_soon(ask, session, call)
    assert not env.overlapped
    await session.aclose()


async def test_a_tool_environment_outside_a_session_runs_plain_tools_in_a_worker_thread() -> None:
    env = ThreadedToolbox()
    observation = await env.call_tool("where", {})
    assert observation.error is None
    assert observation.result == env.threads[0] != threading.get_ident()


def test_only_a_tool_environment_with_plain_steps_keeps_its_state_on_the_sessions_thread() -> None:
    assert runs_plain_steps(ThreadedToolbox())
    assert not runs_plain_steps(EchoEnvironment())  # async tools, the inherited step_other
    assert not runs_plain_steps(SyncCounterEnv())


class CallbackAction(Action):
    with_token: bool = True


class CallbackEnv(Environment[CallbackAction, GateObservation, State]):
    """A plain ``step`` that calls back into the event loop, with the token its ``__init__`` took or without one."""

    def __init__(self) -> None:
        self.token = anyio.lowlevel.current_token()
        self.loop_thread = 0

    def reset(self, **kwargs: Any) -> GateObservation:
        return GateObservation()

    async def _on_the_loop(self) -> int:
        await anyio.lowlevel.checkpoint()
        return threading.get_ident()

    def step(self, action: CallbackAction) -> GateObservation:
        if not action.with_token:
            return GateObservation(thread=anyio.from_thread.run(self._on_the_loop))
        self.loop_thread = anyio.from_thread.run_sync(threading.get_ident, token=self.token)
        return GateObservation(thread=anyio.from_thread.run(self._on_the_loop, token=self.token))

    @property
    def state(self) -> State:
        return State()


async def test_a_plain_method_reaches_the_event_loop_with_a_token_and_gets_a_clear_error_without() -> None:
    env = CallbackEnv()
    session = ServerSession(env)
    reply = await ask(session, {"type": "step", "data": {}})
    assert reply["data"]["observation"]["thread"] == env.loop_thread == threading.get_ident()
    # anyio finds the event loop by itself only in its own worker threads: a clear error, no hang.
    reply = await ask(session, {"type": "step", "data": {"with_token": False}})
    assert reply["type"] == "error"
    assert reply["data"]["code"] == "EXECUTION_ERROR"
    assert reply["data"]["message"].startswith("NoEventLoopError: ")
    assert (await ask(session, {"type": "step", "data": {}}))["type"] == "observation"  # the session goes on
    await session.aclose()


# -- environments without thread affinity: a batch's plain steps on a shared thread ---------------


class SharedGatedEnv(GatedEnv):
    """`GatedEnv`, keeping no state of a thread's: a batch's plain steps may share one."""

    thread_affinity = False


def thread_name(ident: int) -> str:
    return next(thread.name for thread in threading.enumerate() if thread.ident == ident)


def step_frame(block: bool = False) -> bytes:
    return json.dumps({"type": "step", "data": {"block": block}}).encode()


def thread_of(call: Call) -> int:
    return int(json.loads(call.outcome())["data"]["observation"]["thread"])


@pytest.mark.parametrize(
    ("env", "threads", "name"), [(GatedEnv, 8, "openenv-session"), (SharedGatedEnv, 1, "openenv-shared")]
)
async def test_a_batchs_plain_steps_share_a_thread_only_without_thread_affinity(
    env: type[GatedEnv], threads: int, name: str
) -> None:
    sessions = [ServerSession(env()) for _ in range(8)]
    for session in sessions:
        await ask(session, {"type": "reset"})
    batch = CallBatch()
    calls = [session.start_on_thread(batch, step_frame()) for session in sessions]
    with anyio.fail_after(WAIT):
        await batch.wait(WAIT)
    ran_on = {thread_of(call) for call in calls}
    assert len(ran_on) == threads
    assert {thread_name(ident) for ident in ran_on} == {name}
    for session in sessions:
        await session.aclose()


async def test_without_thread_affinity_a_slow_step_holds_up_no_other_session() -> None:
    sessions = [ServerSession(SharedGatedEnv()) for _ in range(4)]
    for session in sessions:
        await ask(session, {"type": "reset"})
    batch = CallBatch()
    blocked, *others = [
        session.start_on_thread(batch, step_frame(block=index == 0)) for index, session in enumerate(sessions)
    ]
    # The batch's wait runs out while the first step holds the shared thread: the steps behind it
    # go to their sessions' own threads, and are answered while it still blocks.
    with anyio.fail_after(WAIT):
        await batch.wait(0.05)
        for call in others:
            await wait_for(call)
    assert GatedEnv.entered.is_set()
    assert not blocked.completed
    GatedEnv.gate.set()
    with anyio.fail_after(WAIT):
        await wait_for(blocked)
    assert GatedEnv.timed_out == [False]
    for session in sessions:
        await session.aclose()


async def test_without_thread_affinity_a_close_after_a_given_up_step_waits_for_it() -> None:
    events: list[str] = []
    closed = threading.Event()

    class ClosingSharedEnv(SharedGatedEnv):
        def step(self, action: GateAction) -> GateObservation:
            events.append("step")
            try:
                return super().step(action)
            finally:
                events.append("step returned")

        def close(self) -> None:
            events.append("close")
            closed.set()

    session = ServerSession(ClosingSharedEnv())
    await ask(session, {"type": "reset"})
    batch = CallBatch()
    session.start_on_thread(batch, step_frame(block=True))
    async with anyio.create_task_group() as group:
        group.start_soon(batch.wait, WAIT)
        await anyio.to_thread.run_sync(GatedEnv.entered.wait, WAIT)
        # Given up while it blocks (a step timeout): the plain close is queued behind it, never beside it.
        assert session.abandon()
        with anyio.fail_after(WAIT):
            await session.aclose()
        # A close queued beside the step would run at once on the session's own thread.
        assert not await anyio.to_thread.run_sync(closed.wait, NOT_BEFORE)
        assert events == ["step"]
        GatedEnv.gate.set()
        assert await anyio.to_thread.run_sync(closed.wait, WAIT)
        group.cancel_scope.cancel()
    assert events == ["step", "step returned", "close"]


async def test_a_pool_on_a_link_steps_an_environment_without_thread_affinity_on_a_shared_thread() -> None:
    async with (
        openenv.serve(SharedGatedEnv, port=0) as server,
        EnvPool(server.url, size=8, client=GatedClient) as pool,
    ):
        await pool.reset()
        with anyio.fail_after(WAIT):
            results = await pool.step([GateAction() for _ in range(8)])
        assert {thread_name(result.observation.thread) for result in results} == {"openenv-shared"}


async def test_without_thread_affinity_a_new_batch_takes_another_shared_thread_while_one_is_held() -> None:
    held, quick = ServerSession(SharedGatedEnv()), ServerSession(SharedGatedEnv())
    for session in (held, quick):
        await ask(session, {"type": "reset"})
    first, second = CallBatch(), CallBatch()
    blocked = held.start_on_thread(first, step_frame(block=True))
    async with anyio.create_task_group() as group:
        group.start_soon(first.wait, WAIT)
        await anyio.to_thread.run_sync(GatedEnv.entered.wait, WAIT)
        call = quick.start_on_thread(second, step_frame())
        # Not behind the held thread (that would take the whole wait): on another shared one, at once.
        with anyio.fail_after(WAIT / 2):
            await second.wait(WAIT)
        assert thread_name(thread_of(call)) == "openenv-shared"
        GatedEnv.gate.set()
    assert thread_of(blocked) != thread_of(call)
    for session in (held, quick):
        await session.aclose()

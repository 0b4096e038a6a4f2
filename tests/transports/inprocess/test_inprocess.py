"""The in-process transport serves quick calls at once, in the caller's task, once it has seen them not wait.

What is learned is shared by the sessions of one factory in one event loop: each
test gives its sessions a factory of their own.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from openenv import ConnectionClosed
from openenv._inline import TRIAL_CALLS
from tests.envs import AsyncCounterEnv, CountAction, CountObservation
from tests.helpers import CounterClient, all_tasks_blocked
from transports.inprocess import InProcessTransport

pytestmark = pytest.mark.anyio

LIMIT = 10  # seconds: the bound of every wait in these tests


class TaskRecordingEnv(AsyncCounterEnv):
    """Records the task each step runs in; a step of ``by=-1`` waits (a checkpoint), one of ``by=-2`` until released."""

    def __init__(self) -> None:
        super().__init__()
        self.tasks: list[int] = []
        self.waiting = anyio.Event()
        self.release = anyio.Event()
        self.cut = False

    async def step(self, action: CountAction) -> CountObservation:
        self.tasks.append(anyio.get_current_task().id)
        if action.by == -1:
            await anyio.lowlevel.checkpoint()
        elif action.by == -2:
            self.waiting.set()
            try:
                await self.release.wait()
            except anyio.get_cancelled_exc_class():
                self.cut = True
                raise
        return await super().step(CountAction(by=max(action.by, 0)))


class AlwaysWaitingEnv(TaskRecordingEnv):
    """Every step waits (a checkpoint) first."""

    async def step(self, action: CountAction) -> CountObservation:
        await anyio.lowlevel.checkpoint()
        return await super().step(action)


def _client(env: AsyncCounterEnv) -> CounterClient:
    return CounterClient(transport=InProcessTransport(factory=lambda: env))


async def _reset_and_trials(client: CounterClient) -> None:
    """A reset, then enough quick steps (the reset counts too) that the next call is run at once."""
    await all_tasks_blocked()  # the session's task (the client's owner's) waits for requests
    await client.reset()
    for _ in range(TRIAL_CALLS):
        await client.step(CountAction(by=1))


async def test_quick_calls_run_in_the_sessions_task_then_at_once_in_the_callers() -> None:
    env = TaskRecordingEnv()
    with anyio.fail_after(LIMIT):
        async with _client(env) as client:
            await _reset_and_trials(client)
            result = await client.step(CountAction(by=1))
    me = anyio.get_current_task().id
    assert env.tasks[0] != me  # the first calls ran in the session's task (the client's owner's)
    assert env.tasks[-1] == me  # then at once, in the caller's
    assert result.observation.count == TRIAL_CALLS + 1


async def test_calls_that_wait_are_never_run_at_once() -> None:
    env = AlwaysWaitingEnv()
    with anyio.fail_after(LIMIT):
        async with _client(env) as client:
            await _reset_and_trials(client)
            for _ in range(3):
                await client.step(CountAction(by=1))
    assert anyio.get_current_task().id not in env.tasks


async def test_a_call_run_at_once_that_waits_finishes_there_and_later_calls_go_back_to_the_sessions_task() -> None:
    env = TaskRecordingEnv()
    with anyio.fail_after(LIMIT):
        async with _client(env) as client:
            await _reset_and_trials(client)
            waited = await client.step(CountAction(by=-1))  # waits after all: finished in this task
            after = await client.step(CountAction(by=1))
    me = anyio.get_current_task().id
    assert env.tasks[-2] == me
    assert env.tasks[-1] != me
    assert (waited.observation.count, after.observation.count) == (TRIAL_CALLS, TRIAL_CALLS + 1)


async def test_a_call_run_at_once_cut_by_its_caller_ends_the_session_and_says_why() -> None:
    env = TaskRecordingEnv()
    with anyio.fail_after(LIMIT):
        async with _client(env) as client:
            await _reset_and_trials(client)
            async with anyio.create_task_group() as tasks:

                async def cancel_once_waiting() -> None:
                    await env.waiting.wait()
                    tasks.cancel_scope.cancel()

                tasks.start_soon(cancel_once_waiting)
                await client.step(CountAction(by=-2))
            assert tasks.cancel_scope.cancelled_caught
            assert env.cut
            with pytest.raises(ConnectionClosed, match="cut by its caller"):
                await client.step(CountAction(by=1))


async def test_an_ownerless_client_is_served_at_once_after_the_trials_too() -> None:
    env = TaskRecordingEnv()
    client = _client(env)
    with anyio.fail_after(LIMIT):
        await client.connect()
        try:
            await _reset_and_trials(client)
            await client.step(CountAction(by=-1))  # waits after all: finished here, then the shielded way again
            result = await client.step(CountAction(by=1))
        finally:
            await client.close()
    assert result.observation.count == TRIAL_CALLS + 1
    assert set(env.tasks) == {anyio.get_current_task().id}  # no owner: every call in the caller's task


async def test_the_sessions_of_one_factory_learn_together() -> None:
    envs = [TaskRecordingEnv(), TaskRecordingEnv()]
    made = iter(envs)

    def factory() -> TaskRecordingEnv:
        return next(made)

    me = anyio.get_current_task().id
    with anyio.fail_after(LIMIT):
        async with (
            CounterClient(transport=InProcessTransport(factory=factory)) as first,
            CounterClient(transport=InProcessTransport(factory=factory)) as second,
        ):
            await _reset_and_trials(first)  # the first session's calls teach the second's too
            await second.reset()
            await second.step(CountAction(by=1))
            assert envs[1].tasks[-1] == me
            await second.step(CountAction(by=-1))  # waits after all: the first's calls go to its task too
            await first.step(CountAction(by=1))
            assert envs[0].tasks[-1] != me


async def test_event_loops_learn_apart() -> None:
    def factory() -> TaskRecordingEnv:
        return env

    env = TaskRecordingEnv()
    me = anyio.get_current_task().id

    with anyio.fail_after(LIMIT):
        async with CounterClient(transport=InProcessTransport(factory=factory)) as client:
            await _reset_and_trials(client)
    assert env.tasks[-1] == me

    other: list[int] = []

    async def in_another_loop() -> None:
        async with CounterClient(transport=InProcessTransport(factory=factory)) as client:
            await all_tasks_blocked()
            await client.step(CountAction(by=1))
            other.append(anyio.get_current_task().id)

    await anyio.to_thread.run_sync(anyio.run, in_another_loop)
    assert env.tasks[-1] != other[0]  # a new event loop starts learning afresh: the call ran in the session's task

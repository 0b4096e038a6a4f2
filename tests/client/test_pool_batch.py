"""An EnvPool of in-process sessions steps them as one message per factory, once their calls run at once.

Each step of such a batch is what the session's own request would have been:
the same result, the same error for the same session only, in the same order
with its other requests. What is learned of a factory's calls is shared by the
sessions of one event loop, and each test runs in a loop of its own.
"""

from __future__ import annotations

from typing import Any, Literal

import anyio
import anyio.lowlevel
import msgspec
import pytest

from openenv import (
    Action,
    ConnectionClosed,
    EnvClient,
    EnvPool,
    EnvPoolError,
    ExecutionError,
    ReplacedStepResult,
    ReplyValidationError,
    TimeoutError,
)
from openenv._client import requests_of
from openenv._codec import client_codec, server_codec
from openenv._inline import TRIAL_CALLS
from openenv._messages import Dialect, StepBatchReply
from openenv._results import StepResults, results_at_once
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, CountState
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked
from transports import inprocess
from transports.inprocess import InProcessTransport

pytestmark = pytest.mark.anyio

LIMIT = 20  # seconds: the bound of every wait in these tests
SIZE = 8


class BatchEnv(AsyncCounterEnv):
    """The counter, recording the task each step runs in.

    A step of ``by=-1`` waits (a checkpoint), ``by=-2`` forever; ``by=-3`` returns an observation that cannot be
    encoded, ``by=-4`` one whose count is no int.
    """

    tasks: dict[int, list[int]] = {}  # noqa: RUF012 - by the session's first reset's start

    async def reset(self, episode_id: str | None = None, start: int = 0) -> CountObservation:
        self._start = start
        BatchEnv.tasks[start] = []
        return await super().reset(episode_id=episode_id, start=start)

    async def step(self, action: CountAction) -> CountObservation:
        BatchEnv.tasks[self._start].append(anyio.get_current_task().id)
        if action.by == -1:
            await anyio.lowlevel.checkpoint()
            action = CountAction(by=1)
        elif action.by == -2:
            await anyio.Event().wait()
        elif action.by == -3:
            return CountObservation(count=self._state.count, note=object())  # type: ignore[arg-type]
        elif action.by == -4:
            return CountObservation(count="many")  # type: ignore[arg-type]
        observation = await super().step(action)
        observation.metadata = {"start": self._start}
        return observation


class StringAction(Action):
    """The counter's action with ``by`` as a string: the server converts it (lax), on a request of its own."""

    by: str = "1"


class StringClient(EnvClient[StringAction, CountObservation, CountState]):
    pass


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch the in-process host is asked to step (whether or not it stepped them)."""
    sizes: list[int] = []
    step = inprocess._Batcher.step

    async def counted(self: inprocess._Batcher, transports: Any, message: bytes) -> bytes | None:
        sizes.append(len(transports))
        return await step(self, transports, message)

    monkeypatch.setattr(inprocess._Batcher, "step", counted)
    return sizes


def url() -> str:
    return "inproc://tests.client.test_pool_batch:BatchEnv"


async def until_at_once(pool: EnvPool[Any, Any, Any]) -> None:
    """Reset the pool (session i starts at i * 100), then step it until its calls run at once."""
    await pool.reset(start=[index * 100 for index in range(pool.size)])
    for _ in range(TRIAL_CALLS // pool.size):
        await pool.step([CountAction(by=0)] * pool.size)


async def test_the_sessions_are_stepped_as_one_message_once_their_calls_run_at_once(batches: list[int]) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient) as pool:
            await until_at_once(pool)
            batches.clear()
            for _ in range(3):
                results = await pool.step([CountAction(by=index) for index in range(SIZE)])
    assert batches == [SIZE] * 3
    assert [result.observation.count for result in results] == [index * 100 + 3 * index for index in range(SIZE)]
    assert [result.reward for result in results] == [float(index) for index in range(SIZE)]
    assert [result.done for result in results] == [index > 0 for index in range(SIZE)]
    assert [result.metadata for result in results] == [{"start": index * 100} for index in range(SIZE)]
    me = anyio.get_current_task().id
    assert all(BatchEnv.tasks[index * 100][-1] == me for index in range(SIZE))  # at once, in the caller's task


async def test_a_batch_gives_the_results_requests_on_their_own_give(monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> list[Any]:
        async with EnvPool(url(), size=SIZE, client=CounterClient) as pool:
            await until_at_once(pool)
            return [await pool.step([CountAction(by=index) for index in range(SIZE)]) for _ in range(2)]

    with anyio.fail_after(LIMIT):
        together = await run()
        monkeypatch.setattr(InProcessTransport, "step_batcher", lambda self: None)
        alone = await run()
    assert together == alone


async def test_a_step_that_raises_fails_its_session_only(batches: list[int]) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient, on_error="replace") as pool:
            await until_at_once(pool)
            batches.clear()
            results = await pool.step([CountAction(by=1, fail=index == 2) for index in range(SIZE)])
            states = await pool.state()
    assert batches[0] == SIZE
    replaced = results[2]
    assert isinstance(replaced, ReplacedStepResult)
    assert isinstance(replaced.error, ExecutionError)
    assert "asked to fail" in str(replaced.error)
    assert [state.count for index, state in enumerate(states) if index != 2] == [
        index * 100 + 1 for index in range(SIZE) if index != 2
    ]


@pytest.mark.parametrize(("by", "error"), [(-3, ExecutionError), (-4, ReplyValidationError)])
async def test_an_observation_that_cannot_travel_fails_its_session_only(
    batches: list[int], by: int, error: type[Exception]
) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient) as pool:
            await until_at_once(pool)
            batches.clear()
            with pytest.raises(EnvPoolError) as info:
                await pool.step([CountAction(by=by if index == 5 else 1) for index in range(SIZE)])
            states = await pool.state()
    assert batches == [SIZE]
    assert list(info.value.errors) == [5]
    assert isinstance(info.value.errors[5], error)
    assert [state.count for index, state in enumerate(states) if index != 5] == [
        index * 100 + 1 for index in range(SIZE) if index != 5
    ]


async def test_actions_that_fit_only_once_converted_go_on_their_own(batches: list[int]) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=StringClient) as pool:
            await pool.reset(start=[index * 100 for index in range(SIZE)])
            for _ in range(TRIAL_CALLS // SIZE + 1):
                results = await pool.step([StringAction(by=str(index)) for index in range(SIZE)])
    assert batches  # the host was asked, and sent them back: the lax conversion is the server's, per request
    assert [result.observation.count for result in results] == [
        index * 100 + index * (TRIAL_CALLS // SIZE + 1) for index in range(SIZE)
    ]


async def test_a_step_that_waits_is_finished_in_the_batch_and_the_rest_go_to_their_tasks(batches: list[int]) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient) as pool:
            await until_at_once(pool)
            batches.clear()
            results = await pool.step([CountAction(by=-1 if index == 1 else 1) for index in range(SIZE)])
            after = await pool.step([CountAction(by=1)] * SIZE)
    assert batches == [SIZE]  # the next step is not batched: the factory's calls wait
    assert [result.observation.count for result in results] == [index * 100 + 1 for index in range(SIZE)]
    assert [result.observation.count for result in after] == [index * 100 + 2 for index in range(SIZE)]
    me = anyio.get_current_task().id
    last_two = [BatchEnv.tasks[index * 100][-2:] for index in range(SIZE)]
    assert [tasks[0] == me for tasks in last_two] == [True, True] + [False] * (SIZE - 2)
    assert not any(tasks[1] == me for tasks in last_two)  # from then on, in the sessions' tasks


async def test_a_batch_cut_by_the_timeout_while_a_step_waits_ends_that_session_only(batches: list[int]) -> None:
    """The cut call's session ends; the batch's other replies are lost, as late replies are: each session times out."""
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient, clock=clock, on_error="raise") as pool:
            await until_at_once(pool)
            batches.clear()
            failures: list[EnvPoolError] = []

            async def step() -> None:
                with pytest.raises(EnvPoolError) as info:
                    await pool.step([CountAction(by=-2 if index == 1 else 1) for index in range(SIZE)], timeout=5)
                failures.append(info.value)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(step)
                await all_tasks_blocked()  # the batch waits on session 1's step
                clock.advance(5)
            with pytest.raises(EnvPoolError) as after:
                await pool.step([CountAction(by=1)] * SIZE)
    assert batches == [SIZE]
    assert sorted(failures[0].errors) == list(range(SIZE))
    assert all(isinstance(error, TimeoutError) for error in failures[0].errors.values())
    assert list(after.value.errors) == [1]
    assert isinstance(after.value.errors[1], ConnectionClosed)
    assert "cut by its caller" in str(after.value.errors[1])


async def test_a_client_used_on_its_own_meanwhile_keeps_its_order(batches: list[int]) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient) as pool:
            await until_at_once(pool)
            batches.clear()
            requests = requests_of(pool.clients[3])
            assert requests is not None
            lock = requests.lock
            await lock.acquire()  # as if the caller were using that client directly right now
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pool.step, [CountAction(by=1)] * SIZE)
                await all_tasks_blocked()  # the others were stepped; the pool waits for that client
                assert batches == [SIZE - 1]
                lock.release()
            states = await pool.state()
    assert batches == [SIZE - 1]
    assert [state.count for state in states] == [index * 100 + 1 for index in range(SIZE)]


async def test_a_session_with_a_request_in_flight_steps_after_it_on_its_own(batches: list[int]) -> None:
    with anyio.fail_after(LIMIT):
        async with EnvPool(url(), size=SIZE, client=CounterClient) as pool:
            await until_at_once(pool)
            requests = requests_of(pool.clients[2])
            assert requests is not None
            # Sent, then given up on before its reply was read (as a call cut by its timeout leaves it): the
            # reply is a late one, for the client to drop.
            requests.next_id += 1
            requests.unanswered.append(requests.next_id)
            await requests.transport.send(requests.codec.step(CountAction(by=5), requests.next_id))
            batches.clear()
            first = await pool.step([CountAction(by=1)] * SIZE)
            second = await pool.step([CountAction(by=1)] * SIZE)
    assert batches == [SIZE - 1, SIZE]  # behind its request the first time; in the batch again once it is read
    assert [result.observation.count for result in first] == [
        index * 100 + (6 if index == 2 else 1) for index in range(SIZE)
    ]
    assert [result.observation.count for result in second] == [
        index * 100 + (7 if index == 2 else 2) for index in range(SIZE)
    ]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_the_replies_of_a_batch_are_one_message(encoding: Literal["json", "msgpack"]) -> None:
    dialect = Dialect(encoding=encoding, request_ids=True)
    server = server_codec(dialect, CountAction, False)
    client = client_codec(dialect, CountObservation, CountState)
    actions = server.decode_step_batch(client.step_batch([CountAction(by=1), CountAction(by=2)]))
    assert actions == [CountAction(by=1), CountAction(by=2)]
    observation = server.batch_observation(CountObservation(count=2, reward=1.0, done=True))
    message = server.step_batch_reply(StepBatchReply([observation, None], {1: {"code": "EXECUTION_ERROR"}}))
    replies, invalid = client.decode_step_batch(message)
    assert invalid == {}
    assert replies.observations == [CountObservation(count=2, reward=1.0, done=True), None]
    assert replies.errors == {1: {"code": "EXECUTION_ERROR"}}
    decoded = (msgspec.json.decode if encoding == "json" else msgspec.msgpack.decode)(message)
    assert decoded["observations"][0] == {"count": 2, "note": "", "done": True, "reward": 1.0, "metadata": {}}
    # One observation that does not fit the client's type fails alone.
    unfit = server.batch_observation(CountObservation(count="many"))  # type: ignore[arg-type]
    replies, invalid = client.decode_step_batch(server.step_batch_reply(StepBatchReply([observation, None, unfit])))
    assert replies.observations == [CountObservation(count=2, reward=1.0, done=True), None, None]
    assert list(invalid) == [2]


def test_an_untyped_client_gets_reward_and_done_beside_the_observation_as_from_a_reply_frame() -> None:
    dialect = Dialect(request_ids=True)
    server = server_codec(dialect, CountAction, False)
    client = client_codec(dialect, dict, dict)
    observation = server.batch_observation({"count": 2, "reward": 1, "done": True, "metadata": {"a": 1}})
    replies, _ = client.decode_step_batch(server.step_batch_reply(StepBatchReply([observation])))
    result = StepResults[Any](dict).of_batched(replies.observations[0])
    assert (result.observation, result.reward, result.done, result.metadata) == (
        {"count": 2, "metadata": {"a": 1}},
        1,
        True,
        {"a": 1},
    )


class LooseMetadataObservation(CountObservation):
    """An observation whose metadata may be ``None``: its results are made one by one (``{}`` for ``None``)."""

    metadata: dict[str, Any] | None = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("observation_type", "at_once"),
    [(CountObservation, True), (LooseMetadataObservation, False), (dict, False), (CountObservation | None, False)],
)
def test_a_batch_makes_its_results_at_once_only_where_they_are_those_made_one_by_one(
    observation_type: Any, at_once: bool
) -> None:
    results = StepResults[Any](observation_type)
    assert results_at_once(observation_type) is results.at_once is at_once
    observations = [CountObservation(count=1, reward=2, done=True, metadata={"a": 1}), CountObservation(count=2)]
    if at_once:
        assert results.of_batch(observations) == [results.of_batched(each) for each in observations]
        assert results.of_batch([*observations, None]) is None  # a step not taken: each is looked at alone
    else:
        assert results.of_batch(observations) is None

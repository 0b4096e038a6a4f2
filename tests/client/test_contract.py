"""What every transport must do alike: the same client behaviour over each, on both backends."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
import pytest

import openenv
from openenv import EnvClient, StepResult
from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment, EchoObservation, EchoState
from tests.envs import (
    AsyncCounterEnv,
    BadObservationEnv,
    CountAction,
    CountObservation,
    CountState,
    DictEnv,
    FrozenEnv,
    FrozenObservation,
    SyncCounterEnv,
    failing_factory,
)
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked, cancel_when_blocked, wait_until
from tests.serving import TRANSPORTS, serving
from transports.inprocess import InProcessTransport

pytestmark = pytest.mark.anyio

LIMIT = 10  # seconds: the bound of every wait in these tests


@pytest.fixture(params=TRANSPORTS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def test_echo_reset_step_and_aliases(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, EchoEnvironment) as url, EchoEnv(url) as env:
            result = await env.reset(episode_id="ep-1")
            assert isinstance(result, StepResult)
            assert isinstance(result.observation, EchoObservation)
            assert result.observation.echoed_message == ""
            result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hello!"}))
            assert result.observation.echoed_message == "Hello!"
            assert result.observation.result == "Hello!"
            assert result.reward == pytest.approx(0.6)
            assert result.observation.reward == result.reward
            result = await env.reset_async()
            assert result.observation.echoed_message == ""
            result = await env.step_async(CallToolAction(tool_name="echo_with_length", arguments={"message": "four"}))
            assert result.observation.result == {"message": "four", "length": 4}
            state = await env.state()
            assert isinstance(state, EchoState)
            assert state.step_count == 1


@pytest.mark.parametrize("factory", [AsyncCounterEnv, SyncCounterEnv])
async def test_typed_replies_and_state(kind: str, factory: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, factory) as url, CounterClient(url) as env:
            result = await env.reset(episode_id="ep-7", start=8)
            assert isinstance(result.observation, CountObservation)
            assert result.observation.count == 8
            result = await env.step(CountAction(by=2))
            assert (result.observation.count, result.reward) == (10, 2.0)
            state = await env.state()
            assert state == CountState(episode_id="ep-7", step_count=1, count=10)


async def test_untyped_client_gets_dicts(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, DictEnv) as url, EnvClient(url) as env:
            result = await env.reset(a=1)
            assert result.observation == {"hello": "world", "kwargs": {"a": 1}}
            result = await env.step({"anything": [1, 2]})
            assert result.observation == {"echo": {"anything": [1, 2]}}
            assert (result.reward, result.done) == (1.5, False)
            assert await env.state() == {"steps": 1}


async def test_frozen_observations(kind: str) -> None:
    class FrozenClient(EnvClient[CountAction, FrozenObservation, openenv.State]):
        pass

    with anyio.fail_after(LIMIT):
        async with serving(kind, FrozenEnv) as url, FrozenClient(url) as env:
            result = await env.reset()
            assert result.observation == FrozenObservation(value=1, reward=2.0, done=True)


@pytest.mark.parametrize(
    ("action", "error"),
    [
        ({"by": "two"}, openenv.ValidationError),
        ({"unknown_field": 1}, openenv.ValidationError),
        (CountAction(fail=True), openenv.ExecutionError),
    ],
)
async def test_errors_are_typed_and_the_session_survives(kind: str, action: Any, error: type[Exception]) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url, CounterClient(url) as env:
            await env.reset()
            with pytest.raises(error) as info:
                await env.step(action)
            assert isinstance(info.value, openenv.ServerError)
            assert info.value.code in ("VALIDATION_ERROR", "EXECUTION_ERROR")
            result = await env.step(CountAction(by=1))
            assert result.observation.count == 1


async def test_reply_that_does_not_fit_the_types(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, BadObservationEnv) as url, CounterClient(url) as env:
            with pytest.raises(openenv.ReplyValidationError):
                await env.reset()
            with pytest.raises(openenv.ExecutionError):
                await env.step(CountAction())
            assert await env.state() == CountState()


async def test_timeout_never_hands_the_late_reply_to_the_next_call(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        clock = ManualClock()
        async with serving(kind, AsyncCounterEnv) as url, CounterClient(url, timeout=5, clock=clock) as env:
            await env.reset()
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.advance_when_blocked, 5.0)  # the step is at the environment
                with pytest.raises(openenv.TimeoutError) as info:
                    await env.step(CountAction(by=100, delay=0.3))
            assert isinstance(info.value, TimeoutError)
            # The slow step still completes on the server; its reply must be dropped.
            result = await env.step(CountAction(by=1))
            assert (result.observation.count, result.reward) == (101, 1.0)
            assert (await env.state()).count == 101


async def test_client_timeout_applies_to_every_call(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        clock = ManualClock()
        async with serving(kind, AsyncCounterEnv) as url, CounterClient(url, timeout=1.0, clock=clock) as env:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.advance_when_blocked, 1.0)
                with pytest.raises(openenv.TimeoutError):
                    await env.step(CountAction(by=5, delay=0.3))
            result = await env.step(CountAction(by=1), timeout=None)
            assert result.observation.count == 6


async def test_cancellation_passes_through_and_drops_the_late_reply(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url, CounterClient(url) as env:
            await env.reset()
            async with anyio.create_task_group() as task_group:

                async def cancel_mid_step() -> None:
                    await all_tasks_blocked()  # the step is at the environment, which sleeps
                    task_group.cancel_scope.cancel()

                task_group.start_soon(cancel_mid_step)
                await env.step(CountAction(by=100, delay=0.3))
            assert task_group.cancel_scope.cancelled_caught
            result = await env.step(CountAction(by=1))
            assert (result.observation.count, result.reward) == (101, 1.0)


@pytest.mark.parametrize("factory", [AsyncCounterEnv, SyncCounterEnv])
async def test_concurrent_callers_are_served_in_turn(kind: str, factory: Any) -> None:
    results: list[StepResult[CountObservation]] = []
    with anyio.fail_after(LIMIT):
        async with serving(kind, factory) as url, CounterClient(url) as env:
            await env.reset()

            async def one_step() -> None:
                results.append(await env.step(CountAction(by=1, delay=0.01)))

            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(one_step)
            assert sorted(r.observation.count for r in results) == list(range(1, 9))
            assert all(r.reward == 1.0 for r in results)


async def test_failing_factory_is_a_typed_fatal_error(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, failing_factory) as url, CounterClient(url) as env:
            with pytest.raises(openenv.FactoryError, match="no GPU left") as info:
                await env.reset()
            assert info.value.fatal
            with pytest.raises(openenv.ConnectionClosed):
                await env.step(CountAction())


async def test_closed_client_refuses_calls(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url:
            env = CounterClient(url)
            with pytest.raises(openenv.ClientStateError, match="not connected"):
                await env.reset()
            async with env:
                await env.reset()
                await env.close()
                await env.close()  # idempotent
                with pytest.raises(openenv.ClientStateError, match="closed"):
                    await env.step(CountAction())
            with pytest.raises(openenv.ClientStateError):
                await env.__aenter__()


async def test_connect_and_close_without_a_block(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url:
            env = await CounterClient(url).connect()
            assert env.is_connected
            assert (await env.step(CountAction(by=3))).observation.count == 3
            await env.close()
            assert not env.is_connected


def closed_episodes(env: CounterClient) -> Callable[[], list[str | None]]:
    """A function listing the episodes of the counters closed where ``env``'s environment runs (ray://: its actor)."""
    actor = getattr(env.transport, "actor", None)
    if actor is None:
        return lambda: [closed.state.episode_id for closed in AsyncCounterEnv.closed]
    import ray

    in_actor = lambda host: [closed.state.episode_id for closed in AsyncCounterEnv.closed]  # noqa: E731
    return lambda: list(ray.get(actor.handle.__ray_call__.remote(in_actor)))


async def test_close_mid_step_releases_the_environment(kind: str) -> None:
    episode = f"closed-mid-step-{uuid.uuid4().hex}"
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url:
            async with CounterClient(url) as env:
                await env.reset(episode_id=episode)
                closed = closed_episodes(env)
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(cancel_when_blocked, task_group.cancel_scope)  # the step has gone out
                    await env.step(CountAction(delay=0.5))
            # The server lets the step finish, then closes the environment.
            await wait_until(lambda: episode in closed())


async def test_unencodable_request_is_a_typed_error(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, DictEnv) as url, EnvClient(url) as env:
            with pytest.raises(openenv.EncodingError):
                await env.step({"value": object()})
            with pytest.raises(openenv.EncodingError):
                await env.reset(value={1, 2j})
            assert (await env.reset()).observation["hello"] == "world"


@pytest.mark.parametrize("scope", ["move_on_after", "fail_after", "shielded", "cancelled"])
async def test_close_works_under_any_cancel_scope(kind: str, scope: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url:
            env = await CounterClient(url).connect()
            await env.step(CountAction(by=1))
            if scope == "move_on_after":
                with anyio.move_on_after(LIMIT):
                    await env.close()
            elif scope == "fail_after":
                with anyio.fail_after(LIMIT):
                    await env.close()
            elif scope == "shielded":
                with anyio.CancelScope(shield=True):
                    await env.close()
            else:  # a scope cancelled already: closing still completes, bounded by its own limits
                with anyio.CancelScope() as cancelled:
                    cancelled.cancel()
                    await env.close()
            assert not env.is_connected
            async with CounterClient(url) as again:  # the server is unharmed
                assert (await again.step(CountAction(by=2))).observation.count == 2


async def test_clients_connected_by_task_group_children_are_used_and_closed_by_the_parent(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url:
            envs = [CounterClient(url) for _ in range(3)]
            async with anyio.create_task_group() as task_group:
                for env in envs:
                    task_group.start_soon(env.connect)
            for n, env in enumerate(envs):
                assert (await env.step(CountAction(by=n))).observation.count == n

            async def close(env: CounterClient) -> None:
                await env.close()

            # And closed from yet other tasks.
            async with anyio.create_task_group() as task_group:
                for env in envs:
                    task_group.start_soon(close, env)
            assert not any(env.is_connected for env in envs)


async def test_plain_dialect_timeout_keeps_the_session(kind: str) -> None:
    """A plain OpenEnv channel (no request ids) survives a timeout that elapsed before the request went out."""
    if kind == "http+poll":
        pytest.skip("the long-polling transport always numbers its requests")
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url:
            client = (
                CounterClient(url, subprotocols=[])
                if kind == "ws"
                else CounterClient(transport=InProcessTransport(factory=AsyncCounterEnv, dialect=openenv.Dialect()))
            )
            async with client as env:
                assert env.transport is not None
                assert not env.transport.dialect.request_ids
                await env.reset()
                for _ in range(20):
                    with pytest.raises(openenv.TimeoutError):
                        await env.step(CountAction(by=100), timeout=0)
                result = await env.step(CountAction(by=1))
                assert result.observation.count == 1

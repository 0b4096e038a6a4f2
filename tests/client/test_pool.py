"""EnvPool: many sessions as one object, over every transport, on both backends."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest

import openenv
from openenv import EnvClient, EnvPool, ReplacedStepResult
from openenv.server import Environment
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, CountState, SyncCounterEnv
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked
from tests.serving import TRANSPORTS, serving

LIMIT = 20  # seconds: the bound of every wait in these tests


class RendezvousEnv(Environment[CountAction, CountObservation, CountState]):
    """A step returns only once ``expected`` steps of its group have started: a pool stepping one at a time hangs.

    The groups live in the environment's own process (a Ray worker, for ray://).
    """

    groups: ClassVar[dict[str, tuple[list[int], anyio.Event]]] = {}

    def __init__(self) -> None:
        self._state = CountState()
        self._group = ""
        self._expected = 0

    async def reset(self, group: str = "", expected: int = 0, **kwargs: Any) -> CountObservation:
        self._group, self._expected = group, expected
        return CountObservation()

    async def step(self, action: CountAction) -> CountObservation:
        if self._group not in RendezvousEnv.groups:
            RendezvousEnv.groups[self._group] = ([], anyio.Event())
        arrived, everyone = RendezvousEnv.groups[self._group]
        arrived.append(action.by)
        if len(arrived) == self._expected:
            everyone.set()
        await everyone.wait()
        return CountObservation(count=action.by)

    @property
    def state(self) -> CountState:
        return self._state


def counter_actions(size: int) -> list[CountAction]:
    return [CountAction(by=index) for index in range(size)]


@pytest.fixture(params=TRANSPORTS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.mark.anyio
@pytest.mark.parametrize("factory", [AsyncCounterEnv, SyncCounterEnv])
async def test_reset_step_and_state_keep_the_order(kind: str, factory: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, factory) as url, EnvPool(url, size=5, client=CounterClient) as pool:
            assert len(pool) == len(pool.clients) == 5
            results = await pool.reset(start=[10, 20, 30, 40, 50], episode_id="same")
            assert [result.observation.count for result in results] == [10, 20, 30, 40, 50]
            results = await pool.step(counter_actions(5))
            assert [result.observation.count for result in results] == [10, 21, 32, 43, 54]
            assert [result.reward for result in results] == [0.0, 1.0, 2.0, 3.0, 4.0]
            states = await pool.state()
            assert [state.count for state in states] == [10, 21, 32, 43, 54]
            assert {state.episode_id for state in states} == {"same"}


@pytest.mark.anyio
async def test_steps_run_concurrently(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, RendezvousEnv) as url, EnvPool(url, size=8, client=CounterClient) as pool:
            await pool.reset(group=f"{kind}-{anyio.current_time()}", expected=8)
            results = await pool.step(counter_actions(8))
    assert [result.observation.count for result in results] == list(range(8))


@pytest.mark.anyio
async def test_sessions_spread_evenly_over_servers() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(AsyncCounterEnv, port=0) as a, openenv.serve(AsyncCounterEnv, port=0) as b:
            urls = [a.url.replace("http", "ws"), b.url.replace("http", "ws")]
            async with EnvPool(urls, size=6, client=CounterClient) as pool:
                await pool.reset()
                assert (a.app.state.sessions.active, b.app.state.sessions.active) == (3, 3)
                assert sorted(client.base_url for client in pool.clients) == sorted(urls * 3)


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_a_server_at_capacity_is_skipped(scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            openenv.serve(AsyncCounterEnv, port=0, max_sessions=1) as small,
            openenv.serve(AsyncCounterEnv, port=0) as large,
        ):
            urls = [server.url.replace("http", scheme) for server in (small, large)]
            async with EnvPool(urls, size=4, client=CounterClient, retry_interval=60.0) as pool:
                results = await pool.reset(start=[1, 2, 3, 4])
                assert [result.observation.count for result in results] == [1, 2, 3, 4]
                assert (small.app.state.sessions.active, large.app.state.sessions.active) == (1, 3)
                results = await pool.step(counter_actions(4))
                assert [result.observation.count for result in results] == [1, 3, 5, 7]


@pytest.mark.anyio
async def test_a_full_server_is_retried_until_it_has_room() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(AsyncCounterEnv, port=0, max_sessions=1) as server:
            url = server.url.replace("http", "ws")
            pool = EnvPool(url, size=1, client=CounterClient, retry_interval=0.01)
            firsts: list[EnvClient[Any, Any, Any]] = []
            entered = anyio.Event()
            results: list[openenv.StepResult[CountObservation]] = []

            async def use_the_pool() -> None:
                async with pool:
                    firsts.append(pool.clients[0])
                    entered.set()
                    results.extend(await pool.reset(start=[5]))

            async with anyio.create_task_group() as group, EnvPool(url, size=1, client=CounterClient) as holder:
                await holder.reset()
                group.start_soon(use_the_pool)
                await entered.wait()
                # The pool's first session is refused and replaced; then the holder leaves.
                while pool.clients[0] is firsts[0]:
                    await anyio.lowlevel.checkpoint()
            assert results[0].observation.count == 5


@pytest.mark.anyio
async def test_every_server_at_capacity_raises_after_the_placement_timeout() -> None:
    """The pool's waits (its retries, ``placement_timeout``) go by its clock: 30 s of retrying pass in no time."""
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with openenv.serve(AsyncCounterEnv, port=0, max_sessions=1) as server:
            url = server.url.replace("http", "ws")
            pool = EnvPool(url, size=2, client=CounterClient, retry_interval=1.0, placement_timeout=30.0, clock=clock)
            failures: list[openenv.EnvPoolError] = []

            async def reset() -> None:
                with pytest.raises(openenv.EnvPoolError) as info:
                    await pool.reset()
                failures.append(info.value)

            async with pool, anyio.create_task_group() as task_group:
                assert all(client._clock is clock for client in pool.clients)  # the clients' clock too
                task_group.start_soon(reset)
                while not failures:
                    await all_tasks_blocked()  # the refused session waits for its retry, or is connecting
                    if not failures:
                        clock.advance(1.0)
            assert 29.0 < clock.now() <= 33.0  # it gave up at its placement timeout, on its clock
            (error,) = failures[0].errors.values()
            assert isinstance(error, openenv.CapacityReachedError)
            assert "every server stayed at capacity for 30.0 s" in str(error)


@pytest.mark.anyio
async def test_a_refused_server_is_skipped_and_a_pool_without_any_raises_connect_error() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(AsyncCounterEnv, port=0) as gone:
            dead = gone.url.replace("http", "ws")
        async with openenv.serve(AsyncCounterEnv, port=0) as alive:
            urls = [dead, alive.url.replace("http", "ws")]
            async with EnvPool(urls, size=3, client=CounterClient, connect_timeout=5.0) as pool:
                await pool.reset()
                assert alive.app.state.sessions.active == 3
        with pytest.raises(openenv.ConnectError):
            async with EnvPool(dead, size=3, client=CounterClient):
                pass


@pytest.mark.anyio
async def test_raise_policy_reports_each_failed_index_and_the_others_go_on(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url, EnvPool(url, size=4, client=CounterClient) as pool:
            await pool.reset()
            actions = [CountAction(by=1), CountAction(fail=True), CountAction(by=1), CountAction(by="x")]  # type: ignore[arg-type]
            with pytest.raises(openenv.EnvPoolError) as info:
                await pool.step(actions)
            assert list(info.value.errors) == [1, 3]
            assert isinstance(info.value.errors[1], openenv.ExecutionError)
            assert isinstance(info.value.errors[3], openenv.ValidationError)
            assert info.value.__cause__ is info.value.errors[1]
            assert str(info.value).startswith("session 1 of the pool failed (and 1 more): ExecutionError")
            results = await pool.step(counter_actions(4))
            assert [result.observation.count for result in results] == [1, 1, 3, 3]


@pytest.mark.anyio
async def test_replace_policy_replaces_a_broken_session_and_reports_it(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving(kind, AsyncCounterEnv) as url,
            EnvPool(url, size=3, client=CounterClient, on_error="replace") as pool,
        ):
            await pool.reset(start=[1, 2, 3])
            await pool.step(counter_actions(3))
            broken, executing = pool.clients[0], pool.clients[2]
            transport = broken.transport
            assert transport is not None
            await transport.aclose()
            results = await pool.step([CountAction(), CountAction(), CountAction(fail=True)])
            assert [type(result) for result in results] == [ReplacedStepResult, openenv.StepResult, ReplacedStepResult]
            assert isinstance(results[0], ReplacedStepResult)
            assert isinstance(results[0].error, openenv.ConnectionClosed)
            assert isinstance(results[2], ReplacedStepResult)
            assert isinstance(results[2].error, openenv.ExecutionError)
            assert [result.observation.count for result in results] == [0, 4, 0]
            assert [result.done for result in results] == [True, False, True]
            assert pool.clients[0] is not broken
            assert pool.clients[2] is not executing
            assert pool.clients[0].is_connected
            assert not broken.is_connected
            results = await pool.step(counter_actions(3))
            assert [result.observation.count for result in results] == [0, 5, 2]


@pytest.mark.anyio
async def test_replace_policy_still_raises_a_callers_mistake(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving(kind, AsyncCounterEnv) as url,
            EnvPool(url, size=2, client=CounterClient, on_error="replace") as pool,
        ):
            await pool.reset()
            first = pool.clients[0]
            with pytest.raises(openenv.EnvPoolError) as info:
                await pool.step([{"by": "two"}, CountAction()])  # type: ignore[list-item]
            assert isinstance(info.value.errors[0], openenv.ValidationError)
            assert pool.clients[0] is first


@pytest.mark.anyio
async def test_auto_reset_resets_a_finished_episode_at_the_next_step(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving(kind, AsyncCounterEnv) as url,
            EnvPool(url, size=2, client=CounterClient, auto_reset=True) as pool,
        ):
            await pool.reset(start=[0, 5])
            results = await pool.step([CountAction(by=1), CountAction(by=5)])
            assert [(result.observation.count, result.done) for result in results] == [(1, False), (10, True)]
            results = await pool.step([CountAction(by=1), CountAction(by=100)])
            assert [(result.observation.count, result.done) for result in results] == [(2, False), (0, False)]
            results = await pool.step([CountAction(by=1), CountAction(by=3)])
            assert [result.observation.count for result in results] == [3, 3]


@pytest.mark.anyio
async def test_without_auto_reset_a_finished_episode_is_stepped(kind: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(kind, AsyncCounterEnv) as url, EnvPool(url, size=1, client=CounterClient) as pool:
            await pool.reset(start=9)
            assert (await pool.step([CountAction()]))[0].done
            assert (await pool.step([CountAction()]))[0].observation.count == 11


@pytest.mark.anyio
async def test_bad_arguments_and_lifecycle_errors() -> None:
    with pytest.raises(ValueError, match="at least one session"):
        EnvPool("inproc://x:y", size=0)
    with pytest.raises(ValueError, match="at least one URL"):
        EnvPool([], size=1)
    with pytest.raises(ValueError, match="on_error"):
        EnvPool("inproc://x:y", size=1, on_error="ignore")  # type: ignore[arg-type]
    url = "inproc://tests.envs:AsyncCounterEnv"
    pool = EnvPool(url, size=2, client=CounterClient)
    with pytest.raises(openenv.ClientStateError, match="not open"):
        await pool.reset()
    with anyio.fail_after(LIMIT):
        async with pool:
            with pytest.raises(ValueError, match="one value per session: 2, not 3"):
                await pool.reset(start=[1, 2, 3])
            with pytest.raises(ValueError, match="one action per session"):
                await pool.step([CountAction()])
            for one in (CountAction(), {"by": 1}):  # one action, not a list: said so, not "no len()"
                with pytest.raises(TypeError, match=r"a list of actions, one per session \(2\).*\[action\] \* pool"):
                    await pool.step(one)  # type: ignore[arg-type]
            results = await pool.reset(episode_id=("a", "b"))  # type: ignore[arg-type]
            assert len(results) == 2
        with pytest.raises(openenv.ClientStateError, match="closed"):
            await pool.step(counter_actions(2))
        with pytest.raises(openenv.ClientStateError, match="only once"):
            await pool.__aenter__()
    assert not any(client.is_connected for client in pool.clients)


@pytest.mark.anyio
async def test_a_failing_open_closes_the_sessions_already_open() -> None:
    with anyio.fail_after(LIMIT):
        async with openenv.serve(AsyncCounterEnv, port=0) as server:
            urls = iter([server.url.replace("http", "ws")] * 2 + ["nope://x"])

            def client(url: str, **options: Any) -> CounterClient:
                return CounterClient(next(urls), **options)

            pool = EnvPool(server.url, size=3, client=client, max_connecting=1)
            with pytest.raises(openenv.UnsupportedSchemeError):
                await pool.__aenter__()
            assert len(pool.clients) == 2
            assert not any(client.is_connected for client in pool.clients)


def test_sync_pool() -> None:
    url = "inproc://tests.envs:AsyncCounterEnv"
    with EnvPool(url, size=3, client=CounterClient).sync(backend="trio") as pool:
        assert pool.size == 3
        results = pool.reset(start=[1, 2, 3])
        assert [result.observation.count for result in results] == [1, 2, 3]
        results = pool.step(counter_actions(3))
        assert [result.observation.count for result in results] == [1, 3, 5]
        assert [state.count for state in pool.state()] == [1, 3, 5]
    with pytest.raises(openenv.ClientStateError, match="not open"):
        pool.reset()


@pytest.mark.anyio
async def test_an_error_in_the_block_comes_out_as_itself() -> None:
    async def use_the_pool() -> None:
        async with EnvPool("inproc://tests.envs:AsyncCounterEnv", size=2, client=CounterClient) as pool:
            await pool.reset()
            raise KeyError("mine")

    with anyio.fail_after(LIMIT), pytest.raises(KeyError):
        await use_the_pool()

"""The blocking client's own lane: requests written and replies read in the caller's thread, on a real server.

Each test serves an environment on a real server (uvicorn under asyncio,
hypercorn under trio: the test's own backend) and drives `SyncEnvClient`s from
worker threads, on both of the facade's backends. The lane is a shortcut: what
it cannot do (a ping, a dropped connection, a session the server ends, a
timeout's late reply) goes through the event loop, and the caller sees what the
async client would show.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar, cast

import anyio
import anyio.to_thread
import pytest
from websockets.asyncio.server import ServerConnection, serve

import openenv
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, MessageAction, MessageEchoEnv
from tests.helpers import CounterClient, all_tasks_blocked, loop_calls, proxied, wait_until
from tests.serving import factory_path
from transports.shared._public_io import public_io_only
from transports.websocket import WebSocketTransport
from transports.websocket._link_lane import LinkLane

pytestmark = pytest.mark.anyio

BACKENDS = ["asyncio", "trio"]
LANES = not public_io_only()  # OPENENV_PUBLIC_IO=1 turns the lane off: every call goes through the event loop

_T = TypeVar("_T")


class _StepsUntilReleased(AsyncCounterEnv):
    """A step by 0 waits for `released` (its client gives up meanwhile); the others do not."""

    released: ClassVar[anyio.Event]

    async def step(self, action: CountAction) -> CountObservation:
        if action.by == 0:
            await type(self).released.wait()
        return await super().step(action)


async def in_thread(function: Callable[[], _T]) -> _T:
    """Run blocking client code in a worker thread, bounded."""
    with anyio.fail_after(60):
        return await anyio.to_thread.run_sync(function)


def run_threads(worker: Callable[[int], None], count: int) -> list[BaseException]:
    """Run ``worker(0)`` to ``worker(count - 1)``, each in a thread of its own, to their ends; what they raised."""
    errors: list[BaseException] = []

    def guarded(number: int) -> None:
        try:
            worker(number)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(number,)) for number in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    return errors


def transport_of(env: openenv.SyncEnvClient[Any, Any, Any]) -> WebSocketTransport:
    transport = env.client.transport
    assert isinstance(transport, WebSocketTransport)
    return transport


@pytest.mark.parametrize("backend", BACKENDS)
async def test_steps_are_made_in_the_caller_s_thread_and_match_their_replies(backend: str) -> None:
    async with openenv.serve(factory_path(MessageEchoEnv)) as server:

        def run() -> list[str]:
            with loop_calls() as finished, openenv.EnvClient(server.url).sync(backend=backend) as env:
                env.reset()
                echoed = [env.step(MessageAction(message=f"m{i}")).observation["echoed_message"] for i in range(50)]
                assert env.state()["step_count"] == 50
                assert transport_of(env).lent is LANES
                assert (finished == []) is LANES  # not one request went through the event loop
            return echoed

        assert await in_thread(run) == [f"m{i}" for i in range(50)]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_64_sync_clients_stepped_in_one_thread_ride_one_connection(backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv), max_sessions=64) as server, proxied(server) as proxy:
        url = f"ws://127.0.0.1:{proxy.port}"

        def run() -> list[int]:
            envs = [CounterClient(url).sync(backend=backend) for _ in range(64)]
            try:
                for env in envs:
                    env.connect().reset()
                for round_ in range(3):
                    for amount, env in enumerate(envs):
                        env.step(CountAction(by=amount + round_))
                return [env.state().step_count for env in envs]
            finally:
                for env in envs:
                    env.close()

        assert await in_thread(run) == [3] * 64
        assert proxy.connections == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sync_clients_in_many_threads_share_a_connection_and_get_their_own_replies(backend: str) -> None:
    async with openenv.serve(factory_path(MessageEchoEnv)) as server, proxied(server) as proxy:
        url = f"ws://127.0.0.1:{proxy.port}"
        ready = threading.Barrier(16)

        def worker(number: int) -> None:
            with openenv.EnvClient(url).sync(backend=backend) as env:
                env.reset()
                ready.wait(timeout=30)  # every thread steps at once
                for i in range(40):
                    message = f"{number}-{i}"
                    assert env.step(MessageAction(message=message)).observation["echoed_message"] == message

        assert await in_thread(lambda: run_threads(worker, 16)) == []
        assert proxy.connections == 1


@pytest.mark.parametrize("backend", BACKENDS)
async def test_sync_clients_connecting_while_others_step_lose_no_reply(backend: str) -> None:
    # Each connect takes the link back from the stepping threads, on the event loop, at once with the others.
    async with openenv.serve(factory_path(MessageEchoEnv), max_sessions=64) as server:

        def worker(number: int) -> None:
            with openenv.EnvClient(server.url).sync(backend=backend) as env:
                for i in range(30):
                    message = f"{number}-{i}"
                    result = env.step(MessageAction(message=message), timeout=20)
                    assert result.observation["echoed_message"] == message

        assert await in_thread(lambda: run_threads(worker, 48)) == []


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_timeout_on_the_lane_leaves_the_client_usable_and_drops_the_late_reply(backend: str) -> None:
    _StepsUntilReleased.released = anyio.Event()
    async with openenv.serve(factory_path(_StepsUntilReleased)) as server:
        env = CounterClient(server.url).sync(backend=backend)
        await in_thread(env.connect)
        try:
            await in_thread(env.reset)
            with pytest.raises(TimeoutError, match=r"no reply within 0\.2 s"):
                await in_thread(lambda: env.step(CountAction(by=0), timeout=0.2))
            _StepsUntilReleased.released.set()  # its reply comes now, late
            result = await in_thread(lambda: env.step(CountAction(by=5)))
            assert result.observation.count == 5  # the late reply was dropped, not taken for this one
            assert (await in_thread(env.state)).step_count == 2
        finally:
            await in_thread(env.close)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_connection_dropped_while_lent_is_resumed_and_no_step_is_lost(backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv)) as server, proxied(server) as proxy:
        env = CounterClient(f"ws://127.0.0.1:{proxy.port}").sync(backend=backend)
        await in_thread(env.connect)
        try:
            await in_thread(lambda: env.step(CountAction(by=1)))
            assert transport_of(env).lent is LANES
            assert proxy.cut() == 1
            with loop_calls() as finished:
                for _ in range(3):
                    await in_thread(lambda: env.step(CountAction(by=1)))
            assert finished  # the drop went through the event loop, which resumed the link
            assert transport_of(env).resumes == 1
            assert (await in_thread(env.state)).step_count == 4
            assert transport_of(env).lent is LANES  # and lent it again
        finally:
            await in_thread(env.close)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_the_server_ending_the_session_is_raised_as_the_async_client_raises_it(backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv), max_sessions=1) as server:
        first = CounterClient(server.url).sync(backend=backend)
        second = CounterClient(server.url).sync(backend=backend)
        await in_thread(first.connect)
        await in_thread(second.connect)
        try:
            await in_thread(first.reset)
            with pytest.raises(openenv.CapacityReachedError):
                await in_thread(second.reset)
            with pytest.raises(openenv.ConnectionClosed):
                await in_thread(second.reset)
            assert (await in_thread(lambda: first.step(CountAction(by=2)))).observation.count == 2
        finally:
            await in_thread(second.close)
            await in_thread(first.close)


@pytest.mark.skipif(not LANES, reason="OPENENV_PUBLIC_IO=1: no lane")
@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_link_left_idle_goes_back_to_the_event_loop_and_is_lent_again(backend: str) -> None:
    async with openenv.serve(factory_path(AsyncCounterEnv)) as server:
        env = CounterClient(server.url).sync(backend=backend)
        await in_thread(env.connect)
        try:
            await in_thread(lambda: env.step(CountAction(by=1)))
            assert transport_of(env).lent
            # Its keeper takes it back once no thread used it for a second: the server's pings are answered.
            with anyio.fail_after(30):
                await wait_until(lambda: not transport_of(env).lent, "the keeper to take the link back")
            assert (await in_thread(lambda: env.step(CountAction(by=1)))).observation.count == 2
            assert transport_of(env).lent
        finally:
            await in_thread(env.close)


@asynccontextmanager
async def pinging_server(pongs: list[bool]) -> AsyncIterator[str]:
    """A plain OpenEnv echo (no subprotocol) that pings the client before every reply; each pong noted."""

    async def handler(connection: ServerConnection) -> None:
        async for message in connection:
            pong = await connection.ping()
            await connection.send(
                b'{"type":"observation","data":{"observation":{"echoed_message":"x"},"reward":0.0,"done":false}}'.decode()
            )
            with anyio.move_on_after(10):
                await pong
                pongs.append(True)
                continue
            pongs.append(False)
            assert message

    async with serve(handler, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"ws://127.0.0.1:{port}"


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the websockets server runs on asyncio
@pytest.mark.parametrize("backend", BACKENDS)
async def test_pings_that_come_while_the_link_is_lent_are_answered(backend: str) -> None:
    pongs: list[bool] = []
    async with pinging_server(pongs) as url:

        def run() -> None:
            with openenv.EnvClient(url).sync(backend=backend) as env:
                for _ in range(20):
                    assert env.step({"message": "x"}).observation["echoed_message"] == "x"

        await in_thread(run)
        with anyio.fail_after(30):
            await wait_until(lambda: len(pongs) == 20, "every pong")
    assert pongs == [True] * 20


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_subclass_s_own_step_runs_on_the_event_loop(backend: str) -> None:
    class Doubling(CounterClient):
        async def step(self, action: CountAction, **options: Any) -> Any:
            return await super().step(CountAction(by=action.by * 2), **options)

    async with openenv.serve(factory_path(AsyncCounterEnv)) as server:

        def run() -> int:
            with Doubling(server.url).sync(backend=backend) as env:
                return int(env.step(CountAction(by=3)).observation.count)

        assert await in_thread(run) == 6


async def test_of_two_tasks_taking_a_lent_link_back_at_once_one_takes_it() -> None:
    # The other leaves the link (and the reading it then holds) to the first: releasing it twice lost replies.
    lane = LinkLane(cast(Any, None))
    lane.lend()
    taken: list[object] = []
    lane.mutex.acquire()  # a thread hands out frames: both tasks must wait
    try:
        async with anyio.create_task_group() as task_group:
            for _ in range(2):
                task_group.start_soon(lambda: _take_back(lane, taken))
            await all_tasks_blocked()  # both wait for the lock
            assert taken == []
            lane.mutex.release()
    finally:
        if lane.mutex.locked():
            lane.mutex.release()
    assert sorted(taken, key=lambda item: item is None) == [([], None, False), None]
    assert not lane.held


async def _take_back(lane: LinkLane, taken: list[object]) -> None:
    with anyio.fail_after(10):
        result = await lane.take_back()
    taken.append(None if result is None else result[1:])

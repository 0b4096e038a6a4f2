"""Links: what every session is promised holds when many share one connection (issue 21, item 7).

Each test opens several sessions from one process to one real server (uvicorn
on asyncio, hypercorn+websockets on trio), so that they ride one link, and
checks that each is served as a connection of its own would serve it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

import openenv
from openenv import EnvPool, FinalStepResult
from openenv._inline import TRIAL_CALLS
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, SyncCounterEnv
from tests.helpers import CounterClient, ManualClock, wait_until
from tests.server.test_server_app import RawWebSocket
from transports.link import _host as _link_host
from transports.server.app import create_app
from transports.server.runner import RunningServer, ServerName, current_backend, serve
from transports.websocket import WebSocketTransport
from transports.websocket import _link as websocket_link
from transports.websocket import _link_write as link_write

pytestmark = pytest.mark.anyio

LIMIT = 30  # seconds: the bound of every test's waits


@pytest.fixture(params=[("asyncio", "uvicorn"), ("trio", "hypercorn+websockets")], ids=["asyncio-uvicorn", "trio"])
def backend_and_server(request: pytest.FixtureRequest) -> tuple[str, ServerName]:
    pair: tuple[str, ServerName] = request.param
    return pair


@pytest.fixture
def anyio_backend(backend_and_server: tuple[str, ServerName]) -> str:
    return backend_and_server[0]


@asynccontextmanager
async def serving(factory: Any = AsyncCounterEnv, **options: Any) -> AsyncIterator[RunningServer]:
    name: ServerName = "uvicorn" if current_backend() == "asyncio" else "hypercorn+websockets"
    async with serve(factory, server=name, **options) as server:
        yield server


def link_of(env: openenv.EnvClient[Any, Any, Any]) -> object:
    transport = env.transport
    assert isinstance(transport, WebSocketTransport)
    assert transport.shared
    return transport._link


@asynccontextmanager
async def clients(url: str, count: int, **options: Any) -> AsyncIterator[list[CounterClient]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(CounterClient(url, **options)) for _ in range(count)]


def active(server: RunningServer) -> int:
    count: int = server.app.state.sessions.active
    return count


async def test_sessions_of_one_process_share_one_connection_and_each_is_its_own() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server, clients(server.url, 3) as envs:
            assert len({id(link_of(env)) for env in envs}) == 1
            for n, env in enumerate(envs):
                await env.reset(start=10 * n)

            async def steps(env: CounterClient, by: int) -> None:
                for _ in range(5):
                    await env.step(CountAction(by=by))

            async with anyio.create_task_group() as task_group:
                for n, env in enumerate(envs):
                    task_group.start_soon(steps, env, n + 1)
            assert [(await env.state()).count for env in envs] == [5, 20, 35]
            assert active(server) == 3  # sessions, not connections


@pytest.mark.parametrize("server_name", ["hypercorn", "uvicorn"])
async def test_a_link_its_client_closes_ends_at_once_on_every_server(server_name: ServerName) -> None:
    """Plain hypercorn reports a client's closing handshake as 1006 (a drop); the `End` on channel 0 says not."""
    if server_name == "uvicorn" and current_backend() == "trio":
        pytest.skip("uvicorn runs on asyncio only")
    with anyio.fail_after(LIMIT):
        # Held for a resumption, the link would outlive the test's bound many times over.
        async with serve(AsyncCounterEnv, server=server_name, resume_timeout=10 * LIMIT) as server:
            links = server.app.state.websocket._links
            async with clients(server.url, 2) as envs:
                for env in envs:
                    await env.step(CountAction(by=1))
                assert len(links) == 1
            await wait_until(lambda: not links, "the link ends")


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_an_async_client_starts_no_thread(scheme: str) -> None:
    """Connected in one task, stepped in others, closed in yet another: its idle work runs in its owner's tasks."""
    with anyio.fail_after(LIMIT):
        async with serving() as server:
            url = server.url.replace("http", scheme, 1)
            before = {thread.ident for thread in threading.enumerate()}
            envs = [CounterClient(url) for _ in range(2)]
            async with anyio.create_task_group() as task_group:
                for env in envs:
                    task_group.start_soon(env.connect)
            async with anyio.create_task_group() as task_group:
                for env in envs:
                    task_group.start_soon(env.step, CountAction(by=1))
            async with CounterClient(url) as owned:  # an owner: it runs the link's keeper in a task of its own
                await owned.step(CountAction(by=1))
            async with anyio.create_task_group() as task_group:
                for env in envs:
                    task_group.start_soon(env.close)
            started = [thread.name for thread in threading.enumerate() if thread.ident not in before]
            assert started == []


async def test_max_sessions_counts_sessions_on_a_link_and_a_refusal_ends_only_its_own() -> None:
    with anyio.fail_after(LIMIT):
        async with serving(max_sessions=2) as server, clients(server.url, 3) as envs:
            first, second, third = envs
            assert (await first.step(CountAction(by=1))).observation.count == 1
            assert (await second.step(CountAction(by=2))).observation.count == 2
            with pytest.raises(openenv.CapacityReachedError):
                await third.step(CountAction())
            with pytest.raises(openenv.ConnectionClosed):
                await third.state()
            assert (await first.step(CountAction(by=1))).observation.count == 2  # unharmed
            assert active(server) == 2


async def test_the_admission_queue_admits_a_link_session_when_a_slot_frees() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving(max_sessions=1, queue_timeout=LIMIT) as server,
            CounterClient(server.url) as holder,
            CounterClient(server.url) as waiting,
        ):
            await holder.reset()
            counts: list[int] = []

            async def wait_for_a_slot() -> None:
                counts.append((await waiting.step(CountAction(by=7))).observation.count)

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(wait_for_a_slot)
                await wait_until(lambda: server.app.state.sessions.queued == 1, "the second session waits")
                assert counts == []
                await holder.close()  # its slot goes to the session queued on the same link
            assert counts == [7]


async def test_a_quiet_session_on_a_live_link_is_never_ended_as_idle() -> None:
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        name: ServerName = "uvicorn" if current_backend() == "asyncio" else "hypercorn+websockets"
        app = create_app(AsyncCounterEnv, session_idle_timeout=600.0, clock=clock)
        async with serve(app, server=name) as server, clients(server.url, 2) as (quiet, busy):
            await quiet.reset()
            await busy.reset()
            await clock.advance_when_blocked(400.0)
            await busy.step(CountAction())
            await clock.advance_when_blocked(805.0)  # quiet for 1,205 s: twice its idle timeout
            assert active(server) == 2
            assert (await quiet.step(CountAction())).observation.count == 1  # the same episode, not a new one
            assert (await busy.step(CountAction())).observation.count == 2


async def test_a_session_the_server_ends_on_a_link_ends_alone() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server, clients(server.url, 2) as (ended, other):
            await ended.reset()
            await other.reset()
            # The first client opened its channel first, on the one connection: the lower number is its.
            first = min(server.app.state.sessions.leases(), key=lambda lease: lease.id)
            first.request_close("asked to end")
            await wait_until(lambda: active(server) == 1, "the session is ended")
            with pytest.raises(openenv.ConnectionClosed, match="asked to end"):
                await ended.step(CountAction())
            assert (await other.step(CountAction())).observation.count == 1


class WaitsWhenAskedEnv(AsyncCounterEnv):
    """Steps without waiting, unless asked to: then it sets ``waiting`` (if given) and waits in a scope of its own."""

    def __init__(self, waiting: anyio.Event | None = None) -> None:
        super().__init__()
        self.waiting = waiting

    async def step(self, action: CountAction) -> CountObservation:
        if action.delay:
            if self.waiting is not None:
                self.waiting.set()
            with anyio.fail_after(10 * LIMIT):
                await anyio.sleep(action.delay)
        return await super().step(CountAction(by=action.by))


async def _steps_at_once(envs: list[CounterClient]) -> None:
    """Enough quick steps that the link's host trusts the calls not to wait, and runs them in its own task."""
    for _ in range(TRIAL_CALLS // len(envs) + 2):
        for env in envs:
            await env.step(CountAction(by=0))


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_a_step_that_waits_after_many_that_did_not_finishes_where_it_began(scheme: str) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(WaitsWhenAskedEnv) as server:
            url = server.url.replace("http", scheme, 1)
            async with clients(url, 2) as envs:
                await _steps_at_once(envs)
                results: list[int] = []

                async def wait_then_count(env: CounterClient) -> None:
                    results.append((await env.step(CountAction(by=1, delay=0.01))).observation.count)

                async with anyio.create_task_group() as task_group:
                    for env in envs:
                        task_group.start_soon(wait_then_count, env)
                assert results == [1, 1]
                assert [(await env.step(CountAction(by=1))).observation.count for env in envs] == [2, 2]


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_a_step_given_up_while_it_waits_in_the_links_task_ends_only_its_session(scheme: str) -> None:
    waiting = anyio.Event()
    clock = ManualClock()  # the server's: only the step the test lets run long passes the step timeout
    app = create_app(lambda: WaitsWhenAskedEnv(waiting), step_timeout=30.0, clock=clock)
    with anyio.fail_after(LIMIT):
        async with serving(app) as server:
            url = server.url.replace("http", scheme, 1)
            async with clients(url, 2) as (slow, other):
                await _steps_at_once([slow, other])

                async def run_past_the_step_timeout() -> None:
                    await waiting.wait()
                    await clock.advance_when_blocked(31.0)

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(run_past_the_step_timeout)
                    with pytest.raises(openenv.ConnectionClosed, match="step timeout"):
                        await slow.step(CountAction(by=1, delay=5 * LIMIT))
                assert (await other.step(CountAction(by=1))).observation.count == 1
                await wait_until(lambda: active(server) == 1, "the slow session's slot is freed")


@pytest.mark.parametrize("scheme", ["ws", "http+poll"])
async def test_the_rest_of_a_message_cut_short_by_a_give_up_is_still_answered(scheme: str) -> None:
    """A step given up while it waits in the link's task: the steps after it in the same message go on."""
    waiting = anyio.Event()
    clock = ManualClock()
    app = create_app(lambda: WaitsWhenAskedEnv(waiting), step_timeout=30.0, clock=clock)
    with anyio.fail_after(LIMIT):
        async with serving(app) as server:
            url = server.url.replace("http", scheme, 1)
            async with EnvPool(url, size=3, client=CounterClient) as pool:
                await pool.reset()
                await _steps_at_once(list(pool.clients))

                async def run_past_the_step_timeout() -> None:
                    await waiting.wait()
                    await clock.advance_when_blocked(31.0)

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(run_past_the_step_timeout)
                    # One message: the first step waits and is given up; the two after it were not run yet.
                    await pool.send([CountAction(by=1, delay=5 * LIMIT), CountAction(by=1), CountAction(by=2)])
                    with pytest.raises(openenv.EnvPoolError) as info:
                        await pool.recv()
                assert list(info.value.errors) == [0]
                assert "step timeout" in str(info.value.errors[0])
                assert (await pool.clients[1].step(CountAction(by=1))).observation.count == 2
                assert (await pool.clients[2].step(CountAction(by=1))).observation.count == 3
                await wait_until(lambda: active(server) == 2, "the given-up session's slot is freed")


@pytest.mark.parametrize("factory", [AsyncCounterEnv, SyncCounterEnv])
async def test_bad_input_and_a_raising_environment_reach_no_other_session(factory: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with serving(factory) as server, clients(server.url, 2) as (bad, good):
            await bad.reset()
            await good.reset()
            with pytest.raises(openenv.ValidationError):
                await bad.step({"by": "two"})  # type: ignore[arg-type]
            with pytest.raises(openenv.ExecutionError):
                await bad.step(CountAction(fail=True))
            assert (await good.step(CountAction(by=3))).observation.count == 3
            assert (await bad.step(CountAction(by=1))).observation.count == 1  # and it goes on


async def test_a_frame_over_the_servers_limit_ends_only_its_session() -> None:
    with anyio.fail_after(LIMIT):
        async with serving(max_message_size=64 * 1024) as server, clients(server.url, 2) as (sender, bystander):
            await bystander.reset()
            await sender.reset()
            with pytest.raises(openenv.ConnectionClosed, match="1009"):
                await sender.reset(note="x" * 100_000)
            assert (await bystander.step(CountAction(by=2))).observation.count == 2
            await wait_until(lambda: active(server) == 1, "the sender's session is over")


async def test_a_token_is_checked_once_per_connection_and_a_wrong_one_shares_nothing() -> None:
    with anyio.fail_after(LIMIT):
        async with serving(auth_token="s3cret") as server, clients(server.url, 2, auth_token="s3cret") as envs:
            assert link_of(envs[0]) is link_of(envs[1])
            await envs[0].reset()
            with pytest.raises(openenv.AuthenticationError):
                async with CounterClient(server.url, auth_token="wrong"):
                    pass
            assert (await envs[1].step(CountAction())).observation.count == 1


async def test_a_message_that_is_not_an_envelope_ends_only_its_link(caplog: pytest.LogCaptureFixture) -> None:
    with anyio.fail_after(LIMIT), caplog.at_level(logging.WARNING):
        async with serving() as server, CounterClient(server.url) as bystander:
            await bystander.reset()
            deep = "[" * 2000 + "]" * 2000
            for bad in ("not json", deep, '[[1,1,0,{"type":"reset"}]]'):  # the last: no channel was opened
                async with RawWebSocket.connect(server.ws_url, ["openenv.v2.json"]) as ws:
                    assert ws.subprotocol == "openenv.v2.json"
                    await ws.receive()  # the Hello
                    await ws.send_text(bad)
                    assert (await ws.expect_close()).code == 1002
            assert (await bystander.step(CountAction())).observation.count == 1
    assert "Traceback" not in caplog.text


async def test_a_client_faster_than_its_sessions_is_held_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_link_host, "MAX_WAITING_FRAMES", 8)
    with anyio.fail_after(LIMIT):
        async with serving() as server, RawWebSocket.connect(server.ws_url, ["openenv.v2.json"]) as ws:
            await ws.receive()  # the Hello
            await ws.send_text('[[1,0,0,{"type":"open"}],[1,1,0,{"type":"reset","data":{}}]]')
            await ws.receive()
            step = '[1,%d,1,{"type":"step","data":{"by":1,"delay":5}}]'
            # Each step waits 5 s; more than the bound of them wait their turn: the server reads no more.
            envelope = "[" + ",".join(step % seq for seq in range(2, 40)) + "]"
            sent = await ws.flood(lambda protocol: protocol.send_text(envelope.encode()), limit=64 * 2**20)
            assert sent < 64 * 2**20


async def test_send_and_recv_keep_what_each_result_is() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            serving() as server,
            EnvPool(server.url, size=3, client=CounterClient, autoreset_mode="same_step") as pool,
        ):
            await pool.reset(start=[0, 0, 9])  # the third ends its episode at its next step (count 10)
            await pool.send([CountAction(by=1)] * 3)
            results = await pool.recv()
            assert sorted(results) == [0, 1, 2]
            assert not isinstance(results[0], FinalStepResult)
            final = results[2]
            assert isinstance(final, FinalStepResult)
            assert (final.done, final.final_observation.count, final.observation.count) == (True, 10, 0)


async def test_a_pool_larger_than_a_server_is_placed_or_told_why() -> None:
    with anyio.fail_after(LIMIT):
        async with serving(max_sessions=2) as server:
            pool = EnvPool(server.url, size=5, client=CounterClient, retry_interval=0.01, placement_timeout=0.2)
            async with pool:
                with pytest.raises(openenv.EnvPoolError) as info:
                    await pool.reset()
            assert len(info.value.errors) == 3
            assert all(isinstance(error, openenv.CapacityReachedError) for error in info.value.errors.values())


async def test_a_frame_that_is_not_one_value_ends_only_its_session() -> None:
    with anyio.fail_after(LIMIT):
        async with serving() as server, clients(server.url, 2) as (sender, bystander):
            await bystander.reset()
            transport = sender.transport
            assert transport is not None
            # Embedded as it is, it would break the whole message: the session gives up alone.
            with pytest.raises(openenv.ConnectionClosed, match="not one JSON value"):
                await transport.send(b'{"type": "step"} trailing')
            assert (await bystander.step(CountAction(by=4))).observation.count == 4
            await wait_until(lambda: active(server) == 1, "the sender's session is over")


async def test_a_batch_leaves_in_pieces_as_it_is_posted_and_each_reply_finds_its_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(link_write, "SEND_EVERY", 2)
    with anyio.fail_after(LIMIT):
        async with serving() as server, EnvPool(server.url, size=7, client=CounterClient) as pool:
            await pool.reset(start=list(range(7)))
            await pool.send([CountAction(by=1)] * 7)
            link = link_of(pool.clients[0])
            assert isinstance(link, websocket_link.Link)
            assert link._state is not None
            assert link._state.outgoing_count == 1  # six went out as they were posted, two at a time
            results = await pool.recv()
            assert [results[index].observation.count for index in range(7)] == [n + 1 for n in range(7)]


async def test_what_a_short_write_leaves_of_a_batch_is_written_before_the_replies_are_awaited(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write = link_write._send_now
    monkeypatch.setattr(link_write, "SEND_EVERY", 2)
    monkeypatch.setattr(link_write, "_send_now", lambda fd, data: write(fd, data[:40]))  # a full socket, always
    with anyio.fail_after(LIMIT):
        async with serving() as server, EnvPool(server.url, size=6, client=CounterClient) as pool:
            await pool.reset(start=list(range(6)))
            for steps in range(1, 4):
                results = await pool.step([CountAction(by=1)] * 6)  # every frame posted went out part-way
                assert [result.observation.count for result in results] == [n + steps for n in range(6)]

"""A link that carries one plain session lends its socket to that session's thread (`LinkHost.lend_to_lone_session`).

Our client and our server, as a user runs them: every `EnvClient` to the
server rides a link. On asyncio (uvicorn) a lone plain session's envelopes are
answered on the lent socket, which each test checks it was; on trio (hypercorn)
nothing is lent, and every test must pass the same. Whatever ends a loan (a
second session, a slow step, a ping, a close, the server ending the session, a
cut connection), the link's numbering stays whole: no step runs twice, no
reply is lost or misrouted.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import pytest

from openenv import ConnectionClosed, ExecutionError
from openenv.server import abandoned_calls
from tests.envs import CountAction, CountObservation, SyncCounterEnv
from tests.helpers import CounterClient, CuttingProxy, ManualClock, proxied, wait_until
from tests.link.test_resumption import endpoint, transport_of
from tests.server.test_server_app import registry_of
from tests.transports.websocket.test_socket_loan import check_lent, lends, lent_now, loans  # noqa: F401 (a fixture)
from transports.server.app import create_app
from transports.server.runner import RunningServer, serve
from transports.websocket._socket_loan import SocketLoan

pytestmark = [pytest.mark.anyio, pytest.mark.speed_path]

WAIT = 30.0  # seconds: the bound of every test's waits


class GatedCounterEnv(SyncCounterEnv):
    """A plain counter that records the steps it runs; a step with ``by=0`` waits at `gate` on its thread."""

    built: ClassVar[list[GatedCounterEnv]] = []
    entered: ClassVar[threading.Event] = threading.Event()
    gate: ClassVar[threading.Event] = threading.Event()

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.closed = False
        GatedCounterEnv.built.append(self)

    def step(self, action: CountAction) -> CountObservation:
        self.steps += 1
        if action.by == 0:
            GatedCounterEnv.entered.set()
            assert GatedCounterEnv.gate.wait(WAIT)
        return super().step(action)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh_env() -> Any:
    GatedCounterEnv.built.clear()
    GatedCounterEnv.entered.clear()
    GatedCounterEnv.gate.clear()
    yield
    GatedCounterEnv.gate.set()  # a test that failed mid-step leaves no thread waiting


@asynccontextmanager
async def counter_server(**options: Any) -> AsyncIterator[RunningServer]:
    async with serve(GatedCounterEnv, **options) as server:
        yield server


@asynccontextmanager
async def lent_session(
    loans: list[SocketLoan],  # noqa: F811
) -> AsyncIterator[tuple[RunningServer, CounterClient]]:
    """A counter server, and a client whose session is reset, stepped once (count 1), and lent the socket."""
    async with counter_server() as server, CounterClient(server.url) as env:
        await env.reset()
        await env.step(CountAction())
        await lent_now(loans)
        yield server, env


def active(server: RunningServer) -> int:
    return registry_of(server).active


async def test_a_lone_plain_session_is_answered_on_the_lent_socket(loans: list[SocketLoan]) -> None:  # noqa: F811
    with anyio.fail_after(WAIT):
        async with counter_server() as server:
            async with CounterClient(server.url) as env:
                assert transport_of(env).shared
                await env.reset()
                await lent_now(loans)
                for count in range(1, 21):
                    assert (await env.step(CountAction())).observation.count == count
                assert (await env.state()).count == 20
                check_lent(loans)
                if lends():
                    assert len(loans) < 20, "one loan serves many requests"
            # The session ends with its client; its slot is given back as its environment's close begins.
            await wait_until(lambda: all(built.closed for built in GatedCounterEnv.built), "the environment is closed")
            await wait_until(lambda: active(server) == 0, "the slot is given back")
    [built] = GatedCounterEnv.built
    assert (built.steps, built.closed) == (20, True)


async def test_a_second_session_ends_the_loan_and_both_go_on(loans: list[SocketLoan]) -> None:  # noqa: F811
    with anyio.fail_after(WAIT):
        async with counter_server() as server, CounterClient(server.url) as first:
            await first.reset()
            for _ in range(3):
                await first.step(CountAction())
            await lent_now(loans)
            async with CounterClient(server.url) as second:
                assert transport_of(second)._link is transport_of(first)._link  # one link for both
                await second.reset(start=100)
                if lends():
                    assert loans[0].stopped, "the second session's Open ended the loan"
                for round_ in range(1, 6):
                    one, other = await first.step(CountAction()), await second.step(CountAction(by=2))
                    assert (one.observation.count, other.observation.count) == (3 + round_, 100 + 2 * round_)
            assert (await first.step(CountAction())).observation.count == 9
            await lent_now(loans, count=2)  # alone again: lent again, from its next request on
            assert (await first.step(CountAction())).observation.count == 10
            assert (await first.state()).count == 10
            check_lent(loans, at_least=2)
    assert [built.steps for built in GatedCounterEnv.built] == [10, 5]


async def test_a_slow_step_gives_the_link_back_to_the_event_loop_for_another_session(
    loans: list[SocketLoan],  # noqa: F811
) -> None:
    with anyio.fail_after(WAIT):
        async with lent_session(loans) as (server, slow):
            results: list[int] = []

            async def blocked_step() -> None:
                results.append((await slow.step(CountAction(by=0))).observation.count)

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(blocked_step)
                await anyio.to_thread.run_sync(GatedCounterEnv.entered.wait, WAIT)
                # The step holds the thread the socket is lent to: a session opened now is served all the same.
                async with CounterClient(server.url) as quick:
                    await quick.reset()
                    for count in range(1, 4):
                        assert (await quick.step(CountAction())).observation.count == count
                if lends():
                    assert loans[0].stopped
                assert results == []
                GatedCounterEnv.gate.set()
            assert results == [1]
            assert (await slow.step(CountAction())).observation.count == 2
    assert [built.steps for built in GatedCounterEnv.built] == [3, 3]


async def test_requests_the_thread_leaves_are_answered_in_order_and_the_session_goes_on(
    loans: list[SocketLoan],  # noqa: F811
) -> None:
    with anyio.fail_after(WAIT):
        async with counter_server() as server, CounterClient(server.url) as env:
            await env.reset()
            await env.step(CountAction())
            for round_ in range(3):
                await lent_now(loans, count=round_ + 1)
                # A step that fails in the environment is answered on the thread; a tools/list is not.
                with pytest.raises(ExecutionError, match="asked to fail"):
                    await env.step(CountAction(fail=True))
                assert await env.list_tools() == []
                assert (await env.step(CountAction())).observation.count == round_ + 2
            check_lent(loans, at_least=3)
    [built] = GatedCounterEnv.built
    assert built.steps == 7


async def test_the_server_ending_a_lent_session_is_a_clear_error(loans: list[SocketLoan]) -> None:  # noqa: F811
    with anyio.fail_after(WAIT):
        async with lent_session(loans) as (server, env):
            [lease] = server.app.state.sessions.leases()
            await wait_until(lambda: lease.idle_since is not None, "the session waits for its client")
            lease.request_close("ended by the server")
            await wait_until(lambda: active(server) == 0, "the session ends")
            with pytest.raises(ConnectionClosed, match="ended by the server"):
                await env.step(CountAction())
            async with CounterClient(server.url) as again:  # the server goes on
                await again.reset()
                assert (await again.step(CountAction())).observation.count == 1
            await wait_until(lambda: all(built.closed for built in GatedCounterEnv.built), "both are closed")
    assert len(GatedCounterEnv.built) == 2


async def test_a_lent_session_asked_to_end_mid_step_ends_after_its_reply_with_no_request_of_its_client(
    loans: list[SocketLoan],  # noqa: F811
) -> None:
    with anyio.fail_after(WAIT):
        async with lent_session(loans) as (server, env):
            [lease] = server.app.state.sessions.leases()
            async with anyio.create_task_group() as task_group:

                async def ask_mid_step() -> None:
                    await anyio.to_thread.run_sync(GatedCounterEnv.entered.wait, WAIT)
                    lease.request_close("ended by the server")  # busy: it is left to finish its step
                    GatedCounterEnv.gate.set()

                task_group.start_soon(ask_mid_step)
                assert (await env.step(CountAction(by=0))).observation.count == 1
            await wait_until(lambda: active(server) == 0, "the session ends, its client asking nothing more")
            with pytest.raises(ConnectionClosed, match="ended by the server"):
                await env.step(CountAction())
    [built] = GatedCounterEnv.built
    assert (built.steps, built.closed) == (2, True)
    check_lent(loans)


async def test_a_lone_session_answered_from_a_task_is_lent_the_socket_again_before_its_next_request(
    loans: list[SocketLoan],  # noqa: F811
) -> None:
    with anyio.fail_after(WAIT):
        async with counter_server() as server, CounterClient(server.url) as first:
            await first.reset()
            results: list[int] = []

            async def step_first() -> None:
                results.append((await first.step(CountAction(by=0))).observation.count)

            async with anyio.create_task_group() as task_group:
                async with CounterClient(server.url) as second:  # two sessions: nothing is lent
                    await second.reset()
                    lent_before = len(loans)
                    task_group.start_soon(step_first)  # held on its thread, so answered from a task
                    await anyio.to_thread.run_sync(GatedCounterEnv.entered.wait, WAIT)
                await wait_until(lambda: active(server) == 1, "the second session is over")
                GatedCounterEnv.gate.set()
            assert results == [0]
            # Alone again, its reply posted from a task: the link lends the socket while it waits for
            # the client, with no request in between.
            await lent_now(loans, count=lent_before + 1)
            assert (await first.step(CountAction())).observation.count == 1
            check_lent(loans)
    assert [built.steps for built in GatedCounterEnv.built] == [2, 0]


async def test_a_reply_over_the_clients_limit_ends_only_that_session(loans: list[SocketLoan]) -> None:  # noqa: F811
    with anyio.fail_after(WAIT):
        async with counter_server() as server, CounterClient(server.url, max_message_size=2000) as env:
            await env.reset(episode_id="x" * 3000)
            await lent_now(loans)
            with pytest.raises(ConnectionClosed, match="over the client's limit of 2000 bytes"):
                await env.state()  # it holds the episode id: too large
            await wait_until(lambda: active(server) == 0, "the session ends")
            async with CounterClient(server.url) as again:
                await again.reset()
                assert (await again.step(CountAction())).observation.count == 1


async def test_a_lent_step_past_the_step_timeout_ends_its_session(loans: list[SocketLoan]) -> None:  # noqa: F811
    clock = ManualClock()  # the server's: only the step the test holds passes the step timeout
    app = create_app(GatedCounterEnv, max_sessions=2, step_timeout=30.0, clock=clock)
    with anyio.fail_after(WAIT):
        async with serve(app) as server:
            async with CounterClient(server.url) as env:
                await env.reset()
                await env.step(CountAction())
                await lent_now(loans)

                async def run_past_the_step_timeout() -> None:
                    await anyio.to_thread.run_sync(GatedCounterEnv.entered.wait, WAIT)
                    await clock.advance_when_blocked(31.0)

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(run_past_the_step_timeout)
                    with pytest.raises(ConnectionClosed, match="step timeout"):
                        await env.step(CountAction(by=0))
            await wait_until(lambda: active(server) == 0, "the slot is freed")
            assert abandoned_calls() == 1  # its thread runs on
            async with CounterClient(server.url) as again:
                await again.reset()
                assert (await again.step(CountAction())).observation.count == 1
            GatedCounterEnv.gate.set()
            await wait_until(lambda: abandoned_calls() == 0, "the thread is done")
    check_lent(loans)


async def test_a_cut_connection_resumes_a_lent_link_with_every_step_run_once(
    loans: list[SocketLoan],  # noqa: F811
) -> None:
    with anyio.fail_after(WAIT):
        async with counter_server() as server, proxied(server) as proxy:
            endpoint(server).resume_timeout = 3600
            async with CounterClient(f"ws://127.0.0.1:{proxy.port}") as env:
                await env.reset()
                for round_ in range(3):
                    await lent_now(loans, count=round_ + 1)
                    assert (await env.step(CountAction())).observation.count == 2 * round_ + 1
                    await _cut_mid_step(proxy, env, expected=2 * round_ + 2)
                assert transport_of(env).resumes == 3
                assert (await env.state()).count == 6
        check_lent(loans, at_least=3)
    [built] = GatedCounterEnv.built
    assert built.steps == 9


async def _cut_mid_step(proxy: CuttingProxy, env: CounterClient, *, expected: int) -> None:
    """Cut the connection while a step runs on the thread; it runs once, and its reply comes through the next one."""
    GatedCounterEnv.entered.clear()
    GatedCounterEnv.gate.clear()
    results: list[int] = []

    async def step() -> None:
        results.append((await env.step(CountAction(by=0))).observation.count)

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(step)
        await anyio.to_thread.run_sync(GatedCounterEnv.entered.wait, WAIT)
        assert proxy.cut() == 1
        GatedCounterEnv.gate.set()
    assert results == [expected - 1]  # by=0 counts nothing
    assert (await env.step(CountAction())).observation.count == expected

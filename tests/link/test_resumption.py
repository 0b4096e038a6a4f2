"""Resumable links, end to end: our client, our server, a TCP proxy between them that fails.

The proxy (`tests.helpers.CuttingProxy`) cuts connections, holds new ones, or
silences one (a dead path: nothing passes, nothing closes). Each test checks
what the caller of `EnvClient` sees, and what the environment on the server
did: the same instance goes on, and no step runs twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from openenv import ConnectionClosed
from tests.envs import AsyncCounterEnv, CountAction, CountObservation
from tests.helpers import CounterClient, CuttingProxy, ManualClock, proxied, wait_until
from transports.server.runner import RunningServer, serve
from transports.websocket import WebSocketTransport, offered_subprotocols
from transports.websocket._link_server import ServerLink
from transports.websocket._server import WebSocketEndpoint

pytestmark = pytest.mark.anyio

LIMIT = 30  # seconds: the bound of every test's waits


class CountingEnv(AsyncCounterEnv):
    """A counter that records each step it runs; a step waits at the record's gate while one is set."""

    def __init__(self, record: Record) -> None:
        super().__init__()
        self.record = record
        self.steps = 0
        record.built.append(self)

    async def step(self, action: CountAction) -> CountObservation:
        self.steps += 1
        record = self.record
        if record.gate is not None:
            record.entered.set()
            await record.gate.wait()
        return await super().step(action)


class Record:
    """The environments a server built, and the gate their steps wait at (if set)."""

    def __init__(self) -> None:
        self.built: list[CountingEnv] = []
        self.gate: anyio.Event | None = None
        self.entered = anyio.Event()

    def build(self) -> CountingEnv:
        return CountingEnv(self)


@asynccontextmanager
async def served(record: Record, *, resume_timeout: float = 3600, **options: Any) -> AsyncIterator[CuttingProxy]:
    """A server of ``record``'s environments behind a proxy; a long grace period unless given."""
    async with serve(record.build, **options) as server, proxied(server) as proxy:
        endpoint(server).resume_timeout = resume_timeout
        yield proxy


def endpoint(server: RunningServer) -> WebSocketEndpoint:
    websocket: WebSocketEndpoint = server.app.state.websocket
    return websocket


def server_of(proxy: CuttingProxy) -> RunningServer:
    upstream = proxy.upstream
    assert isinstance(upstream, RunningServer)
    return upstream


def link_of(proxy: CuttingProxy) -> ServerLink:
    """The server's side of the (one) link."""
    (link,) = endpoint(server_of(proxy))._links.values()
    return link


def holds_a_reply(link: ServerLink) -> bool:
    """Whether the server keeps a reply its client has not acknowledged (it went to a connection that is gone)."""
    return any(channel.unacked for channel in link._host.state.channels.values())


def active(proxy: CuttingProxy) -> int:
    count: int = server_of(proxy).app.state.sessions.active
    return count


def transport_of(env: CounterClient) -> WebSocketTransport:
    transport = env.transport
    assert isinstance(transport, WebSocketTransport)
    return transport


def url(proxy: CuttingProxy) -> str:
    return f"ws://127.0.0.1:{proxy.port}"


def test_the_link_subprotocols_are_offered_first() -> None:
    assert offered_subprotocols() == ["openenv.v2.json", "openenv.v1.json"]
    assert offered_subprotocols("msgpack", share=False) == ["openenv.v1.msgpack", "openenv.v1.json"]


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
async def test_an_episode_goes_on_over_a_cut_connection(encoding: str) -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy:
            async with CounterClient(url(proxy), encoding=encoding) as env:
                transport = transport_of(env)
                assert transport.resumable
                assert transport.subprotocol == f"openenv.v2.{encoding}"
                await env.reset()
                for count in (1, 2):
                    assert (await env.step(CountAction())).observation.count == count
                assert proxy.cut() == 1
                assert (await env.step(CountAction())).observation.count == 3
                assert proxy.cut() == 1  # and again
                assert (await env.state()).count == 3
                assert transport.resumes == 2
                assert (await env.step(CountAction(by=2))).observation.count == 5
            # One environment, each step run once; closed with the client, not after the grace period.
            assert [built.steps for built in record.built] == [4]
            assert proxy.connections == 3
            await wait_until(lambda: active(proxy) == 0, "the session ends when the client closes it")
            assert AsyncCounterEnv.closed == record.built


@pytest.mark.parametrize("reply_while_away", [True, False], ids=["replayed", "after-resuming"])
async def test_a_step_in_flight_when_the_connection_is_cut_runs_once_and_gets_its_reply(
    reply_while_away: bool,
) -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy)) as env:
            await env.reset()
            gate = record.gate = anyio.Event()
            results: list[int] = []

            async def step() -> None:
                results.append((await env.step(CountAction(by=3))).observation.count)

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(step)
                await record.entered.wait()  # the server runs the step
                link = link_of(proxy)
                if reply_while_away:
                    proxy.hold()  # the client cannot come back yet
                proxy.cut()
                if reply_while_away:
                    gate.set()  # the reply goes to a connection that is gone: the server keeps it
                    await wait_until(lambda: holds_a_reply(link), "the step's reply is kept")
                    proxy.release()
                else:
                    await wait_until(lambda: transport_of(env).resumes == 1, "the client is back")
                    gate.set()  # the reply goes out on the new connection
            assert results == [3]
            assert record.built[0].steps == 1
            assert (await env.state()).count == 3


async def test_a_request_lost_with_the_connection_is_sent_again() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy)) as env:
            await env.reset()
            proxy.silence()  # the step's request goes into the void

            async def cut_once_lost() -> None:
                await proxy.dropped.wait()
                proxy.cut()

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(cut_once_lost)
                assert (await env.step(CountAction())).observation.count == 1
            assert record.built[0].steps == 1
            assert transport_of(env).resumes == 1


async def test_a_silent_connection_is_found_by_the_keepalive_and_resumed() -> None:
    record = Record()
    clock = ManualClock()  # the keepalive's: no ping is missed but the one the test lets run out
    with anyio.fail_after(LIMIT):
        async with (
            served(record) as proxy,
            CounterClient(url(proxy), ping_interval=10, ping_timeout=20, clock=clock) as env,
        ):
            await env.reset()
            proxy.silence()  # no FIN, no RST: only the keepalive can tell

            async def let_the_ping_run_out() -> None:
                await clock.advance_when_blocked(10)  # a ping is due: it goes into the void
                await clock.advance_when_blocked(20)  # and no pong comes within the timeout

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(let_the_ping_run_out)
                assert (await env.step(CountAction())).observation.count == 1
            assert record.built[0].steps == 1
            assert transport_of(env).resumes == 1


async def test_the_grace_period_running_out_is_a_connection_closed_saying_so() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record, resume_timeout=0.2) as proxy, CounterClient(url(proxy)) as env:
            await env.reset()
            proxy.hold()
            proxy.cut()
            # How it dropped (EOF or a reset), then why it was not resumed.
            with pytest.raises(ConnectionClosed, match=r"^the connection to ws://.*; .* resumed within 0\.2 s$"):
                await env.step(CountAction())
            with pytest.raises(ConnectionClosed, match="could not be resumed"):
                await env.state()  # and so does every later call
            await wait_until(lambda: active(proxy) == 0, "the server ends the session too")
            assert record.built[0].steps == 0


async def test_a_session_the_server_gave_up_on_is_refused() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with (
            served(record, resume_timeout=0.2) as proxy,
            CounterClient(url(proxy), resume_timeout=LIMIT) as env,  # longer than the server keeps it
        ):
            await env.reset()
            proxy.hold()
            proxy.cut()
            await wait_until(lambda: active(proxy) == 0, "the server gives the session up")
            proxy.release()
            with pytest.raises(ConnectionClosed, match=r"refused it.*1008.*unknown or expired"):
                await env.step(CountAction())


async def test_a_restarted_server_refuses_the_session() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy)) as env:
            await env.reset()
            async with serve(record.build) as restarted:
                proxy.upstream = restarted  # knows no session
                proxy.cut()
                with pytest.raises(ConnectionClosed, match="could not be resumed: the server refused it"):
                    await env.step(CountAction())
            assert [built.steps for built in record.built] == [0]  # the new server built nothing


async def test_a_server_that_stays_down_is_retried_until_the_client_gives_up() -> None:
    record = Record()
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy), resume_timeout=600, clock=clock) as env:
            await env.reset()
            with anyio.CancelScope() as nothing:  # a port nobody listens on
                async with serve(record.build) as gone:
                    pass
                nothing.cancel()
            proxy.upstream = gone
            proxy.cut()
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(clock.keep_advancing, 30)  # ten minutes of retries pass on the client's clock
                with pytest.raises(ConnectionClosed, match=r"within 600 s \(the last attempt: .*\)"):
                    await env.step(CountAction(), timeout=None)
                task_group.cancel_scope.cancel()
            assert proxy.connections > 2  # it tried more than once


async def test_a_server_that_is_gone_fails_at_once() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with serve(record.build) as server:
            endpoint(server).resume_timeout = 3600  # the failure must not wait for this
            async with proxied(server) as proxy:
                env = await CounterClient(url(proxy)).connect()
                await env.reset()
            # The proxy is gone, its port closed: as a killed server's is.
            try:
                with pytest.raises(ConnectionClosed, match=r"the server is gone \(connection refused\)"):
                    await env.step(CountAction())
            finally:
                await env.close()


async def test_a_session_the_server_ends_is_not_resumed() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy)) as env:
            await env.reset()
            [lease] = server_of(proxy).app.state.sessions.leases()
            lease.request_close("ended by the server")
            await wait_until(lambda: active(proxy) == 0, "the server ends the session (close 1001)")
            with pytest.raises(ConnectionClosed, match="1001"):
                await env.step(CountAction())
            assert proxy.connections == 1
            assert transport_of(env).resumes == 0


@pytest.mark.speed_path
async def test_a_connection_the_client_closes_ends_the_session_at_once(anyio_backend: str) -> None:
    # Not under plain hypercorn, which tells the app of every close as of a drop (1006).
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy)) as env:
            assert server_of(proxy).server == ("uvicorn" if anyio_backend == "asyncio" else "hypercorn+websockets")
            await env.reset()
            # The closing handshake (1000) without a close request: the client will not come back.
            await transport_of(env).aclose()
            await wait_until(lambda: active(proxy) == 0, "the session ends, not after the grace period")
            assert proxy.connections == 1


async def test_without_resume_a_cut_ends_the_session() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy), resume=False) as env:
            transport = transport_of(env)
            assert (transport.subprotocol, transport.resumable) == ("openenv.v2.json", False)
            await env.reset()
            proxy.cut()
            with pytest.raises(ConnectionClosed):
                await env.step(CountAction())
            await wait_until(lambda: active(proxy) == 0, "the session ends with its connection")
            assert proxy.connections == 1


async def test_closing_while_resuming_stops_at_once() -> None:
    record = Record()
    with anyio.fail_after(LIMIT):
        async with served(record) as proxy, CounterClient(url(proxy)) as env:
            await env.reset()
            proxy.hold()
            proxy.cut()
            # Idle, its keeper (run by the `async with` block) notices the drop and tries to come back.
            await wait_until(lambda: proxy.connections == 2, "the client tries to come back")
            await env.close()
            with pytest.raises(ConnectionClosed):
                await transport_of(env).receive()

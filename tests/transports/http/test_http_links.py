"""HTTP long-polling links: many sessions of one process over one set of requests, with every promise kept.

Everything runs against a real embedded server (uvicorn under asyncio, hypercorn
under trio) on a loopback port. The guarantee tests break the network on purpose
(an httpx transport that loses requests and responses at random, a TCP proxy
that cuts connections) and check that every session gets every reply once and
its environment runs every request once; the protocol tests speak raw HTTP.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
import httpx
import msgspec
import pytest

import openenv
from openenv import ConnectionClosed
from tests.envs import AsyncCounterEnv, CountAction, SyncCounterEnv
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked, proxied, wait_until
from transports.http import HTTPLinkEndpoint, HTTPPollingTransport
from transports.http._link import IDLE_POLL, PollingLink
from transports.http._protocol import DEFAULT_MAX_WAIT
from transports.server.app import create_app
from transports.server.runner import RunningServer, serve

pytestmark = pytest.mark.anyio

LIMIT = 20  # seconds: the bound of every wait in these tests

JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def server(factory: Any = AsyncCounterEnv, **app_options: Any) -> AsyncIterator[RunningServer]:
    async with serve(create_app(factory, **app_options)) as running:
        yield running


def poll_url(running: RunningServer, port: int | None = None) -> str:
    if port is None:
        return running.url.replace("http://", "http+poll://", 1)
    return f"http+poll://127.0.0.1:{port}"


def links_of(running: RunningServer) -> HTTPLinkEndpoint:
    endpoint = running.app.state.http_links
    assert isinstance(endpoint, HTTPLinkEndpoint)
    return endpoint


def link_of(env: CounterClient) -> PollingLink:
    transport = env.transport
    assert isinstance(transport, HTTPPollingTransport)
    assert transport.shared
    link = transport._link
    assert link is not None
    return link


class Requests:
    """Records the requests an httpx client sends (an event hook)."""

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []

    async def __call__(self, request: httpx.Request) -> None:
        self.sent.append(request)

    def count(self, method: str, path_part: str) -> int:
        return sum(1 for r in self.sent if r.method == method and path_part in r.url.path)


# -- many sessions, one link --------------------------------------------------------


async def test_many_sessions_ride_one_link_and_each_gets_its_own_replies() -> None:
    requests = Requests()
    sessions = 16
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient(event_hooks={"request": [requests]}) as http:
            url = poll_url(running)
            envs = [CounterClient(url, client=http) for _ in range(sessions)]
            async with anyio.create_task_group() as task_group:
                for env in envs:
                    task_group.start_soon(env.connect)
            try:
                assert len({id(link_of(env)) for env in envs}) == 1  # one link for all
                assert links_of(running).link_count == 1
                assert requests.count("POST", "/poll/links") == 1 == len(requests.sent)  # opening costs no request
                assert requests.count("POST", "/poll/sessions") == 0

                async def reset(index: int) -> None:
                    observation = (await envs[index].reset(start=index * 100, episode_id=f"e{index}")).observation
                    assert observation.count == index * 100

                async with anyio.create_task_group() as task_group:
                    for index in range(sessions):
                        task_group.start_soon(reset, index)
                assert running.app.state.sessions.active == sessions

                # Every session steps in the same turn of the event loop: one POST carries them all,
                # and its response every reply (async steps are answered at once).
                before = len(requests.sent)

                async def step(index: int) -> None:
                    result = await envs[index].step(CountAction(by=index + 1))
                    assert result.observation.count == index * 100 + index + 1

                async with anyio.create_task_group() as task_group:
                    for index in range(sessions):
                        task_group.start_soon(step, index)
                assert [r.method for r in requests.sent[before:]] == ["POST"]

                # Interleaved, each at its own pace: no reply reaches another session.
                async def walk(index: int) -> None:
                    env = envs[index]
                    count = index * 100 + index + 1
                    rng = random.Random(index)
                    for _ in range(10):
                        by = rng.randint(1, 3)
                        delay = rng.choice([0.0, 0.0, 0.01])
                        count += by
                        assert (await env.step(CountAction(by=by, delay=delay))).observation.count == count
                    state = await env.state()
                    assert (state.episode_id, state.count) == (f"e{index}", count)

                async with anyio.create_task_group() as task_group:
                    for index in range(sessions):
                        task_group.start_soon(walk, index)
                assert requests.count("POST", "/poll/sessions") == 0
            finally:
                for env in envs:
                    await env.close()
            await wait_until(lambda: running.app.state.sessions.active == 0)
            await wait_until(lambda: links_of(running).link_count == 0)  # the last session deleted it
            assert len(AsyncCounterEnv.closed) == sessions


async def test_frames_handed_over_without_waiting() -> None:
    requests = Requests()
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient(event_hooks={"request": [requests]}) as http:
            url = poll_url(running)
            async with HTTPPollingTransport(url, client=http) as one, HTTPPollingTransport(url, client=http) as other:
                assert not one.send_waits  # on a link, a send only posts its frame
                before = len(requests.sent)
                one.send_nowait(b'{"type":"step","id":1,"data":{"by":1}}')
                other.send_nowait(b'{"type":"step","id":1,"data":{"by":2}}')
                assert len(requests.sent) == before  # posted, not sent
                with pytest.raises(anyio.WouldBlock):
                    one.receive_nowait()
                assert json.loads(await other.receive())["data"]["observation"]["count"] == 2
                assert len(requests.sent) == before + 1  # one request carried both
                assert json.loads(one.receive_nowait())["data"]["observation"]["count"] == 1  # it came with it
            async with HTTPPollingTransport(url, client=http, share=False) as own:
                assert own.send_waits
                with pytest.raises(anyio.WouldBlock):
                    own.send_nowait(b'{"type":"state","id":1}')


async def test_plain_environments_on_a_link() -> None:
    async def walk(url: str, index: int) -> None:
        async with CounterClient(url) as env:
            await env.reset(start=index)
            for step in range(10):
                result = await env.step(CountAction(by=1, delay=0.001))
                assert result.observation.count == index + step + 1

    with anyio.fail_after(LIMIT):
        async with server(SyncCounterEnv) as running:
            async with anyio.create_task_group() as task_group:
                for index in range(8):
                    task_group.start_soon(walk, poll_url(running), index * 100)
            await wait_until(lambda: running.app.state.sessions.active == 0)
            assert len(SyncCounterEnv.threads) >= 1


async def test_msgpack_links() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            server() as running,
            CounterClient(poll_url(running), encoding="msgpack") as one,
            CounterClient(poll_url(running), encoding="msgpack") as two,
            CounterClient(poll_url(running)) as json_env,
        ):
            assert one.transport is not None
            assert one.transport.dialect == openenv.Dialect("msgpack", True)
            assert link_of(one) is link_of(two)
            assert link_of(json_env) is not link_of(one)  # other options, another link
            await one.reset(start=2)
            assert (await one.step(CountAction(by=3))).observation.count == 5
            assert (await two.step(CountAction(by=1))).observation.count == 1
            assert (await json_env.step(CountAction(by=7))).observation.count == 7


# -- exactly once, through a failing network -----------------------------------------


class Chaos(httpx.AsyncBaseTransport):
    """Loses requests before they reach the server and responses after it answered, at random (seeded)."""

    def __init__(self, seed: int, rate: float) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.random = random.Random(seed)
        self.rate = rate
        self.lost: dict[str, int] = {}

    def _lose(self, request: httpx.Request, when: str) -> bool:
        if "/poll/links/" not in request.url.path or self.random.random() >= self.rate:
            return False
        what = f"{request.method} {when}"
        self.lost[what] = self.lost.get(what, 0) + 1
        return True

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._lose(request, "before"):
            raise httpx.RemoteProtocolError("simulated: the server closed the connection", request=request)
        response = await self.inner.handle_async_request(request)
        if self._lose(request, "after"):
            await response.aread()
            await response.aclose()
            raise httpx.ReadError("simulated: the response was lost on the way back", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def walk_exactly_once(url: str, index: int, steps: int, options: dict[str, Any]) -> None:
    """Step a counter ``steps`` times and check each reply: every step ran once, and the reply is this session's."""
    async with CounterClient(url, **options) as env:
        await env.reset(start=index * 1000, episode_id=f"e{index}")
        rng = random.Random(index)
        for step in range(1, steps + 1):
            delay = rng.choice([0.0, 0.0, 0.0, 0.02])  # some steps outlast a POST's wait: fetched by GET
            assert (await env.step(CountAction(by=1, delay=delay))).observation.count == index * 1000 + step
        state = await env.state()
        assert (state.episode_id, state.count, state.step_count) == (f"e{index}", index * 1000 + steps, steps)


async def test_every_reply_once_through_lost_requests_and_responses() -> None:
    chaos = Chaos(seed=21, rate=0.2)
    with anyio.fail_after(LIMIT * 2):
        async with server() as running, httpx.AsyncClient(transport=chaos) as http:
            options = {"client": http, "retries": 30, "poll_timeout": 0.01}
            async with anyio.create_task_group() as task_group:
                for index in range(8):
                    task_group.start_soon(walk_exactly_once, poll_url(running), index, 20, options)
            await wait_until(lambda: running.app.state.sessions.active == 0)
    # Messages lost on their way, and responses on theirs.
    assert {"POST before", "POST after"} <= set(chaos.lost), chaos.lost


class LoseOne(httpx.AsyncBaseTransport):
    """Loses the response to the first request ``which`` picks, after the server sent it."""

    def __init__(self, which: Any) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.which = which
        self.lost: list[str] = []
        self.sent: list[str] = []

    def count(self, method: str) -> int:
        """How many requests of ``method`` were sent."""
        return sum(1 for sent in self.sent if sent == method)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request.method)
        response = await self.inner.handle_async_request(request)
        if not self.lost and self.which(request, response):
            await response.aread()
            await response.aclose()
            self.lost.append(f"{request.method} {response.status_code}")
            raise httpx.ReadError("simulated: the response was lost on the way back", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_lost_response_loses_no_reply(method: str) -> None:
    # The reply of a step that outlasts the POST's wait comes in a long poll's response; that one is lost.
    network = LoseOne(lambda request, response: request.method == method and response.status_code == 200)
    entered: list[int] = []
    gate = anyio.Event()
    clock = ManualClock()  # the server's: the POST's wait runs out when the test says, the step still running
    with anyio.fail_after(LIMIT):
        async with (
            server(lambda: GatedCounterEnv(entered, gate), clock=clock) as running,
            httpx.AsyncClient(transport=network) as http,
        ):
            url = poll_url(running)
            async with (
                CounterClient(url, client=http, poll_timeout=5.0) as env,
                CounterClient(url, client=http) as other,
            ):
                await env.reset()
                await other.reset()

                async def outlast_the_post() -> None:
                    if method == "GET":
                        await wait_until(lambda: len(entered) == 1, "the step runs")
                        await clock.advance_when_blocked(DEFAULT_MAX_WAIT)  # the POST answers without its reply
                        await wait_until(lambda: network.count("GET") > 0, "the link polls")
                    gate.set()

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(outlast_the_post)
                    assert (await env.step(CountAction(by=3))).observation.count == 3
                assert (await other.step(CountAction(by=1))).observation.count == 1
                assert (await env.state()).step_count == 1
    assert network.lost == [f"{method} 200"]


async def test_every_reply_once_through_cut_connections() -> None:
    rng = random.Random(24)
    with anyio.fail_after(LIMIT * 2):
        async with server() as running, proxied(running) as proxy:
            cuts = [0]

            async def cut_now_and_then(request: httpx.Request) -> None:
                if "/poll/links/" in request.url.path and rng.random() < 0.15:
                    cuts[0] += proxy.cut()  # mid-request, or idle: every connection of the client

            async with httpx.AsyncClient(event_hooks={"request": [cut_now_and_then]}) as http:
                options = {"client": http, "retries": 30, "poll_timeout": 0.01}
                async with anyio.create_task_group() as task_group:
                    for index in range(8):
                        task_group.start_soon(walk_exactly_once, poll_url(running, proxy.port), index, 20, options)
            assert cuts[0] >= 10
            await wait_until(lambda: running.app.state.sessions.active == 0)


class GatedCounterEnv(AsyncCounterEnv):
    """A counter whose steps wait for ``gate`` once ``entered`` counts them in."""

    def __init__(self, entered: list[int], gate: anyio.Event) -> None:
        super().__init__()
        self.entered, self.gate = entered, gate

    async def step(self, action: CountAction) -> Any:
        if action.delay:  # a warm-up: the link learns that this environment's steps wait
            return await super().step(action)
        self.entered.append(1)
        await self.gate.wait()
        return await super().step(action)


async def test_every_session_goes_on_after_a_cut_mid_step() -> None:
    entered: list[int] = []
    gate = anyio.Event()
    with anyio.fail_after(LIMIT):
        async with (
            server(lambda: GatedCounterEnv(entered, gate)) as running,
            proxied(running) as proxy,
        ):
            url = poll_url(running, proxy.port)
            envs = [CounterClient(url, poll_timeout=0.5) for _ in range(4)]
            for env in envs:
                await env.connect()
            try:
                for index, env in enumerate(envs):
                    await env.reset(start=index * 10)
                    await env.step(CountAction(by=1, delay=0.001))

                async def step(index: int) -> None:
                    result = await envs[index].step(CountAction(by=1))
                    assert result.observation.count == index * 10 + 2

                async with anyio.create_task_group() as task_group:
                    for index in range(4):
                        task_group.start_soon(step, index)
                    await wait_until(lambda: len(entered) == 4, "every step runs")
                    await all_tasks_blocked()  # the link's request waits at the server
                    assert proxy.cut() >= 1
                    gate.set()
                for index, env in enumerate(envs):  # the same environments, each step run once
                    assert (await env.step(CountAction(by=2, delay=0.001))).observation.count == index * 10 + 4
                    assert (await env.state()).step_count == 3
                assert proxy.connections >= 2
            finally:
                for env in envs:
                    await env.close()


# -- one session's trouble is its own ------------------------------------------------


async def test_a_sessions_bad_input_or_failure_reaches_no_other() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            server(max_message_size=4096) as running,
            CounterClient(poll_url(running)) as garbled,
            CounterClient(poll_url(running)) as oversize,
            CounterClient(poll_url(running)) as failing,
            CounterClient(poll_url(running)) as good,
        ):
            assert len({id(link_of(env)) for env in (garbled, oversize, failing, good)}) == 1
            registry = running.app.state.sessions
            for env in (garbled, oversize, failing, good):
                await env.reset(start=5)
            assert registry.active == 4
            # Not one JSON value: it cannot travel in an envelope (it would break the others' message).
            transport = garbled.transport
            assert transport is not None
            with pytest.raises(ConnectionClosed, match="not one JSON value"):
                await transport.send(b'{"type":"step","id":99,"data":')
            with pytest.raises(ConnectionClosed, match="over the server's limit"):
                await oversize.step({"by": 1, "pad": "x" * 5000})  # refused before it is sent
            await wait_until(lambda: registry.active == 2)  # both sessions ended on the server too
            assert (await good.step(CountAction(by=1))).observation.count == 6
            with pytest.raises(openenv.ServerError, match="asked to fail"):
                await failing.step(CountAction(fail=True))  # the environment raised
            assert (await failing.step(CountAction(by=2))).observation.count == 7  # it goes on
            # A frame the server cannot read is that session's business.
            assert (await good.step(CountAction(by=1))).observation.count == 7
            assert (await good.state()).step_count == 2


async def test_a_call_cancelled_while_it_gathers_the_turns_frames_leaves_no_one_waiting() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running:
            url = poll_url(running)
            async with HTTPPollingTransport(url) as one, HTTPPollingTransport(url) as other:
                replies: list[bytes] = []

                async def other_step() -> None:
                    await other.send(b'{"type":"step","id":1,"data":{"by":2}}')
                    replies.append(await other.receive())  # waits for the request `one` was to make

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(other_step)
                    await one.send(b'{"type":"step","id":1,"data":{"by":1}}')
                    with anyio.CancelScope() as scope:
                        scope.cancel()
                        await one.receive()  # cancelled at its first checkpoint: while it gathers the turn's frames
                assert json.loads(replies[0])["data"]["observation"]["count"] == 2
                # Its frame went with the other's: its reply waits for it.
                assert json.loads(await one.receive())["data"]["observation"]["count"] == 1


async def test_a_failing_factory_ends_only_its_session() -> None:
    built: list[int] = []

    def every_other() -> AsyncCounterEnv:
        built.append(1)
        if len(built) % 2 == 0:
            raise OSError("no GPU left")
        return AsyncCounterEnv()

    with anyio.fail_after(LIMIT):
        async with server(every_other) as running:
            async with CounterClient(poll_url(running)) as first, CounterClient(poll_url(running)) as second:
                await first.reset()
                with pytest.raises(openenv.ServerError, match="no GPU left") as info:
                    await second.reset()
                assert info.value.code == "FACTORY_ERROR"
                with pytest.raises(ConnectionClosed):
                    await second.step(CountAction())
                assert (await first.step(CountAction(by=3))).observation.count == 3
            await wait_until(lambda: running.app.state.sessions.active == 0)


async def test_capacity_reached_and_the_admission_queue_count_sessions_not_links() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            server(max_sessions=2) as running,
            CounterClient(poll_url(running)) as one,
            CounterClient(poll_url(running)) as two,
        ):
            await one.reset()
            await two.reset()
            async with CounterClient(poll_url(running)) as three:
                assert link_of(three) is link_of(one)
                with pytest.raises(openenv.CapacityReachedError) as info:
                    await three.reset()
                assert info.value.data["max_sessions"] == 2
                with pytest.raises(ConnectionClosed):
                    await three.step(CountAction())
            assert (await one.step(CountAction(by=1))).observation.count == 1
            assert (await two.step(CountAction(by=2))).observation.count == 2
        async with server(max_sessions=1, queue_timeout=LIMIT) as running:
            first = await CounterClient(poll_url(running)).connect()
            await first.reset()
            async with CounterClient(poll_url(running)) as waiting, anyio.create_task_group() as task_group:

                async def wait_for_a_slot() -> None:
                    assert (await waiting.step(CountAction(by=4))).observation.count == 4

                task_group.start_soon(wait_for_a_slot)
                await wait_until(lambda: running.app.state.sessions.queued == 1, "the session waits in the queue")
                assert (await first.step(CountAction(by=1))).observation.count == 1  # the link is not held up
                await first.close()  # its slot goes to the session waiting


async def test_a_session_the_server_ends_ends_alone() -> None:
    with anyio.fail_after(LIMIT):
        async with server(http_idle_timeout=0.3) as running:
            registry = running.app.state.sessions
            async with CounterClient(poll_url(running)) as ended:
                await ended.reset()
                (lease,) = registry.leases()
                async with CounterClient(poll_url(running)) as other:
                    await other.reset()
                    # Quiet past the HTTP idle timeout: the link is polled, so neither is reaped.
                    await other.step(CountAction(by=1, delay=0.4))
                    assert registry.active == 2
                    lease.request_close("asked to end")
                    with pytest.raises(ConnectionClosed, match="asked to end"):
                        await ended.step(CountAction())
                    assert (await other.step(CountAction(by=1))).observation.count == 2


async def test_a_link_nobody_polls_expires_with_its_sessions() -> None:
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with server(clock=clock) as running:
            links_of(running).idle_timeout = 30.0  # the sessions' own (300 s) does not pass meanwhile
            # No owner, no keeper: nothing polls between calls.
            one = await CounterClient(poll_url(running)).connect()
            two = await CounterClient(poll_url(running)).connect()
            try:
                await one.reset()
                await two.reset()
                assert links_of(running).link_count == 1
                await all_tasks_blocked()  # the server is done with the request too
                clock.advance(29.0)
                assert (await one.step(CountAction())).observation.count == 1  # a request: the clock starts again
                await all_tasks_blocked()
                clock.advance(29.0)
                await all_tasks_blocked()
                assert running.app.state.sessions.active == 2
                clock.advance(2.0)  # 31 s without a request
                await wait_until(lambda: running.app.state.sessions.active == 0)
                for env in (one, two):
                    with pytest.raises(ConnectionClosed, match="no request came for 30 s"):
                        await env.step(CountAction())
            finally:
                await one.close()
                await two.close()
            assert len(AsyncCounterEnv.closed) == 2


async def test_the_keeper_polls_while_nobody_waits() -> None:
    clock = ManualClock()
    requests = Requests()
    with anyio.fail_after(LIMIT):
        async with (
            server() as running,
            httpx.AsyncClient(event_hooks={"request": [requests]}) as http,
            CounterClient(poll_url(running), client=http, clock=clock, poll_timeout=0.2) as env,
        ):
            await env.reset()
            await all_tasks_blocked()
            assert requests.count("GET", "/poll/links/") == 0
            clock.advance(IDLE_POLL)  # a second without a request, on the client's clock
            await wait_until(lambda: requests.count("GET", "/poll/links/") == 1, "the keeper polls")
            assert (await env.step(CountAction())).observation.count == 1


async def test_the_server_ending_a_session_reaches_its_client_through_the_keeper() -> None:
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with (
            server() as running,
            CounterClient(poll_url(running), clock=clock, poll_timeout=LIMIT) as env,
        ):
            await env.reset()
            await all_tasks_blocked()
            clock.advance(IDLE_POLL)  # the keeper's long poll waits at the server
            channel = env.transport.link_channel  # type: ignore[union-attr]
            assert channel is not None
            (lease,) = running.app.state.sessions.leases()
            lease.request_close("asked to end")
            await wait_until(lambda: channel.ended is not None, "the session's end came without a call")
            assert "asked to end" in str(channel.ended)


async def test_server_shutdown_ends_every_session_on_a_link() -> None:
    stop, stopped = anyio.Event(), anyio.Event()
    clock = ManualClock()

    async def run_server(*, task_status: anyio.abc.TaskStatus[RunningServer]) -> None:
        async with server() as running:
            task_status.started(running)
            await stop.wait()
        stopped.set()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as task_group:
            running = await task_group.start(run_server)
            url = poll_url(running)
            async with (
                CounterClient(url, retries=1, clock=clock) as one,
                CounterClient(url, retries=1, clock=clock) as two,
            ):
                for env in (one, two):
                    await env.step(CountAction())
                await all_tasks_blocked()
                clock.advance(IDLE_POLL)  # the keeper's poll waits at the server
                [held] = links_of(running)._links.values()
                await wait_until(lambda: held._parked is not None, "the server holds the poll")
                # The server stops while the sessions think: each is told why, and the server
                # does not wait for the poll.
                stop.set()
                await stopped.wait()
                assert len(AsyncCounterEnv.closed) == 2
                for env in (one, two):
                    with pytest.raises(ConnectionClosed, match="server shutting down"):
                        await env.step(CountAction())


async def test_a_session_leaving_leaves_the_others_and_the_last_deletes_the_link() -> None:
    requests = Requests()
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient(event_hooks={"request": [requests]}) as http:
            one = await CounterClient(poll_url(running), client=http).connect()
            two = await CounterClient(poll_url(running), client=http).connect()
            await one.step(CountAction())
            await two.step(CountAction())
            await one.close()
            await wait_until(lambda: len(AsyncCounterEnv.closed) == 1)
            assert (await two.step(CountAction())).observation.count == 2
            assert requests.count("DELETE", "/poll/links/") == 0
            await two.close()
            assert requests.count("DELETE", "/poll/links/") == 1
            assert links_of(running).link_count == 0
            await wait_until(lambda: len(AsyncCounterEnv.closed) == 2)
            assert not http.is_closed  # a client we were given is never closed


async def test_a_restarted_server_is_a_prompt_connection_closed() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            server() as running,
            proxied(running) as proxy,
            CounterClient(poll_url(running, proxy.port), retries=2) as env,
        ):
            await env.step(CountAction())
            proxy.cut()
            async with serve(create_app(AsyncCounterEnv)) as other:
                proxy.upstream = other  # a restarted server knows no link
                with pytest.raises(ConnectionClosed, match="does not know this link"):
                    await env.step(CountAction())


async def test_link_ids_stay_out_of_the_logs(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.INFO)
    with anyio.fail_after(LIMIT):
        async with serve(AsyncCounterEnv, log_level="debug") as running:
            async with CounterClient(poll_url(running)) as env:
                await env.step(CountAction())
                link_id = link_of(env)._link_url.path.rsplit("/", 1)[-1]
            await wait_until(lambda: links_of(running).link_count == 0)
    server_loggers = ("uvicorn", "hypercorn", "openenv")
    logged = "\n".join(record.getMessage() for record in caplog.records if record.name.startswith(server_loggers))
    logged += capsys.readouterr().out  # hypercorn writes its access log to stdout
    assert "/poll/links/..." in logged  # the access log was on
    assert f"HTTP long-polling link {link_id[:8]}… opened" in logged  # the server's own log: a prefix
    assert link_id not in logged  # the id is the link's address: never whole


# -- a server without links ------------------------------------------------------------


async def test_a_server_without_links_gets_a_session_of_its_own_per_client() -> None:
    app = create_app(AsyncCounterEnv)
    app.router.routes[:] = [route for route in app.router.routes if getattr(route, "name", "") not in LINK_ROUTES]
    requests = Requests()
    with anyio.fail_after(LIMIT):
        async with serve(app) as running, httpx.AsyncClient(event_hooks={"request": [requests]}) as http:
            async with (
                CounterClient(poll_url(running), client=http) as one,
                CounterClient(poll_url(running), client=http) as two,
            ):
                for env in (one, two):
                    transport = env.transport
                    assert isinstance(transport, HTTPPollingTransport)
                    assert not transport.shared
                    assert transport.session_id is not None
                assert (await one.step(CountAction(by=2))).observation.count == 2
                assert (await two.step(CountAction(by=3))).observation.count == 3
            assert requests.count("POST", "/poll/links") == 1  # asked once; then remembered
            assert requests.count("POST", "/poll/sessions") >= 2


LINK_ROUTES = {"poll_link", "poll_links"}


# -- the protocol on the wire --------------------------------------------------------------


class RawLink:
    """One link driven by hand, request by request, with plain httpx."""

    def __init__(self, http: httpx.AsyncClient, base: str) -> None:
        self.http = http
        self.base = base
        self.created: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"{self.base}/poll/links/{self.created['link_id']}"

    async def create(self, **body: Any) -> httpx.Response:
        response = await self.http.post(f"{self.base}/poll/links", json=body or None)
        if response.status_code == 201:
            self.created = response.json()
            self.http.headers["OpenEnv-Link-Key"] = self.created["link_key"]
        return response

    async def post(self, seq: int, entries: Any, *, ack: int = 0, wait: float = 5.0, **headers: str) -> httpx.Response:
        body = entries if isinstance(entries, bytes) else json.dumps(entries).encode()
        merged = {**JSON, "OpenEnv-Seq": str(seq), "OpenEnv-Ack": str(ack), "OpenEnv-Wait": str(wait), **headers}
        return await self.http.post(self.url, content=body, headers=merged)

    async def get(self, *, ack: int = 0, wait: float = 5.0) -> httpx.Response:
        return await self.http.get(self.url, headers={"OpenEnv-Ack": str(ack), "OpenEnv-Wait": str(wait)})


@asynccontextmanager
async def raw_link(running: RunningServer, **body: Any) -> AsyncIterator[RawLink]:
    async with httpx.AsyncClient(timeout=LIMIT) as http:
        link = RawLink(http, running.url)
        response = await link.create(**body)
        assert response.status_code == 201, response.text
        yield link


async def collect(link: RawLink, response: httpx.Response, count: int, *, ack: int) -> tuple[list[Any], int]:
    """The entries after place ``ack``: those ``response`` carries, and more polled for until there are ``count``.

    Returns:
        The entries, and the place of the last one.
    """
    entries: list[Any] = []
    last = ack
    while True:
        if response.status_code == 200:
            entries, last = response.json(), int(response.headers["OpenEnv-Seq"])
        if len(entries) >= count:
            return entries, last
        response = await link.get(ack=ack, wait=LIMIT)  # every entry after place `ack`, again


def error_code(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json"
    return str(response.json()["error"]["code"])


OPEN = {"type": "open"}


def step(request_id: int, by: int = 1, **data: Any) -> dict[str, Any]:
    return {"type": "step", "id": request_id, "data": {"by": by, **data}}


async def test_a_link_exchange_on_the_wire() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_link(running) as link:
            created = link.created
            assert created == {
                "link_id": created["link_id"],
                "link_key": created["link_key"],
                "encoding": "json",
                "max_body_size": 16 * 1024 * 1024,
                "max_wait": 60.0,
            }
            assert len(created["link_id"]) >= 43
            assert created["link_key"] != created["link_id"]
            # Two sessions opened and stepped in one message.
            both = [[1, 0, 0, OPEN], [1, 1, 0, step(1, 2)], [2, 0, 0, OPEN], [2, 1, 0, step(1, 5)]]
            response = await link.post(1, both)
            assert response.headers["OpenEnv-Received"] == "1"
            entries, last = await collect(link, response, 2, ack=0)
            assert last == 2
            assert sorted((channel, seq) for channel, seq, _, _ in entries) == [(1, 1), (2, 1)]
            assert {channel: frame["data"]["observation"]["count"] for channel, _, _, frame in entries} == {1: 2, 2: 5}
            # A message sent again (its response was lost) is not taken twice: it gets the entries again.
            again = await link.post(1, [[1, 0, 0, OPEN], [1, 1, 0, step(1, 2)]], ack=0)
            assert again.json() == entries
            # Nothing new after place 2: a poll that may not wait gets 204.
            response = await link.get(ack=2, wait=0)
            assert (response.status_code, response.headers["OpenEnv-Received"]) == (204, "1")
            response = await link.post(2, [[1, 2, 1, step(2, 1)]], ack=2)
            entries, last = await collect(link, response, 1, ack=2)
            assert entries[0][3]["data"]["observation"]["count"] == 3  # 2 + 1: step 1 ran once
            assert last == 3
            # A close ends its session: an end entry (seq 0) on its channel.
            response = await link.post(3, [[2, 2, 1, {"type": "close"}]], ack=3)
            entries, _ = await collect(link, response, 1, ack=3)
            assert entries == [[2, 0, 0, {"type": "end", "reason": "closed by the client", "code": 1000}]]
            await wait_until(lambda: len(AsyncCounterEnv.closed) == 1)
            assert (await link.http.delete(link.url)).status_code == 204
            await wait_until(lambda: len(AsyncCounterEnv.closed) == 2)
            assert (await link.get()).status_code == 404


async def test_a_long_poll_is_answered_when_another_request_comes() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_link(running) as link:
            statuses: list[int] = []
            async with anyio.create_task_group() as task_group:

                async def poll() -> None:
                    statuses.append((await link.get(wait=LIMIT * 2)).status_code)

                task_group.start_soon(poll)
                held = links_of(running)._links[link.created["link_id"]]
                await wait_until(lambda: held._parked is not None, "the server holds the poll")
                response = await link.post(1, [[1, 0, 0, OPEN], [1, 1, 0, step(1)]])
                assert response.status_code == 200
            assert statuses == [204]  # answered at once, with nothing: the newer request brings the reply


async def test_bad_requests_to_a_link() -> None:
    with anyio.fail_after(LIMIT):
        async with server(max_message_size=1000) as running, raw_link(running) as link:
            response = await link.post(1, [[1, 0, 0, OPEN], [1, 1, 0, step(1)]])
            assert response.status_code == 200
            key = link.http.headers.pop("OpenEnv-Link-Key")
            response = await link.get()
            assert (response.status_code, error_code(response)) == (404, "link_not_found")  # its id is not enough
            link.http.headers["OpenEnv-Link-Key"] = key + "x"
            assert (await link.get()).status_code == 404
            link.http.headers["OpenEnv-Link-Key"] = key
            response = await link.http.post(link.url, content=b"[]", headers=JSON)
            assert (response.status_code, error_code(response)) == (400, "invalid_header")  # no OpenEnv-Seq
            response = await link.post(3, [], wait=0)
            assert (response.status_code, error_code(response)) == (409, "sequence_gap")
            response = await link.get(ack=9)
            assert (response.status_code, error_code(response)) == (409, "ack_out_of_range")
            response = await link.post(2, b'{"not": "an envelope"}')
            assert (response.status_code, error_code(response)) == (400, "invalid_envelope")
            response = await link.post(2, [], **{"Content-Type": "text/plain"})
            assert (response.status_code, error_code(response)) == (415, "unsupported_media_type")
            response = await link.post(2, [[1, 2, 1, step(2, pad="x" * 1000)]])
            assert (response.status_code, error_code(response)) == (413, "body_too_large")
            response = await link.http.request("PUT", link.url)
            assert response.status_code == 405
            # None of that was taken, nor harmed the link.
            response = await link.post(2, [[1, 2, 1, step(2)]], ack=1)
            assert response.json()[0][3]["data"]["observation"]["count"] == 2
            # A frame on a channel never opened breaks the link protocol: the link ends.
            assert (await link.post(3, [[7, 1, 0, step(1)]], ack=2)).status_code in (200, 204, 410)
            response = await link.get(ack=2, wait=LIMIT)
            while response.status_code == 200:  # the sessions' ends, then the link's
                response = await link.get(ack=int(response.headers["OpenEnv-Seq"]), wait=LIMIT)
            assert (response.status_code, error_code(response)) == (410, "link_ended")
            assert "broke the link protocol" in response.json()["error"]["message"]
            await wait_until(lambda: running.app.state.sessions.active == 0)


async def test_a_link_that_keeps_too_much_unacknowledged_takes_nothing_more() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running:
            links_of(running).max_unacknowledged_bytes = 50
            async with raw_link(running) as link:
                response = await link.post(1, [[1, 0, 0, OPEN], [1, 1, 0, step(1)], [1, 2, 0, step(2)]])
                assert (await collect(link, response, 2, ack=0))[1] == 2
                # Not acknowledged (ack 0): over 50 bytes kept, so message 2 is not taken,
                # and its response carries what the client should acknowledge.
                response = await link.post(2, [[1, 3, 0, step(3)]], ack=0)
                assert response.headers["OpenEnv-Received"] == "1"
                assert len(response.json()) == 2
                response = await link.post(2, [[1, 3, 2, step(3)]], ack=2)
                assert response.headers["OpenEnv-Received"] == "2"
                assert response.json()[0][3]["data"]["observation"]["count"] == 3


async def test_msgpack_envelopes_on_the_wire() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_link(running, encoding="msgpack") as link:
            body = msgspec.msgpack.encode([[1, 0, 0, OPEN], [1, 1, 0, {"type": "state", "id": 1}]])
            response = await link.post(1, body, **{"Content-Type": "application/msgpack"})
            assert response.headers["Content-Type"] == "application/msgpack"
            [[channel, seq, _, frame]] = msgspec.msgpack.decode(response.content)
            assert (channel, seq, frame["type"]) == (1, 1, "state")
            response = await link.post(2, [], ack=1)
            assert (response.status_code, error_code(response)) == (415, "unsupported_media_type")

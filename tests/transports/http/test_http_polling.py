"""The HTTP long-polling transport's per-session protocol: its delivery guarantees, its protocol on the wire, bad input.

This is the protocol older clients speak, and the one our client falls back to
against a server without links; the clients here ask for it (``share=False``).
Links (many sessions over one set of requests, the default) are tested in
`tests.transports.http.test_http_links`.

Everything runs against a real embedded server (uvicorn under asyncio, hypercorn
under trio) on a loopback port. The protocol tests speak raw HTTP with httpx;
the guarantee tests break the network on purpose, with an httpx transport that
loses responses or a TCP proxy that cuts connections, and check that the client
gets every reply once and the environment runs every request once.
"""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import msgspec
import pytest

import openenv
import transports.http as http_package
import transports.http._client as http_client_module
from openenv import ClientStateError, ConnectError, ConnectionClosed, EnvClient, create_transport
from openenv.examples.echo import EchoEnvironment
from tests.envs import AsyncCounterEnv, CountAction, CountObservation, CountState, SyncCounterEnv
from tests.helpers import CounterClient, ManualClock, all_tasks_blocked, cancel_when_blocked, proxied, wait_until
from transports.admission._sessions import SessionRegistry
from transports.http import HTTPPollingEndpoint, HTTPPollingTransport, polling_url
from transports.server.app import create_app
from transports.server.runner import RunningServer, serve
from transports.shared._network_client import is_loopback
from transports.websocket import WebSocketTransport

pytestmark = pytest.mark.anyio

LIMIT = 10  # seconds: the bound of every wait in these tests

STEP = b'{"type":"step","id":1,"data":{"by":1}}'
JSON = {"Content-Type": "application/json"}


@asynccontextmanager
async def server(factory: Any = AsyncCounterEnv, **app_options: Any) -> AsyncIterator[RunningServer]:
    async with serve(create_app(factory, **app_options)) as running:
        yield running


def poll_url(running: RunningServer) -> str:
    return running.url.replace("http://", "http+poll://", 1)


def endpoint_of(running: RunningServer) -> HTTPPollingEndpoint:
    endpoint = running.app.state.http_polling
    assert isinstance(endpoint, HTTPPollingEndpoint)
    return endpoint


def error_code(response: httpx.Response) -> str:
    assert response.headers["content-type"] == "application/json"
    return str(response.json()["error"]["code"])


class RawSession:
    """One session driven by hand, request by request, with plain httpx."""

    def __init__(self, http: httpx.AsyncClient, base: str) -> None:
        self.http = http
        self.base = base
        self.id = ""
        self.created: dict[str, Any] = {}

    @property
    def frames(self) -> str:
        return f"{self.base}/poll/sessions/{self.id}/frames"

    async def create(self, **body: Any) -> httpx.Response:
        response = await self.http.post(f"{self.base}/poll/sessions", json=body or None)
        if response.status_code == 201:
            self.created = response.json()
            self.id = self.created["session_id"]
            self.http.headers["OpenEnv-Session-Key"] = self.created["session_key"]
        return response

    async def post(
        self, seq: int, frame: bytes = STEP, *, ack: int = 0, wait: float = 5.0, **headers: str
    ) -> httpx.Response:
        merged = {**JSON, "OpenEnv-Seq": str(seq), "OpenEnv-Ack": str(ack), "OpenEnv-Wait": str(wait), **headers}
        return await self.http.post(self.frames, content=frame, headers=merged)

    async def get(self, *, ack: int = 0, wait: float = 5.0) -> httpx.Response:
        return await self.http.get(self.frames, headers={"OpenEnv-Ack": str(ack), "OpenEnv-Wait": str(wait)})

    async def delete(self) -> httpx.Response:
        return await self.http.delete(f"{self.base}/poll/sessions/{self.id}")


@asynccontextmanager
async def raw_session(running: RunningServer, **body: Any) -> AsyncIterator[RawSession]:
    async with httpx.AsyncClient(timeout=LIMIT) as http:
        session = RawSession(http, running.url)
        response = await session.create(**body)
        assert response.status_code == 201, response.text
        yield session


def observation(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return json.loads(response.content)


async def test_sessions_share_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building TLS settings loads the CA bundle (tens of ms): once per process, never for plain http+poll://."""
    from transports.shared import _network_client as client_module

    built: list[object] = []

    def counting_create_ssl_context(*args: Any, **kwargs: Any) -> Any:
        built.append(object())
        return real_create(*args, **kwargs)

    real_create = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", counting_create_ssl_context)
    client_module.default_ssl_context.cache_clear()
    try:
        async with server() as running:
            with anyio.fail_after(LIMIT):
                for _ in range(3):
                    async with EnvClient[CountAction, CountObservation, CountState](poll_url(running)) as env:
                        assert (await env.step(CountAction(by=1))).observation.count == 1
        assert built == []  # plain HTTP: no TLS context at all
        # What every https+poll:// client is given: built once.
        assert client_module.default_ssl_context() is client_module.default_ssl_context()
    finally:
        client_module.default_ssl_context.cache_clear()
    assert len(built) == 1


# -- network faults, simulated inside httpx ------------------------------------------


class FlakyTransport(httpx.AsyncBaseTransport):
    """Passes requests to the network, failing one of them once, the way a real network does.

    ``before`` picks a request to fail before it reaches the server (a keep-alive
    connection the server had just closed); ``after`` picks a response to lose
    after the server sent it (a connection cut on the way back, a read timeout).
    """

    def __init__(
        self,
        *,
        before: Callable[[httpx.Request], bool] = lambda request: False,
        after: Callable[[httpx.Request, httpx.Response], bool] = lambda request, response: False,
        stall: Callable[[httpx.Request], bool] = lambda request: False,
    ) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.before = before
        self.after = after
        self.stall = stall
        self.requests: list[httpx.Request] = []
        self.failures: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.stall(request):
            await anyio.sleep_forever()  # a stalled network: the request goes no further until cancelled
        if not self.failures and self.before(request):
            self.failures.append(f"{request.method} before")
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        response = await self.inner.handle_async_request(request)
        if not self.failures and self.after(request, response):
            await response.aread()
            await response.aclose()
            self.failures.append(f"{request.method} after")
            raise httpx.ReadError("simulated: the connection broke on the way back", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class Unreachable(httpx.AsyncBaseTransport):
    """A network on which every connection is refused."""

    def __init__(self) -> None:
        self.attempts = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.attempts += 1
        raise httpx.ConnectError("simulated: connection refused", request=request)


async def test_retries_back_off_on_the_transports_clock() -> None:
    clock = ManualClock()
    network = Unreachable()
    with anyio.fail_after(LIMIT):
        async with httpx.AsyncClient(transport=network) as http, anyio.create_task_group() as task_group:
            task_group.start_soon(clock.keep_advancing, 0.05)
            transport = HTTPPollingTransport(
                "http+poll://127.0.0.1:9", share=False, client=http, retries=3, clock=clock
            )
            with pytest.raises(ConnectError, match=r"cannot create a session .*simulated: connection refused"):
                await transport.__aenter__()
            task_group.cancel_scope.cancel()
    assert network.attempts == 4
    assert clock.now() >= 0.1 + 0.3  # the backoffs before the third and fourth tries, on the clock given


def is_frame(request: httpx.Request, seq: int) -> bool:
    return request.method == "POST" and request.headers.get("OpenEnv-Seq") == str(seq)


@pytest.mark.parametrize("how", ["before", "after"])
async def test_a_retried_post_is_executed_once(how: str) -> None:
    if how == "before":
        flaky = FlakyTransport(before=lambda request: is_frame(request, 2))
    else:
        flaky = FlakyTransport(after=lambda request, response: is_frame(request, 2))
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient(transport=flaky) as http:
            async with CounterClient(poll_url(running), share=False, client=http) as env:
                await env.reset()
                result = await env.step(CountAction(by=5))  # frame 2: its POST fails once
                assert (result.observation.count, result.reward) == (5, 5.0)
                assert (await env.state()).count == 5  # executed once, not twice
            assert flaky.failures == [f"POST {how}"]
            posts = [r for r in flaky.requests if r.method == "POST" and r.headers.get("OpenEnv-Seq") == "2"]
            assert len(posts) == 2  # sent again, with the same number
            assert not http.is_closed  # a client we were given is never closed


async def test_a_reply_lost_on_the_way_back_from_a_poll_is_fetched_again() -> None:
    # The step outlasts the POST's wait: the reply comes by GET, whose response is lost.
    flaky = FlakyTransport(after=lambda request, response: request.method == "GET" and response.status_code == 200)
    entered, gate = anyio.Event(), anyio.Event()
    clock = ManualClock()  # the server's: the POST's wait runs out when the test says, the step still running
    with anyio.fail_after(LIMIT):
        async with (
            server(lambda: GatedCounterEnv(entered, gate), clock=clock) as running,
            httpx.AsyncClient(transport=flaky) as http,
        ):
            async with CounterClient(poll_url(running), share=False, client=http, poll_timeout=5.0) as env:

                async def outlast_the_post() -> None:
                    await entered.wait()
                    await clock.advance_when_blocked(5.0)  # the POST gets its 204
                    await wait_until(lambda: any(r.method == "GET" for r in flaky.requests), "the client polls")
                    gate.set()

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(outlast_the_post)
                    result = await env.step(CountAction(by=3))
                assert result.observation.count == 3
                assert (await env.state()).count == 3
            assert flaky.failures == ["GET after"]


async def test_a_long_step_outlasts_several_poll_windows() -> None:
    flaky = FlakyTransport()
    entered, gate = anyio.Event(), anyio.Event()
    clock = ManualClock()  # the server's: its poll windows and its reaper's looks
    with anyio.fail_after(LIMIT):
        async with (
            server(lambda: GatedCounterEnv(entered, gate), session_idle_timeout=10.0, clock=clock) as running,
            httpx.AsyncClient(transport=flaky) as http,
        ):
            async with CounterClient(poll_url(running), share=False, client=http, poll_timeout=5.0) as env:
                (lease,) = running.app.state.sessions.leases()

                async def hold_the_step_for_four_windows() -> None:
                    # A step of 20 s, polled in windows of 5 s, on a server that reaps
                    # sessions idle for 10 s: a busy session is not idle.
                    await entered.wait()
                    for _ in range(4):
                        await clock.advance_when_blocked(5.0)  # the request held at the server gets its 204
                        await wait_until(lambda: lease.seen_at == clock.now(), "the client polls again")
                    gate.set()

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(hold_the_step_for_four_windows)
                    result = await env.step(CountAction(by=7))
                assert result.observation.count == 7
                assert (await env.step(CountAction(by=1))).observation.count == 8
            polls = [r for r in flaky.requests if r.method == "GET"]
            assert len(polls) >= 4


async def test_one_request_per_step_when_the_reply_is_ready_in_time() -> None:
    flaky = FlakyTransport()
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient(transport=flaky) as http:
            async with CounterClient(poll_url(running), share=False, client=http) as env:
                for _ in range(5):
                    await env.step(CountAction())
            methods = [r.method for r in flaky.requests]
            assert methods == ["POST"] * 7 + ["DELETE"]  # create, 5 steps, close; delete


async def test_a_cancelled_receive_loses_nothing() -> None:
    entered, gate = anyio.Event(), anyio.Event()
    clock = ManualClock()  # the server's: the POST's wait runs out when the test says, the step still running
    with anyio.fail_after(LIMIT):
        async with server(lambda: GatedCounterEnv(entered, gate), clock=clock) as running:
            transport = HTTPPollingTransport(running.url, share=False, poll_timeout=5.0)
            async with transport:

                async def outlast_the_post() -> None:
                    await entered.wait()
                    await clock.advance_when_blocked(5.0)  # the POST gets its 204

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(outlast_the_post)
                    await transport.send(b'{"type":"step","id":1,"data":{"by":4}}')
                scope = anyio.CancelScope()
                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(cancel_when_blocked, scope)
                    with scope:
                        await transport.receive()  # cancelled in the middle of a poll
                assert scope.cancelled_caught
                gate.set()
                reply = json.loads(await transport.receive())
                assert (reply["id"], reply["data"]["observation"]["count"]) == (1, 4)


@pytest.mark.parametrize("where", ["on its way", "at the server"])
async def test_a_send_cancelled_mid_post_is_completed_by_the_next_receive(where: str) -> None:
    # The frame's first POST is cancelled before it leaves, or while the server runs it.
    stalled = [True] if where == "on its way" else []
    flaky = FlakyTransport(stall=lambda request: bool(stalled) and is_frame(request, 1) and stalled.pop())
    frame = b'{"type":"step","id":1,"data":{"by":2,"delay":0.3}}'
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient(transport=flaky) as http:
            async with HTTPPollingTransport(running.url, share=False, client=http) as transport:
                async with anyio.create_task_group() as task_group:

                    async def cancel_mid_post() -> None:
                        await wait_until(lambda: any(is_frame(request, 1) for request in flaky.requests))
                        await all_tasks_blocked()  # stalled on its way, or held while the step runs
                        task_group.cancel_scope.cancel()

                    task_group.start_soon(cancel_mid_post)
                    await transport.send(frame)
                reply = json.loads(await transport.receive())
                assert reply["data"]["observation"]["count"] == 2
                await transport.send(b'{"type":"state","id":2}')
                assert json.loads(await transport.receive())["data"]["count"] == 2  # run once
            posts = [r for r in flaky.requests if is_frame(r, 1)]
            assert len(posts) == 2


async def test_a_send_cancelled_mid_post_is_sent_again_before_the_next() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, CounterClient(poll_url(running), share=False) as env:
            await env.reset()
            with anyio.move_on_after(0.05):
                await env.step(CountAction(by=10, delay=0.3))
            # Whether or not that POST reached the server, the next call makes sure it
            # did, once; its late reply is dropped by request id.
            result = await env.step(CountAction(by=1))
            assert (result.observation.count, result.reward) == (11, 1.0)


# -- network faults, on a real TCP connection ----------------------------------------


class GatedCounterEnv(AsyncCounterEnv):
    """A counter whose steps start by setting ``entered``, then wait for ``gate`` to open."""

    def __init__(self, entered: anyio.Event, gate: anyio.Event) -> None:
        super().__init__()
        self.entered, self.gate = entered, gate

    async def step(self, action: CountAction) -> CountObservation:
        self.entered.set()
        await self.gate.wait()
        return await super().step(action)


async def test_a_poll_cut_off_mid_wait_resumes() -> None:
    entered, gate = anyio.Event(), anyio.Event()
    with anyio.fail_after(LIMIT):
        async with server(lambda: GatedCounterEnv(entered, gate)) as running, proxied(running) as proxy:
            url = f"http+poll://127.0.0.1:{proxy.port}"
            async with CounterClient(url, share=False, poll_timeout=0.2) as env:
                await env.reset()

                async def cut_mid_poll() -> None:
                    await entered.wait()
                    await all_tasks_blocked()  # the client polls; the server holds the poll
                    assert proxy.cut() >= 1
                    gate.set()

                async with anyio.create_task_group() as task_group:
                    task_group.start_soon(cut_mid_poll)
                    result = await env.step(CountAction(by=2))
                assert result.observation.count == 2
                assert (await env.state()).count == 2
            assert proxy.connections >= 2  # it reconnected


async def test_connections_closed_between_requests_are_reopened_silently() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, proxied(running) as proxy:
            async with CounterClient(f"http+poll://127.0.0.1:{proxy.port}", share=False) as env:
                for count in range(1, 6):
                    assert (await env.step(CountAction())).observation.count == count
                    proxy.cut()  # as a server does with idle keep-alive connections
            assert proxy.connections >= 5


async def test_the_servers_own_keep_alive_close(monkeypatch: pytest.MonkeyPatch) -> None:
    # The servers' own keep-alive timeouts made short: uvicorn's (5 s by default), and
    # hypercorn's, which the runner sets to the header timeout.
    import uvicorn

    original = uvicorn.Config.__init__

    def short_keep_alive(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["timeout_keep_alive"] = 0.1
        original(self, *args, **kwargs)

    monkeypatch.setattr(uvicorn.Config, "__init__", short_keep_alive)
    with anyio.fail_after(LIMIT):
        async with (
            serve(create_app(AsyncCounterEnv), header_timeout=0.5) as running,
            proxied(running) as proxy,
            CounterClient(f"http+poll://127.0.0.1:{proxy.port}", share=False) as env,
        ):
            for count in range(1, 5):
                assert (await env.step(CountAction())).observation.count == count
                await wait_until(lambda: proxy.open_connections == 0, "the server closed the idle connections")


async def test_a_restarted_server_is_a_prompt_connection_closed() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            server() as running,
            proxied(running) as proxy,
            CounterClient(f"http+poll://127.0.0.1:{proxy.port}", share=False, retries=2) as env,
        ):
            await env.step(CountAction())
            proxy.cut()
            with anyio.fail_after(LIMIT):
                async with serve(create_app(AsyncCounterEnv)) as other:
                    proxy.upstream = other  # a restarted server knows no session
                    with pytest.raises(ConnectionClosed, match="does not know this session"):
                        await env.step(CountAction())


# -- sessions: expiry, capacity, deletion, shutdown ------------------------------------


async def test_an_idle_session_expires() -> None:
    clock = ManualClock()
    with anyio.fail_after(LIMIT):
        async with server(clock=clock) as running:
            registry = running.app.state.sessions
            async with CounterClient(poll_url(running), share=False) as env:
                await env.reset()
                await clock.advance_when_blocked(299.0)  # the reaper looks: idle for 299 s of 300
                assert registry.active == 1
                await clock.advance_when_blocked(5.0)  # its next look
                await wait_until(lambda: registry.active == 0)  # reaped: the client never deleted it
                assert len(AsyncCounterEnv.closed) == 1
                with pytest.raises(ConnectionClosed, match="idle") as caught:
                    await env.step(CountAction())
                assert str(caught.value).count("has ended") == 1, caught.value  # said once, not twice
                assert endpoint_of(running).session_count == 1  # its record lingers, for the client
                await clock.advance_when_blocked(60.0)  # the linger
                await wait_until(lambda: endpoint_of(running).session_count == 0)  # forgotten after it


def test_http_sessions_are_reaped_after_five_minutes_by_default() -> None:
    app = create_app(AsyncCounterEnv)
    assert app.state.sessions.idle_timeout_of("http") == 300.0
    assert app.state.sessions.idle_timeout_of("websocket") == 600.0
    app = create_app(AsyncCounterEnv, session_idle_timeout=30, http_idle_timeout=None)
    assert app.state.sessions.idle_timeout_of("http") == 30
    with pytest.raises(ValueError, match="http"):
        create_app(AsyncCounterEnv, http_idle_timeout=0)


async def test_capacity_is_shared_with_websocket_and_reported_like_it() -> None:
    with anyio.fail_after(LIMIT):
        async with server(max_sessions=1) as running:
            async with CounterClient(running.url) as ws_env:  # WebSocket holds the only slot
                await ws_env.reset()
                async with CounterClient(poll_url(running), share=False) as env:
                    with pytest.raises(openenv.CapacityReachedError) as info:
                        await env.reset()
                    assert info.value.data["max_sessions"] == 1
                    with pytest.raises(ConnectionClosed):
                        await env.step(CountAction())
                async with httpx.AsyncClient() as http:
                    response = await http.post(f"{running.url}/poll/sessions")
                assert response.status_code == 503
                assert response.headers["OpenEnv-Error"] == "CAPACITY_REACHED"
                assert json.loads(response.content)["data"]["code"] == "CAPACITY_REACHED"
            await wait_until(lambda: running.app.state.sessions.active == 0)
            async with CounterClient(poll_url(running), share=False) as env:  # the slot is free again
                assert (await env.step(CountAction())).observation.count == 1
                async with CounterClient(running.url) as ws_env:
                    with pytest.raises(openenv.CapacityReachedError):
                        await ws_env.reset()


async def test_a_failing_factory_is_reported_like_over_websocket() -> None:
    def broken() -> AsyncCounterEnv:
        raise OSError("no GPU left")

    with anyio.fail_after(LIMIT):
        async with server(broken) as running:
            async with raw_session(running) as session:
                # The environment is built when the first frame comes: that frame gets the error.
                assert (await session.get(wait=0)).status_code == 204
                response = await session.post(1)
                reply = observation(response)
                assert reply["data"]["code"] == "FACTORY_ERROR"
                assert response.headers["OpenEnv-Seq"] == "1"
                response = await session.get(ack=1)
                assert (response.status_code, error_code(response)) == (410, "session_ended")
                assert "could not be created" in response.json()["error"]["message"]
                response = await session.post(2)
                assert (response.status_code, error_code(response)) == (410, "session_ended")
                assert response.headers["OpenEnv-Received"] == "1"  # not accepted, not run
            assert running.app.state.sessions.active == 0


async def test_delete_ends_the_session_and_closes_the_environment() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            assert observation(await session.post(1))["data"]["observation"]["count"] == 1
            assert (await session.delete()).status_code == 204
            await wait_until(lambda: len(AsyncCounterEnv.closed) == 1)
            assert running.app.state.sessions.active == 0
            for response in (await session.get(), await session.post(2, ack=1), await session.delete()):
                assert (response.status_code, error_code(response)) == (404, "session_not_found")


async def test_a_close_frame_ends_the_session() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            response = await session.post(1, b'{"type":"close"}')
            assert (response.status_code, error_code(response)) == (410, "session_ended")
            assert response.headers["OpenEnv-Received"] == "1"  # accepted: it was the close
            assert response.json()["error"]["message"] == "the session has ended: the client closed the session"
            await wait_until(lambda: len(AsyncCounterEnv.closed) == 1)


async def test_server_shutdown_ends_http_sessions() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running:
            env = await CounterClient(poll_url(running), share=False, retries=1).connect()
            await env.step(CountAction())
        assert len(AsyncCounterEnv.closed) == 1
        with pytest.raises(ConnectionClosed):
            await env.step(CountAction())
        await env.close()


async def test_sessions_retried_with_the_same_idempotency_key_are_one() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient() as http:
            url = f"{running.url}/poll/sessions"
            key = {"Idempotency-Key": "k" * 32}
            first = await http.post(url, headers=key)
            second = await http.post(url, headers=key)
            assert first.status_code == second.status_code == 201
            assert first.json()["session_id"] == second.json()["session_id"]
            assert running.app.state.sessions.active == 1
            response = await http.post(url, headers=key, json={"encoding": "msgpack"})
            assert (response.status_code, error_code(response)) == (409, "idempotency_key_reused")
            response = await http.post(url, headers={"Idempotency-Key": "short"})
            assert (response.status_code, error_code(response)) == (400, "invalid_header")


# -- the protocol on the wire ----------------------------------------------------------


async def test_an_exchange_on_the_wire() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient() as http:
            response = await http.post(f"{running.url}/poll/sessions", json={"encoding": "json"})
            assert response.status_code == 201
            created = response.json()
            session_id = created["session_id"]
            assert len(session_id) >= 43  # secrets.token_urlsafe(32)
            session_key = created["session_key"]
            assert len(session_key) >= 43
            assert session_key != session_id
            assert created == {
                "session_id": session_id,
                "session_key": session_key,
                "encoding": "json",
                "max_body_size": 16 * 1024 * 1024,
                "max_wait": 60.0,
            }
            assert response.headers["Location"] == f"/poll/sessions/{session_id}"
            session = RawSession(http, running.url)
            session.id = session_id
            http.headers["OpenEnv-Session-Key"] = session_key
            response = await session.post(1, b'{"type":"reset","id":1,"data":{"episode_id":"e","start":3}}')
            assert response.headers["OpenEnv-Seq"] == "1"
            assert response.headers["Content-Type"] == "application/json"
            assert json.loads(response.content) == {
                "type": "observation",
                "id": 1,
                "data": {"observation": {"count": 3, "note": "", "metadata": {}}, "reward": 0.0, "done": False},
            }
            # The reply stays until acknowledged: a poll gets it again.
            response = await session.get(wait=0)
            assert (response.headers["OpenEnv-Seq"], response.headers["OpenEnv-Received"]) == ("1", "1")
            assert response.headers["Cache-Control"] == "no-store"
            # Acknowledged, and nothing else to come: 204 once the wait is over.
            response = await session.get(ack=1, wait=0.05)
            assert response.status_code == 204
            assert response.headers["OpenEnv-Received"] == "1"
            response = await session.post(2, b'{"type":"state","id":2}', ack=1)
            assert observation(response) == {
                "type": "state",
                "id": 2,
                "data": {"episode_id": "e", "step_count": 0, "count": 3},
            }
            assert (await session.delete()).status_code == 204


async def test_a_duplicated_post_is_answered_with_the_same_reply() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            first = await session.post(1)
            again = await session.post(1)
            assert again.content == first.content
            assert again.headers["OpenEnv-Seq"] == first.headers["OpenEnv-Seq"] == "1"
            # Pending: a slow step, posted without waiting, posted again while it runs.
            slow = b'{"type":"step","id":2,"data":{"by":1,"delay":0.3}}'
            assert (await session.post(2, slow, ack=1, wait=0)).status_code == 204
            reply = observation(await session.post(2, slow, ack=1))
            assert (reply["id"], reply["data"]["observation"]["count"]) == (2, 2)
            state = observation(await session.post(3, b'{"type":"state","id":3}', ack=2))
            assert state["data"]["step_count"] == 2  # each step ran once


async def test_sequence_numbers_from_the_future_or_the_far_past_are_refused() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            response = await session.post(2)
            assert (response.status_code, error_code(response)) == (409, "sequence_gap")
            assert "next frame expected is 1" in response.json()["error"]["message"]
            assert observation(await session.post(1))["data"]["observation"]["count"] == 1
            assert observation(await session.post(2, ack=1))["data"]["observation"]["count"] == 2
            # Frame 1's reply was acknowledged (and dropped): it cannot be replayed.
            response = await session.post(1, ack=2)
            assert (response.status_code, error_code(response)) == (409, "sequence_acknowledged")
            response = await session.get(ack=9)
            assert (response.status_code, error_code(response)) == (409, "ack_out_of_range")
            state = observation(await session.post(3, b'{"type":"state","id":3}', ack=2))
            assert state["data"]["count"] == 2  # nothing refused ran


async def test_a_client_that_never_acknowledges_is_stopped() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            for seq in range(1, 65):
                assert (await session.post(seq, wait=0)).status_code in (200, 204)
            response = await session.post(65, wait=0)
            assert (response.status_code, error_code(response)) == (409, "too_many_unacknowledged")
            assert observation(await session.get(ack=63)).get("id") == 1  # the 64th reply (every frame's id is 1)
            response = await session.post(65, ack=64, wait=0)
            assert response.status_code in (200, 204)


async def test_unknown_session_ids_get_404_and_never_another_sessions_data() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as mine:
            assert observation(await mine.post(1))["data"]["observation"]["count"] == 1
            async with httpx.AsyncClient() as http:
                stranger = RawSession(http, running.url)
                for guess in ("", "x", mine.id[:-1], mine.id + "x", mine.id.upper(), "../" + mine.id):
                    stranger.id = guess
                    response = await stranger.get(wait=0)
                    assert response.status_code == 404
                    assert mine.id not in response.text
                    assert b"count" not in response.content
            assert (await mine.get(wait=0)).headers["OpenEnv-Seq"] == "1"  # still there, unharmed


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"OpenEnv-Seq": "one"}, "invalid_header"),
        ({"OpenEnv-Seq": "0"}, "invalid_header"),
        ({"OpenEnv-Seq": "-1"}, "invalid_header"),
        ({"OpenEnv-Ack": "x"}, "invalid_header"),
        ({"OpenEnv-Wait": "-1"}, "invalid_header"),
        ({"OpenEnv-Wait": "nan"}, "invalid_header"),
    ],
)
async def test_malformed_headers_are_400(headers: dict[str, str], code: str) -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            response = await session.post(1, **headers)
            assert (response.status_code, error_code(response)) == (400, code)
            response = await session.http.post(session.frames, content=STEP, headers=JSON)  # no OpenEnv-Seq
            assert (response.status_code, error_code(response)) == (400, "invalid_header")
            assert observation(await session.post(1))["data"]["observation"]["count"] == 1


async def test_malformed_and_misdirected_bodies() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, httpx.AsyncClient() as http:
            url = f"{running.url}/poll/sessions"
            for body, status, code in [
                (b"{not json", 400, "invalid_body"),
                (b'{"encoding": "xml"}', 400, "invalid_body"),
                (b'{"encoding": 3}', 400, "invalid_body"),
                (b"[]", 400, "invalid_body"),
            ]:
                response = await http.post(url, content=body, headers=JSON)
                assert (response.status_code, error_code(response)) == (status, code), body
            response = await http.post(url, content=b"encoding=json", headers={"Content-Type": "text/plain"})
            assert (response.status_code, error_code(response)) == (415, "unsupported_media_type")
            response = await http.get(url)
            assert (response.status_code, error_code(response)) == (405, "method_not_allowed")
            assert running.app.state.sessions.active == 0
            # A frame that is not JSON is the session's business: an error reply, and it goes on.
            async with raw_session(running) as session:
                reply = observation(await session.post(1, b"{not json"))
                assert reply["data"]["code"] == "INVALID_JSON"
                assert observation(await session.post(2, ack=1))["data"]["observation"]["count"] == 1
                response = await session.http.put(session.frames)
                assert (response.status_code, error_code(response)) == (405, "method_not_allowed")


async def test_wrong_content_types_are_415() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running, raw_session(running) as session:
            for content_type in ("text/plain", "application/msgpack", "application/x-www-form-urlencoded"):
                response = await session.post(1, **{"Content-Type": content_type})
                assert (response.status_code, error_code(response)) == (415, "unsupported_media_type")
            response = await session.post(1, **{"Content-Type": "application/json; charset=utf-8"})
            assert observation(response)["data"]["observation"]["count"] == 1


async def test_oversize_bodies_are_413_and_nothing_runs() -> None:
    with anyio.fail_after(LIMIT):
        async with server(max_message_size=1000) as running:
            async with raw_session(running) as session:
                assert session.created["max_body_size"] == 1000
                big = b'{"type":"step","id":1,"data":{"by":1,"pad":"' + b"x" * 1000 + b'"}}'
                response = await session.post(1, big)
                assert (response.status_code, error_code(response)) == (413, "body_too_large")

                async def chunked() -> AsyncIterator[bytes]:  # no Content-Length to check up front
                    for _ in range(4):
                        yield b"x" * 400

                headers = {**JSON, "OpenEnv-Seq": "1"}
                response = await session.http.post(session.frames, content=chunked(), headers=headers)
                assert (response.status_code, error_code(response)) == (413, "body_too_large")
                assert observation(await session.post(1))["data"]["observation"]["count"] == 1
            async with EnvClient(poll_url(running), share=False) as env:
                with pytest.raises(ConnectionClosed, match="over the server's limit"):
                    await env.step({"by": 1, "pad": "x" * 2000})


async def test_msgpack_frames() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running:
            async with CounterClient(poll_url(running), share=False, encoding="msgpack") as env:
                assert env.transport is not None
                assert env.transport.dialect == openenv.Dialect("msgpack", True)
                await env.reset(start=2)
                assert (await env.step(CountAction(by=3))).observation.count == 5
            async with raw_session(running, encoding="msgpack") as session:
                frame = msgspec.msgpack.encode({"type": "state", "id": 1})
                response = await session.post(1, frame, **{"Content-Type": "application/msgpack"})
                assert response.headers["Content-Type"] == "application/msgpack"
                assert msgspec.msgpack.decode(response.content)["type"] == "state"
                response = await session.post(2, b'{"type":"state","id":2}', ack=1)
                assert (response.status_code, error_code(response)) == (415, "unsupported_media_type")


async def test_sync_environments_and_many_sessions_at_once() -> None:
    async def one(url: str, index: int) -> None:
        async with CounterClient(url, share=False) as env:
            await env.reset(start=index)
            for step in range(10):
                result = await env.step(CountAction(by=1, delay=0.001))
                assert result.observation.count == index + step + 1

    with anyio.fail_after(LIMIT):
        async with server(SyncCounterEnv) as running:
            async with anyio.create_task_group() as task_group:
                for index in range(8):
                    task_group.start_soon(one, poll_url(running), index * 100)
            await wait_until(lambda: running.app.state.sessions.active == 0)


# -- the client: URLs, options, connecting ------------------------------------------


def test_urls() -> None:
    assert polling_url("http+poll://h:8000") == ("http://h:8000", "")
    assert polling_url("HTTPS+POLL://h/env/") == ("https://h/env", "")
    assert polling_url("http+poll://h:1/p?token=t#frag") == ("http://h:1/p", "?token=t")
    for bad in ("ws://h", "h:8000", "http+poll://", "ftp+poll://h"):
        with pytest.raises(ValueError, match=r"URL|host"):
            polling_url(bad)
    # The scheme picks the transport: plain http:// stays WebSocket.
    assert isinstance(create_transport("http://h:1"), WebSocketTransport)
    assert isinstance(create_transport("http+poll://h:1"), HTTPPollingTransport)
    assert isinstance(create_transport("https+poll://h:1"), HTTPPollingTransport)


def test_options_are_checked() -> None:
    with pytest.raises(ValueError, match="encoding"):
        HTTPPollingTransport("http+poll://h", encoding="xml")
    with pytest.raises(ValueError, match="OpenEnv-Seq"):
        HTTPPollingTransport("http+poll://h", headers={"OpenEnv-Seq": "1"})
    with pytest.raises(ValueError, match="poll_timeout"):
        HTTPPollingTransport("http+poll://h", poll_timeout=0)
    with pytest.raises(ValueError, match="retries"):
        HTTPPollingTransport("http+poll://h", retries=-1)


def test_the_package_exports() -> None:
    assert sorted(http_package.__all__) == http_package.__all__
    for name in http_package.__all__:
        assert getattr(http_package, name) is not None


async def test_headers_and_a_given_client_are_used() -> None:
    seen: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request)

    with anyio.fail_after(LIMIT):
        async with server() as running:
            async with httpx.AsyncClient(headers={"X-From-Client": "c"}, event_hooks={"request": [record]}) as http:
                headers = {"Authorization": "Bearer t"}
                async with CounterClient(poll_url(running), share=False, client=http, headers=headers) as env:
                    await env.step(CountAction())
                assert not http.is_closed
            assert len(seen) == 4  # create, step, close, delete
            for request in seen:
                assert request.headers["Authorization"] == "Bearer t"
                assert request.headers["X-From-Client"] == "c"


async def test_connect_failures() -> None:
    with anyio.fail_after(LIMIT):
        with socket_nobody_listens_on() as port, pytest.raises(ConnectError, match="cannot create a session"):
            async with HTTPPollingTransport(f"http+poll://127.0.0.1:{port}", share=False, retries=1):
                pass
        async with serve(EchoEnvironment) as running:
            with pytest.raises(ConnectError, match="404"):
                async with HTTPPollingTransport(f"http+poll://127.0.0.1:{running.port}/not/here", share=False):
                    pass
        transport = HTTPPollingTransport("http+poll://127.0.0.1:9")
        with pytest.raises(ConnectionClosed):
            await transport.send(b"{}")
        with pytest.raises(ConnectionClosed):
            await transport.receive()
        await transport.aclose()
        with pytest.raises(ClientStateError):
            await transport.__aenter__()


async def test_closed_transport_refuses_frames() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running:
            transport = HTTPPollingTransport(running.url, share=False)
            async with transport:
                await transport.send(STEP)
            await transport.aclose()  # idempotent
            with pytest.raises(ConnectionClosed, match="closed by the client"):
                await transport.receive()
            with pytest.raises(ConnectionClosed):
                await transport.send(STEP)
            await wait_until(lambda: endpoint_of(running).session_count == 0)


async def test_aclose_ends_a_receive_in_another_task() -> None:
    with anyio.fail_after(LIMIT):
        async with server() as running:
            transport = HTTPPollingTransport(running.url, share=False)
            async with transport, anyio.create_task_group() as task_group:

                async def receive() -> None:
                    with pytest.raises(ConnectionClosed, match="closed by the client"):
                        await transport.receive()

                task_group.start_soon(receive)
                await all_tasks_blocked()  # it is polling: the server holds its request
                await transport.aclose()


class socket_nobody_listens_on:
    """A loopback port with nothing listening on it, for the duration of a ``with``."""

    def __enter__(self) -> int:
        import socket

        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        return int(self._socket.getsockname()[1])

    def __exit__(self, *exc_info: object) -> None:
        self._socket.close()


def test_the_registry_reaps_each_transport_after_its_own_timeout() -> None:
    clock = ManualClock()
    registry = SessionRegistry(session_idle_timeout=100.0, transport_idle_timeouts={"http": 10.0}, clock=clock)
    websocket = registry.open(transport="websocket")
    http = registry.open(transport="http")
    assert websocket is not None
    assert http is not None
    assert (websocket.idle_timeout, http.idle_timeout) == (100.0, 10.0)
    assert registry.reap_interval == 2.5
    clock.advance(11)
    assert registry.expire_idle() == [http]
    clock.advance(100)
    assert registry.expire_idle() == [websocket]
    assert SessionRegistry(transport_idle_timeouts={"http": 5.0}).reap_interval == 1.25
    with pytest.raises(ValueError, match="'http' sessions"):
        SessionRegistry(transport_idle_timeouts={"http": 0})


async def test_sessions_opening_and_ending_are_in_the_server_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="openenv.server")
    with anyio.fail_after(LIMIT):
        async with server() as running:
            async with CounterClient(poll_url(running), share=False) as env:
                await env.reset()
                session_id = env.transport.session_id  # type: ignore[union-attr]
            await wait_until(lambda: running.app.state.sessions.active == 0)
    messages = [record.getMessage() for record in caplog.records if record.name == "openenv.server"]
    assert "127.0.0.1:" in messages[0]
    assert messages[0].endswith(f"HTTP long-polling session {session_id[:8]}… opened")
    assert f"HTTP long-polling session {session_id[:8]}… ended: the client closed the session" in messages
    assert not any(session_id in message for message in messages)  # the id is a credential: never whole


async def test_a_plain_http_client_loads_no_ca_bundle(monkeypatch: pytest.MonkeyPatch) -> None:
    def load_ca_bundle() -> None:
        raise AssertionError("a plain http+poll:// client built a TLS context (it loads the CA bundle)")

    monkeypatch.setattr(http_client_module, "default_ssl_context", load_ca_bundle)
    with anyio.fail_after(LIMIT):
        async with server() as running, CounterClient(poll_url(running)) as env:  # on a link
            assert (await env.reset()).observation.count == 0


# -- proxies from the environment ---------------------------------------------------


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST.", True),
        ("env.localhost", True),
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("10.0.0.1", False),
        ("example.com", False),
        ("localhost.example.com", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


async def test_a_proxy_from_the_environment_is_used_except_for_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """As OpenEnv's client and Go's net/http: HTTP_PROXY applies, but never to a loopback host."""
    seen: list[bytes] = []

    async def fake_proxy(stream: anyio.abc.ByteStream) -> None:
        async with stream:
            seen.append(await stream.receive())
            await stream.send(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    with anyio.fail_after(LIMIT):
        async with await anyio.create_tcp_listener(local_host="127.0.0.1") as listener, anyio.create_task_group() as tg:
            tg.start_soon(listener.serve, fake_proxy)
            proxy = f"http://127.0.0.1:{listener.extra(anyio.abc.SocketAttribute.local_port)}"
            for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY"):
                monkeypatch.setenv(name, proxy)
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            async with server(AsyncCounterEnv) as running:
                for host in ("127.0.0.1", "localhost"):
                    url = poll_url(running).replace("127.0.0.1", host)
                    async with CounterClient(url) as env:
                        assert (await env.step(CountAction(by=2))).observation.count == 2
            assert seen == []
            # Any other host goes through the proxy (which answers 502 here).
            with pytest.raises(ConnectError, match="502"):
                async with CounterClient("http+poll://envs.example:8000", retries=0):
                    pass
            assert len(seen) == 1
            assert seen[0].startswith(b"POST http://envs.example:8000/poll/links ")  # a link first
            tg.cancel_scope.cancel()

"""Helpers the test modules share: the counter environment's typed client, waiting on state, a clock, a TCP proxy."""

from __future__ import annotations

import heapq
import itertools
import math
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol

import anyio
import anyio.lowlevel
from anyio.abc import SocketAttribute, SocketStream, TaskGroup, TaskStatus

from openenv import Clock, EnvClient
from openenv._lane import LaneCalls
from tests.envs import CountAction, CountObservation, CountState
from transports.server.runner import current_backend


class CounterClient(EnvClient[CountAction, CountObservation, CountState]):
    """The typed client of the counter environments in `tests.envs`."""


async def wait_until(condition: Callable[[], bool | Awaitable[bool]], what: str = "", *, every: float = 0.01) -> None:
    """Return once ``condition()`` holds; for state that has no event of its own (the caller bounds the wait).

    ``condition`` may be a coroutine function (to ask another process, say);
    it is asked again every ``every`` seconds. ``what`` names the awaited
    state for the reader of the test.
    """
    while True:
        holds = condition()
        if not isinstance(holds, bool):
            holds = await holds
        if holds:
            return
        await anyio.sleep(every)  # polls state that has no event of its own


class ManualClock(Clock):
    """A clock that stands still until a test advances it: every timeout it measures fires on `advance`.

    Give it to a client (``EnvClient(url, clock=clock)``) or a transport; then
    a 60 s reply timeout, a keepalive's interval or a retry's backoff passes in
    no time, at the moment the test chooses, under asyncio and trio alike.
    """

    def __init__(self) -> None:
        self._now = 0.0
        self._order = itertools.count()
        # (deadline, order, what to wake or cancel), earliest first.
        self._timers: list[tuple[float, int, anyio.Event | anyio.CancelScope]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        heapq.heappush(self._timers, (self._now + seconds, next(self._order), woken))
        await woken.wait()

    def cancel_scope(self, *, deadline: float = math.inf, shield: bool = False) -> anyio.CancelScope:
        scope = anyio.CancelScope(shield=shield)
        if deadline <= self._now:
            scope.cancel()
        elif deadline != math.inf:
            heapq.heappush(self._timers, (deadline, next(self._order), scope))
        return scope

    def advance(self, seconds: float) -> None:
        """Move the time on by ``seconds``: wake the sleeps and cancel the scopes whose time has come."""
        self._now += seconds
        while self._timers and self._timers[0][0] <= self._now:
            _, _, timer = heapq.heappop(self._timers)
            if isinstance(timer, anyio.Event):
                timer.set()
            else:
                timer.cancel()  # harmless on a scope already left

    async def advance_when_blocked(self, seconds: float) -> None:
        """Once every task of the event loop waits (a request at the environment, say), advance by ``seconds``."""
        await all_tasks_blocked()
        self.advance(seconds)

    async def keep_advancing(self, seconds: float) -> None:
        """Advance by ``seconds`` each time every other task waits, until cancelled: time flows, as fast as it can."""
        while True:
            await self.advance_when_blocked(seconds)


async def cancel_when_blocked(scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once every task of the event loop waits: a caller giving up on a call in flight."""
    await all_tasks_blocked()
    scope.cancel()


_LOOK_AGAIN = 0.013  # seconds: no server's tick divides it (uvicorn's main loop wakes every 0.1 s)


async def all_tasks_blocked() -> None:
    """Return once every other task of the event loop waits: `anyio.wait_all_tasks_blocked`, safe beside uvicorn.

    On asyncio, anyio looks every 0.1 s, and a uvicorn served in the test's
    event loop wakes its main loop every 0.1 s too: once the two fall in step,
    each look finds uvicorn's task just woken, and the wait never ends (a
    test's bound then fails it, on a loaded machine). This looks at a cadence
    of its own. On trio, anyio's asks trio, which knows.
    """
    if current_backend() != "asyncio":
        await anyio.wait_all_tasks_blocked()
        return
    import asyncio  # the event loop's own view of its tasks; anyio has no public one

    await anyio.lowlevel.checkpoint()
    this_task = asyncio.current_task()
    while True:
        for task in asyncio.all_tasks():
            waiter = getattr(task, "_fut_waiter", None)  # what the task waits on (as anyio reads it)
            if task is not this_task and (waiter is None or waiter.done()):
                await anyio.sleep(_LOOK_AGAIN)
                break
        else:
            return


class Upstream(Protocol):
    """Where a proxy forwards to (a `transports.server.runner.RunningServer`, say)."""

    host: str
    port: int


def free_port() -> int:
    """A loopback port nothing listens on now, for a server started as a process of its own."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_for_port(port: int) -> None:
    """Return once a server (a process of its own, starting) accepts connections on ``port``; the caller bounds it."""
    while True:
        try:
            stream = await anyio.connect_tcp("127.0.0.1", port)
        except OSError:
            await anyio.sleep(0.05)
        else:
            await stream.aclose()
            return


class _Link:
    """One connection through the proxy."""

    def __init__(self) -> None:
        self.scope = anyio.CancelScope()
        self.dead = False  # bytes read are dropped, in both directions


class CuttingProxy:
    """A TCP proxy in front of a server that can cut its connections, hold new ones, or make them go silent.

    Attributes:
        upstream: The server connections are forwarded to (assign another to "restart" it).
        port: The proxy's own port, once `run` has started.
        connections: How many connections came through, ever.
        open_connections: How many are open now.
        dropped: Set once a silenced connection dropped some bytes.
    """

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.port = 0
        self.connections = 0
        self.dropped = anyio.Event()
        self._links: set[_Link] = set()
        self._open = anyio.Event()
        self._open.set()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(SocketAttribute.local_port)
        async with listener:
            task_status.started()
            await listener.serve(self._forward)

    async def _forward(self, client: SocketStream) -> None:
        self.connections += 1
        link = _Link()
        self._links.add(link)
        try:
            with link.scope:
                async with client:
                    await self._open.wait()  # held: the client waits, connected to us only
                    upstream = await anyio.connect_tcp(self.upstream.host, self.upstream.port)
                    async with upstream, anyio.create_task_group() as task_group:
                        task_group.start_soon(self._pump, client, upstream, task_group, link)
                        task_group.start_soon(self._pump, upstream, client, task_group, link)
        except OSError:
            pass  # the upstream is down: the client sees its connection end
        finally:
            self._links.discard(link)

    async def _pump(self, source: SocketStream, sink: SocketStream, task_group: TaskGroup, link: _Link) -> None:
        try:
            async for chunk in source:
                if link.dead:
                    self.dropped.set()
                    continue
                await sink.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        task_group.cancel_scope.cancel()

    @property
    def open_connections(self) -> int:
        """How many connections are open through the proxy now."""
        return len(self._links)

    def cut(self) -> int:
        """Close every connection now, mid-request or idle; return how many."""
        links = list(self._links)
        for link in links:
            link.scope.cancel()
        return len(links)

    def silence(self) -> int:
        """Make every connection drop what it carries, both ways, without closing (a dead path); how many."""
        for link in self._links:
            link.dead = True
        return len(self._links)

    def hold(self) -> None:
        """Keep new connections waiting (connected to the proxy, not to the server) until `release`."""
        if self._open.is_set():
            self._open = anyio.Event()

    def release(self) -> None:
        """Let held and new connections through."""
        self._open.set()


@asynccontextmanager
async def proxied(upstream: Upstream) -> AsyncIterator[CuttingProxy]:
    """A `CuttingProxy` in front of ``upstream``, running for the block."""
    proxy = CuttingProxy(upstream)
    async with anyio.create_task_group() as task_group:
        await task_group.start(proxy.run)
        yield proxy
        task_group.cancel_scope.cancel()


@contextmanager
def loop_calls() -> Iterator[list[Any]]:
    """The calls of blocking clients that went through the event loop's thread while in the block (one entry each).

    An entry is what the lane left unfinished (`openenv._lane.Unfinished`), or
    ``"through the loop"`` for a call that never tried the lane.
    """
    finished: list[Any] = []
    original_finish, original_through = LaneCalls.finish, LaneCalls.through_the_loop

    async def finish(self: LaneCalls, *args: Any) -> Any:
        finished.append(args[1])
        return await original_finish(self, *args)

    async def through_the_loop(self: LaneCalls, call: Any) -> Any:
        finished.append("through the loop")
        return await original_through(self, call)

    LaneCalls.finish = finish  # type: ignore[method-assign]
    LaneCalls.through_the_loop = through_the_loop  # type: ignore[method-assign]
    try:
        yield finished
    finally:
        LaneCalls.finish = original_finish  # type: ignore[method-assign]
        LaneCalls.through_the_loop = original_through  # type: ignore[method-assign]

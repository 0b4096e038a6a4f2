"""A fleet of openenv sessions against one server (or in-process): opened, stepped for a while, measured.

    python -m tests.benchmarks.fleet_client URL --sessions N --mode pool|clients|pool-recv --seconds T
        [--no-share] [--server-pid PID] [--open-timeout S] [--backend asyncio|trio] [--gc-freeze]

Prints one JSON line (`tests.benchmarks._fleet_record`): steps/s, latency, errors,
the TCP connections this process holds to the server's port (the URL's), the
server's memory per session (``--server-pid``; in-process: this process's),
the time to open the N sessions, CPU per step. Modes:

- ``pool``: one `EnvPool` of N sessions, ``pool.step(actions)`` in a loop; its
  latency is a pool step's.
- ``clients``: N independent `EnvClient`s, each opened and stepped in a task of
  its own, the way trainers write it (TRL, SkyRL, ART); all open at once.
- ``pool-recv``: one `EnvPool` driven by envpool's asynchronous pair, ``send``
  to the sessions whose results came back, ``recv`` of at least half of them;
  where `EnvPool` has no ``send``/``recv``, it exits with status 3.

``--no-share`` gives each session a connection of its own (``share=False``);
by default the transport decides (sessions to one server share a link where
the transport and the server can). ``--gc-freeze`` calls `gc.freeze` once the
sessions are open and have stepped, before the timed part, as a long-running
trainer may: Python's cyclic garbage collector then no longer walks the
objects the sessions keep (docs/scaling.md, "The pool is a batch"). Before the
N sessions open, one session opens, steps and closes, so that the server has
loaded what it loads lazily;
the server's memory then is the idle figure.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import anyio

from openenv import (
    ClientStateError,
    EnvClient,
    EnvPool,
    EnvPoolError,
    OpenEnvError,
    ServerError,
    State,
    TransportError,
)
from openenv._registry import takes_option
from tests.benchmarks._fleet_record import FleetRecord
from tests.benchmarks.envs import MessageAction, MessageObservation

ACTION = MessageAction(message="hello")
WARM_STEPS = 3
# The exit status when the mode needs what this openenv does not have (EnvPool's send and recv).
NOT_AVAILABLE = 3


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


def _ends_session(exc: OpenEnvError) -> bool:
    return isinstance(exc, (TransportError, ClientStateError)) or (isinstance(exc, ServerError) and exc.fatal)


async def warm_up(url: str, options: dict[str, Any]) -> None:
    """One session opened, stepped and closed: the server (or this process) loads what it loads lazily."""
    async with MessageEnv(url, **options) as client:
        await client.reset()
        for _ in range(WARM_STEPS):
            await client.step(ACTION)


class _Gate:
    """Set once ``count`` sessions have passed it (each exactly once)."""

    def __init__(self, count: int) -> None:
        self.left = count
        self.event = anyio.Event()

    def pass_(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.event.set()


async def run_clients(
    url: str,
    record: FleetRecord,
    seconds: float,
    options: dict[str, Any],
    open_timeout: float,
    gc_freeze: bool = False,
) -> None:
    """N independent clients, each opened and stepped in a task of its own."""
    count = record.sessions
    ready, finished = _Gate(count), _Gate(count)
    go, release = anyio.Event(), anyio.Event()
    opened_at: list[float] = []
    last_reply = [0.0]
    deadline = [math.inf]

    async def session() -> None:
        passed_ready = passed_finished = False
        try:
            client = MessageEnv(url, **options)
            with anyio.CancelScope() as connecting:
                connecting.deadline = anyio.current_time() + open_timeout
                async with client:
                    connecting.deadline = math.inf
                    opened_at.append(time.perf_counter())
                    record.opened += 1
                    await client.reset()
                    passed_ready = True
                    ready.pass_()
                    await go.wait()
                    perf_counter, latencies = time.perf_counter, record.latencies
                    while perf_counter() < deadline[0]:
                        started = perf_counter()
                        try:
                            await client.step(ACTION)
                        except OpenEnvError as exc:
                            record.error(exc)
                            if _ends_session(exc):
                                break
                            continue
                        now = perf_counter()
                        latencies.append(now - started)
                        last_reply[0] = max(last_reply[0], now)
                    passed_finished = True
                    finished.pass_()
                    await release.wait()  # closed after the connections are counted
            if connecting.cancelled_caught:
                record.error(TimeoutError(f"no connection within {open_timeout} s"))
        except OpenEnvError as exc:
            record.error(exc)
        finally:
            if not passed_ready:
                ready.pass_()
            if not passed_finished:
                finished.pass_()

    async with anyio.create_task_group() as group:
        started = time.perf_counter()
        for _ in range(count):
            group.start_soon(session)
        await ready.event.wait()
        record.open_s = (max(opened_at) - started) if opened_at else None
        record.all_open()
        if gc_freeze:
            gc.freeze()
        record.start()
        deadline[0] = time.perf_counter() + seconds
        go.set()
        await finished.event.wait()
        record.stop(at=last_reply[0] or None)
        record.steps = len(record.latencies)
        record.count_connections()
        release.set()


async def run_pool(
    url: str, record: FleetRecord, seconds: float, options: dict[str, Any], recv: bool, gc_freeze: bool = False
) -> None:
    """One EnvPool of N sessions: ``pool.step`` in a loop, or envpool's ``send`` and ``recv``."""
    count = record.sessions
    actions = [ACTION] * count
    started = time.perf_counter()
    try:
        async with EnvPool(url, size=count, client=MessageEnv, **options) as pool:
            record.open_s = time.perf_counter() - started
            record.opened = count
            await pool.reset()
            record.all_open()
            for _ in range(WARM_STEPS):
                await pool.step(actions)
            if gc_freeze:
                gc.freeze()
            if recv:
                await _send_recv(pool, record, seconds)
            else:
                await _step_loop(pool, actions, record, seconds)
            record.count_connections()
    except EnvPoolError as exc:
        for error in exc.errors.values():
            record.error(error)
    except OpenEnvError as exc:  # the pool could not open: none of its sessions can step
        record.error(exc)
        record.errors = count - record.opened


async def _step_loop(pool: EnvPool[Any, Any, Any], actions: list[Any], record: FleetRecord, seconds: float) -> None:
    perf_counter, latencies = time.perf_counter, record.latencies
    record.start()
    deadline = perf_counter() + seconds
    while True:  # one step at least, however short the run
        began = perf_counter()
        try:
            await pool.step(actions)
            record.steps += pool.size
        except EnvPoolError as exc:
            record.steps += pool.size - len(exc.errors)
            for error in exc.errors.values():
                record.error(error)
            if len(exc.errors) == pool.size:
                break
        latencies.append(perf_counter() - began)
        if perf_counter() >= deadline:
            break
    record.stop()


async def _send_recv(pool: Any, record: FleetRecord, seconds: float) -> None:
    """Envpool's asynchronous pair: send to every session, then receive at least half and send to those again."""
    count = pool.size
    at_least = max(count // 2, 1)
    perf_counter = time.perf_counter
    await pool.send([ACTION] * count)
    record.start()
    deadline = perf_counter() + seconds
    while True:  # one round at least, however short the run
        began = perf_counter()
        ready = await pool.recv(min_results=at_least)  # {session index: result}
        record.latencies.append(perf_counter() - began)
        record.steps += len(ready)
        await pool.send([ACTION] * len(ready), indices=list(ready))
        if perf_counter() >= deadline:
            break
    record.stop()  # the steps still in flight end with the pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--mode", choices=["pool", "clients", "pool-recv"], default="pool")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--no-share", action="store_true", help="a connection per session (share=False)")
    parser.add_argument("--server-pid", type=int, help="the server process, whose memory and CPU are read")
    parser.add_argument("--open-timeout", type=float, default=60.0, help="seconds a session may take to open")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() once the sessions are open, before the timed part"
    )
    args = parser.parse_args()
    if args.mode == "pool-recv" and not (hasattr(EnvPool, "send") and hasattr(EnvPool, "recv")):
        print("EnvPool has no send and recv yet", file=sys.stderr)
        sys.exit(NOT_AVAILABLE)
    # A transport without the option has a connection per session already (http+poll before its link).
    options: dict[str, Any] = {"share": False} if args.no_share and takes_option(args.url, "share") else {}
    port = None if args.url.startswith("inproc://") else urlsplit(args.url).port
    record = FleetRecord(args.sessions, server_pid=args.server_pid, port=port)

    async def measure() -> dict[str, Any]:
        await warm_up(args.url, options)
        record.idle()
        if args.mode == "clients":
            await run_clients(args.url, record, args.seconds, options, args.open_timeout, args.gc_freeze)
        else:
            await run_pool(args.url, record, args.seconds, options, args.mode == "pool-recv", args.gc_freeze)
        return record.document(mode=args.mode, share=not args.no_share, backend=args.backend, gc_freeze=args.gc_freeze)

    print(json.dumps(anyio.run(measure, backend=args.backend)), flush=True)


if __name__ == "__main__":
    main()

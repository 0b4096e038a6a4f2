"""The floors of a fleet's step on this machine: what no server, transport or pool can beat.

Run by `tests.benchmarks.compare` beside the fleet rows (or by hand); prints one JSON
object of steps per second, each the median of ``--runs``:

- ``threads``: ``--sessions`` threads, each handed a call that does nothing and
  waited for, round after round, with nothing else (no network, no environment,
  no event loop): the floor of a plain ``def step`` environment with thread
  affinity (each session's calls on a thread of its own), however its steps arrive;
- ``session_threads``: the same calls through openenv's own `CallBatch` and
  `SessionWorker` (what a server does with a batch of plain steps);
- ``loop``: the async echo stepped in ``--sessions`` environments in one loop,
  their actions decoded from one message and their observations encoded as one
  (the loop issue 21 names): the floor of an `EnvPool` over ``inproc://``, which
  does that and keeps each session's guarantees besides.

    python -m tests.benchmarks.fleet_floor [--sessions 1024] [--seconds 2] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import threading
import time
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from openenv._worker import CallBatch, SessionWorker
from tests.benchmarks._timing import timed_rate
from tests.benchmarks.envs import AsyncMessageEchoEnv, MessageAction

# Rounds run before the timed part: threads started, caches warm.
WARMUP_ROUNDS = 10


def _rate(one_round: Callable[[], object], sessions: int, seconds: float) -> float:
    """Steps per second of ``one_round`` (``sessions`` steps each), timed for about ``seconds``."""
    for _ in range(WARMUP_ROUNDS):
        one_round()
    rounds, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        one_round()
        rounds += 1
    return rounds * sessions / (time.perf_counter() - start)


async def _async_rate(one_round: Callable[[], Awaitable[object]], sessions: int, seconds: float) -> float:
    """`_rate` for a round that is awaited (the benchmarks' shared timing loop, one round per check)."""
    timed = await timed_rate(one_round, seconds, warmup=WARMUP_ROUNDS, batch=1)
    return timed["rate"] * sessions


def threads(sessions: int, seconds: float) -> float:
    """Bare threads: one call each per round, handed over and waited for."""
    inboxes: list[queue.SimpleQueue[bool]] = [queue.SimpleQueue() for _ in range(sessions)]
    lock, all_done = threading.Lock(), threading.Event()
    left = 0

    def serve(inbox: queue.SimpleQueue[bool]) -> None:
        nonlocal left
        while inbox.get():
            with lock:
                left -= 1
                if left == 0:
                    all_done.set()

    workers = [threading.Thread(target=serve, args=(inbox,), daemon=True) for inbox in inboxes]
    for worker in workers:
        worker.start()

    def one_round() -> None:
        nonlocal left
        all_done.clear()
        left = sessions
        for inbox in inboxes:
            inbox.put(True)
        all_done.wait()

    try:
        return _rate(one_round, sessions, seconds)
    finally:
        for inbox in inboxes:
            inbox.put(False)
        for worker in workers:
            worker.join()


def _nothing() -> None:
    return None


def session_threads(sessions: int, seconds: float) -> float:
    """openenv's batch hand-over: each session's call on its `SessionWorker`'s thread, one `CallBatch` per round."""

    async def measure() -> float:
        workers = [SessionWorker() for _ in range(sessions)]

        async def one_round() -> None:
            batch = CallBatch()
            calls = [worker.start(batch, _nothing) for worker in workers]
            await batch.wait(60.0)
            for call in calls:
                call.outcome()

        try:
            return await _async_rate(one_round, sessions, seconds)
        finally:
            for worker in workers:
                await worker.aclose()

    return anyio.run(measure)


def loop(sessions: int, seconds: float) -> float:
    """The async echo's steps in one loop: actions decoded from one message, observations encoded as one."""

    async def measure() -> float:
        environments = [AsyncMessageEchoEnv() for _ in range(sessions)]
        for environment in environments:
            await environment.reset()
        message = msgspec.json.encode([MessageAction(message=f"m{index}") for index in range(sessions)])
        decode = msgspec.json.Decoder(list[MessageAction]).decode
        encode = msgspec.json.Encoder().encode

        async def one_round() -> None:
            actions = decode(message)
            encode([await environment.step(action) for environment, action in zip(environments, actions, strict=True)])

        return await _async_rate(one_round, sessions, seconds)

    return anyio.run(measure)


FLOORS: dict[str, Callable[[int, float], float]] = {
    "threads": threads,
    "session_threads": session_threads,
    "loop": loop,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {name: [] for name in FLOORS}
    for _ in range(args.runs):  # interleaved, so that drift hits all alike
        for name, floor in FLOORS.items():
            rates[name].append(floor(args.sessions, args.seconds))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(json.dumps({"sessions": args.sessions, "seconds": args.seconds, "runs": args.runs, **medians}))


if __name__ == "__main__":
    main()

"""The hand-off of a plain call to a session's thread and back, beside its floor: two threads passing locks.

Not a test: run it by hand.

    python -m tests.benchmarks.bench_worker_hop [--calls 20000] [--runs 3]

``SessionWorker.run`` of a function that does nothing, awaited on an event loop
(asyncio), against the least any hand-off between two Python threads costs:
one thread releases a lock the other waits on, and waits on a second lock that
the other releases; once waiting without a timeout, once with the timeout the
event loop's wait has (`openenv._worker.INLINE_WAIT`: it may not block longer).
Both figures are per round trip: wall time, and the CPU time of the process
(both threads, and the kernel's work on their behalf). A hand-off cheaper than
the floor needs no second thread.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import anyio

from openenv._worker import INLINE_WAIT, SessionWorker


def _nothing() -> None:
    pass


async def worker_hop(calls: int) -> tuple[float, float]:
    """Wall and CPU microseconds per ``SessionWorker.run`` of a no-op."""
    worker = SessionWorker()
    await worker.run(_nothing)  # the thread starts
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await worker.run(_nothing)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await worker.aclose()
    return 1e6 * wall / calls, 1e6 * cpu / calls


def lock_ping_pong(calls: int, *, timed: bool) -> tuple[float, float]:
    """Wall and CPU microseconds per round trip of two threads passing two locks (with a timed wait if ``timed``)."""
    ping, pong = threading.Lock(), threading.Lock()
    ping.acquire()
    pong.acquire()

    def answer() -> None:
        for _ in range(calls):
            ping.acquire()
            pong.release()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        ping.release()
        while not pong.acquire(timeout=INLINE_WAIT if timed else -1):
            pass
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    thread.join()
    return 1e6 * wall / calls, 1e6 * cpu / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float]]] = {"SessionWorker.run": [], "two locks, timed": [], "two locks": []}
    for _ in range(args.runs):  # interleaved
        rows["SessionWorker.run"].append(anyio.run(worker_hop, args.calls))
        rows["two locks, timed"].append(lock_ping_pong(args.calls, timed=True))
        rows["two locks"].append(lock_ping_pong(args.calls, timed=False))
    print(f"medians of {args.runs} runs of {args.calls:,} round trips")
    print(f"{'hand-off':20} {'wall us':>8} {'CPU us':>8}")
    for name, figures in rows.items():
        wall = statistics.median(w for w, _ in figures)
        cpu = statistics.median(c for _, c in figures)
        print(f"{name:20} {wall:>8.1f} {cpu:>8.1f}")


if __name__ == "__main__":
    main()

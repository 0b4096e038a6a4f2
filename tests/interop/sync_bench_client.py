"""Steps per second of a blocking client, openenv's or upstream's, in one of five patterns.

    python tests/interop/sync_bench_client.py URL --client ours|upstream --pattern PATTERN --seconds S [--sessions 64]

``--client ours`` is ``EnvClient(url).sync()`` (run it with our python, this checkout's
folder, or an earlier one's, on ``PYTHONPATH``); ``--client upstream`` is
``GenericEnvClient(base_url=url).sync()`` (run it with a reference venv's python, which
imports its own ``openenv`` first: `reference_import`). The script is run by path, so
that either ``openenv`` is the one imported; it needs nothing else of this tree.

- ``one``: one sync client, reset, then stepped in a loop;
- ``sequential``: ``--sessions`` sync clients, each connected and reset first, stepped one
  after another in one thread, round-robin (TRL's loop);
- ``threads``: ``--sessions`` threads, each with its own sync client, stepping in a loop;
- ``threads_1ms``: the same, with ``sys.setswitchinterval(0.001)`` (CPython's default is 5 ms);
- ``async_one`` (ours only): the async client (``async with EnvClient(url)``, under
  ``anyio.run``) in a loop: what the sync client is measured against.

Prints one JSON line: {"pattern", "sessions", "steps", "seconds", "rate", "cpu_us_per_step",
"connections"}. ``cpu_us_per_step`` is this process's CPU time (user and system, every
thread, ``os.times``) over the timed span, per step; ``connections``, for ``sequential``
only (else null), is how many TCP connections to the server's port this process held
halfway through the timed span (ESTABLISHED entries of ``/proc/net/tcp`` and ``tcp6``
whose remote port is the server's: run it while no other process talks to that server).

Upstream's ``SyncEnvClient`` runs its async client on an event loop of its own, in a
thread of its own started on first use: each client has one, and each call is a
hand-off to it (``asyncio.run_coroutine_threadsafe``). `tests.benchmarks.bench_sync`
runs both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

ACTION: dict[str, Any] = {"message": "hello"}
WARMUP = 200
"""Untimed steps of one client before the timed span (per client in ``threads``: `THREAD_WARMUP`)."""
THREAD_WARMUP = 20
SEQUENTIAL_WARMUP_ROUNDS = 3
BATCH = 64
"""Steps between two looks at the clock, for one client."""


def cpu_time() -> float:
    """This process's CPU seconds so far, user and system, all threads."""
    times = os.times()
    return times.user + times.system


def connections(port: int) -> int:
    """TCP connections in this network namespace in state ESTABLISHED whose remote port is ``port``.

    Only the client's side of a connection to a server on ``port`` has that remote
    port: the server's side has it as its local port.
    """
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as lines:
                next(lines)  # the header
                for line in lines:
                    fields = line.split()
                    if fields[3] == "01" and int(fields[2].rsplit(":", 1)[1], 16) == port:
                        count += 1
        except OSError:
            continue
    return count


def ours(url: str) -> Any:
    """Our blocking client of one session, without types (plain dicts), not connected yet (``with`` connects it)."""
    from openenv import EnvClient

    client: EnvClient[Any, Any, Any] = EnvClient(url)
    return client.sync()


def upstream(url: str) -> Any:
    """Upstream's blocking client of one session, not connected yet (``with`` connects it)."""
    from openenv.core import GenericEnvClient

    return GenericEnvClient(base_url=url).sync()


sync_client: Callable[[str], Any] = ours
"""The client the patterns make: `ours` or `upstream`, as ``--client`` says."""


def _figures(
    pattern: str, sessions: int, steps: int, seconds: float, cpu: float, held: int | None = None
) -> dict[str, Any]:
    return {
        "pattern": pattern,
        "sessions": sessions,
        "steps": steps,
        "seconds": seconds,
        "rate": steps / seconds,
        "cpu_us_per_step": 1e6 * cpu / steps,
        "connections": held,
    }


def one(url: str, seconds: float) -> dict[str, Any]:
    """One sync client: reset, `WARMUP` steps, then steps for ``seconds``.

    Args:
        url: The server's URL.
        seconds: The timed span.

    Returns:
        The figures `main` prints.
    """
    with sync_client(url) as client:
        client.reset()
        for _ in range(WARMUP):
            client.step(ACTION)
        steps = 0
        start, cpu_start = time.perf_counter(), cpu_time()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(BATCH):
                client.step(ACTION)
            steps += BATCH
        elapsed, cpu = time.perf_counter() - start, cpu_time() - cpu_start
    return _figures("one", 1, steps, elapsed, cpu)


def sequential(url: str, seconds: float, sessions: int) -> dict[str, Any]:
    """``sessions`` sync clients, connected and reset, stepped round-robin in this thread for ``seconds``.

    The connections are counted once, the first round past half the span; the time and
    CPU the count takes are left out of the figures.

    Args:
        url: The server's URL.
        seconds: The timed span.
        sessions: How many clients.

    Returns:
        The figures `main` prints, with ``connections``.
    """
    port = urlsplit(url).port
    assert port is not None, url
    with ExitStack() as stack:
        clients: list[Any] = []
        for _ in range(sessions):
            client = stack.enter_context(sync_client(url))
            client.reset()
            clients.append(client)
        for _ in range(SEQUENTIAL_WARMUP_ROUNDS):
            for client in clients:
                client.step(ACTION)
        held: int | None = None
        paused = paused_cpu = 0.0
        steps = 0
        start, cpu_start = time.perf_counter(), cpu_time()
        deadline, halfway = start + seconds, start + seconds / 2
        while (now := time.perf_counter()) < deadline:
            if held is None and now >= halfway:
                cpu_before = cpu_time()
                held = connections(port)
                paused, paused_cpu = time.perf_counter() - now, cpu_time() - cpu_before
            for client in clients:
                client.step(ACTION)
            steps += sessions
        elapsed, cpu = time.perf_counter() - start - paused, cpu_time() - cpu_start - paused_cpu
    return _figures("sequential", sessions, steps, elapsed, cpu, held)


def threads(url: str, seconds: float, sessions: int) -> dict[str, Any]:
    """``sessions`` threads, each with its own sync client, stepping for ``seconds``; their total.

    Every thread connects, resets and warms up, then all start together; the span ends
    when the last one's last step returns (closing is left out).

    Args:
        url: The server's URL.
        seconds: The timed span.
        sessions: How many threads (one client each).

    Returns:
        The figures `main` prints.
    """
    ready = threading.Barrier(sessions + 1)
    finished = threading.Barrier(sessions + 1)
    go = threading.Event()
    window: list[float] = []  # [deadline], set before ``go``
    counts = [0] * sessions
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            with sync_client(url) as client:
                client.reset()
                for _ in range(THREAD_WARMUP):
                    client.step(ACTION)
                ready.wait()
                go.wait()
                deadline, steps = window[0], 0
                while time.perf_counter() < deadline:
                    client.step(ACTION)
                    steps += 1
                counts[index] = steps
                finished.wait()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            ready.abort()
            finished.abort()
            go.set()

    workers = [threading.Thread(target=worker, args=(index,), daemon=True) for index in range(sessions)]
    for thread in workers:
        thread.start()
    try:
        ready.wait()
        start, cpu_start = time.perf_counter(), cpu_time()
        window.append(start + seconds)
        go.set()
        finished.wait()
        elapsed, cpu = time.perf_counter() - start, cpu_time() - cpu_start
    finally:
        for thread in workers:
            thread.join(timeout=60)
        if errors:
            raise errors[0]
    return _figures("threads", sessions, sum(counts), elapsed, cpu)


async def async_one(url: str, seconds: float) -> dict[str, Any]:
    """The async client, one session: reset, `WARMUP` steps, then steps for ``seconds``.

    Args:
        url: The server's URL.
        seconds: The timed span.

    Returns:
        The figures `main` prints.
    """
    from openenv import EnvClient

    client: EnvClient[Any, Any, Any] = EnvClient(url)
    async with client:
        await client.reset()
        for _ in range(WARMUP):
            await client.step(ACTION)
        steps = 0
        start, cpu_start = time.perf_counter(), cpu_time()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(BATCH):
                await client.step(ACTION)
            steps += BATCH
        elapsed, cpu = time.perf_counter() - start, cpu_time() - cpu_start
    return _figures("async_one", 1, steps, elapsed, cpu)


def threads_1ms(url: str, seconds: float, sessions: int) -> dict[str, Any]:
    """`threads`, with the interpreter switching threads every millisecond (``sys.setswitchinterval(0.001)``).

    Args:
        url: The server's URL.
        seconds: The timed span.
        sessions: How many threads (one client each).

    Returns:
        The figures `main` prints.
    """
    sys.setswitchinterval(0.001)  # CPython's default is 5 ms
    return {**threads(url, seconds, sessions), "pattern": "threads_1ms"}


PATTERNS: dict[str, Callable[[str, float, int], dict[str, Any]]] = {
    "one": lambda url, seconds, sessions: one(url, seconds),
    "sequential": sequential,
    "threads": threads,
    "threads_1ms": threads_1ms,
    "async_one": lambda url, seconds, sessions: _run_async(async_one, url, seconds),
}


def _run_async(function: Callable[[str, float], Any], url: str, seconds: float) -> dict[str, Any]:
    import anyio

    figures: dict[str, Any] = anyio.run(function, url, seconds)
    return figures


def main() -> None:
    """Run one pattern of one side's client against the URL and print its figures as one JSON line."""
    global sync_client
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("--client", choices=["ours", "upstream"], required=True)
    parser.add_argument("--pattern", choices=list(PATTERNS), required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sessions", type=int, default=64, help="clients of sequential and threads")
    args = parser.parse_args()
    if args.client == "upstream":
        if args.pattern == "async_one":
            parser.error("async_one times our async client only")
        from reference_import import import_reference_openenv  # beside this script

        import_reference_openenv()
        sync_client = upstream
    print(json.dumps(PATTERNS[args.pattern](args.url, args.seconds, args.sessions)), flush=True)


if __name__ == "__main__":
    main()

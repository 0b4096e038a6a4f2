"""The blocking client (``.sync()``): openenv's and upstream 0.10.0's, each against its own server, timed.

Not a test: run it by hand.

    python -m tests.benchmarks.bench_sync [--runs 3] [--seconds 3] [--json docs/benchmarks-sync.json]

Each client drives the echo of its own side, a plain ``def step`` (action
``{"message": str}``): ours is ``openenv serve tests.envs:MessageEchoEnv`` (uvicorn,
asyncio), upstream's is ``tests/interop/reference_server.py`` in its venv. Every
client is a process of its own (``tests/interop/sync_bench_client.py``, ours with our
python, upstream's ``GenericEnvClient(base_url=url).sync()`` with the reference venv's),
in four patterns, each stepped for
``--seconds`` after a warm-up:

- ``one``: one sync client, reset, then stepped in a loop;
- ``sequential``: 64 sync clients (each connected and reset first), stepped one after
  another in one thread, round-robin (TRL's loop); with the TCP connections the
  client process holds to the server halfway through;
- ``threads``: 64 threads, each with its own sync client, stepping in a loop; their total;
- ``threads_1ms``: the same, with CPython switching threads every millisecond
  (``sys.setswitchinterval(0.001)``; its default is 5 ms);
- ``async_one`` (ours only): the async client, one session, against the same server:
  the sync client's ``one`` ÷ this is what blocking costs.

With ``--before TREE`` (a checkout of an earlier commit: ``git worktree add``), our
client is also timed from that tree's code, the same patterns against the same server,
in the same runs: the page then shows what a change gained.

Each with the client process's CPU per step (user and system, every thread). And two
floors, measured in this process, no server:

- ``thread_ping_pong``: round trips per second of a bare hand-off between two threads
  (one asks, the other answers, the first waits), with a pair of `threading.Event` and
  with a pair of `queue.SimpleQueue`; the faster is the floor, named;
- ``portal_round_trip``: round trips per second of ``portal.call(noop)`` on
  ``anyio.from_thread.start_blocking_portal("asyncio")``: what every ``.sync()`` call
  paid when each went through the event loop's thread.

Interleaved run by run (upstream's server and its clients, ours and its clients, the
floors); the table gives the medians, and the ratios are the medians of the per-run
ratios. A client that fails or overruns its timeout is recorded with its error and left
out of the medians. Writes every run's figures, the medians and the machine to
``--json`` (``docs/benchmarks-sync.json`` by default) and, from it, the section "The
blocking client" of ``docs/benchmarks.md`` (`tests.benchmarks._sync_report`).
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anyio.from_thread import start_blocking_portal

from tests.benchmarks import _machine
from tests.benchmarks._servers import ROOT, Server, our_server, run_client
from tests.interop.reference_venv import OPENENV_0_10, ReferenceServer, ensure_reference_python, reference_versions

FACTORY = "tests.envs:MessageEchoEnv"
MAX_SESSIONS = 1100  # as the other benchmarks' servers: room for far more than the 64 sessions here
SESSIONS = 64
PATTERNS = ("one", "sequential", "threads", "threads_1ms")
OUR_PATTERNS = (*PATTERNS, "async_one")
SYNC_CLIENT = ROOT / "tests" / "interop" / "sync_bench_client.py"  # run by path: it uses whichever openenv it finds
DOCS = ROOT / "docs"
FLOOR_WARMUP = 1_000
FLOOR_BATCH = 256


@contextmanager
def upstream_server(python: Path) -> Iterator[Server]:
    """Upstream 0.10.0's echo (``reference_server.py``, a plain ``step``) in its own venv.

    Args:
        python: The reference venv's interpreter.

    Yields:
        The server's URL and pid; it is stopped on the way out.
    """
    with ReferenceServer(python, max_sessions=MAX_SESSIONS) as server:
        assert server.proc is not None
        yield Server(server.base_url, server.proc.pid)


def _client_timeout(seconds: float) -> float:
    return 120.0 + 4 * seconds  # 64 sessions to open and close, beside the timed span


def _attempt(command: list[str], seconds: float, *, reference: bool, tree: Path = ROOT) -> dict[str, Any]:
    """A client's figures, or ``{"error": ...}`` when it failed or overran its timeout."""
    try:
        return run_client(command, timeout=_client_timeout(seconds), reference=reference, tree=tree)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {_client_timeout(seconds):.0f} s"}
    except (RuntimeError, ValueError) as exc:
        return {"error": str(exc)[-2000:]}


def our_client(url: str, pattern: str, seconds: float, sessions: int = SESSIONS, tree: Path = ROOT) -> dict[str, Any]:
    """Our client, one pattern (``sync_bench_client.py --client ours``, a process of its own).

    Args:
        url: The server's URL.
        pattern: ``one``, ``sequential``, ``threads`` or ``async_one``.
        seconds: The timed span.
        sessions: Clients of ``sequential`` and ``threads``.
        tree: Whose ``openenv`` the client runs: this checkout, or an earlier one (``--before``).

    Returns:
        The JSON line it printed, or ``{"error": ...}``.
    """
    command = [sys.executable, str(SYNC_CLIENT), url, "--client", "ours", "--pattern", pattern]
    arguments = [*command, "--seconds", str(seconds), "--sessions", str(sessions)]
    return _attempt(arguments, seconds, reference=False, tree=tree)


def upstream_client(python: Path, url: str, pattern: str, seconds: float, sessions: int = SESSIONS) -> dict[str, Any]:
    """Upstream's ``GenericEnvClient(...).sync()``, one pattern (``sync_bench_client.py --client upstream``).

    Args:
        python: The reference venv's interpreter.
        url: The server's URL.
        pattern: ``one``, ``sequential`` or ``threads``.
        seconds: The timed span.
        sessions: Clients of ``sequential`` and ``threads``.

    Returns:
        The JSON line it printed, or ``{"error": ...}``.
    """
    command = [str(python), str(SYNC_CLIENT), url, "--client", "upstream", "--pattern", pattern]
    return _attempt([*command, "--seconds", str(seconds), "--sessions", str(sessions)], seconds, reference=True)


def _round_trips(round_trip: Callable[[], object], seconds: float) -> float:
    """Calls of ``round_trip`` per second, over about ``seconds`` after `FLOOR_WARMUP` untimed ones."""
    for _ in range(FLOOR_WARMUP):
        round_trip()
    calls = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(FLOOR_BATCH):
            round_trip()
        calls += FLOOR_BATCH
    return calls / (time.perf_counter() - start)


def _ping_pong(
    answering: Callable[[], object],
    round_trip: Callable[[], object],
    stop_answering: Callable[[], object],
    seconds: float,
) -> float:
    """Round trips per second of ``round_trip`` while ``answering`` runs in a thread of its own (then stopped)."""
    thread = threading.Thread(target=answering, daemon=True)
    thread.start()
    try:
        return _round_trips(round_trip, seconds)
    finally:
        stop_answering()
        thread.join(timeout=10)


def _event_ping_pong(seconds: float) -> float:
    ask, answer, stop = threading.Event(), threading.Event(), threading.Event()

    def answering() -> None:
        while True:
            ask.wait()
            ask.clear()
            if stop.is_set():
                return
            answer.set()

    def round_trip() -> None:
        ask.set()
        answer.wait()
        answer.clear()

    def stop_answering() -> None:
        stop.set()
        ask.set()

    return _ping_pong(answering, round_trip, stop_answering, seconds)


def _queue_ping_pong(seconds: float) -> float:
    asks: queue.SimpleQueue[bool] = queue.SimpleQueue()
    answers: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def answering() -> None:
        while asks.get():
            answers.put(True)

    def round_trip() -> None:
        asks.put(True)
        answers.get()

    return _ping_pong(answering, round_trip, lambda: asks.put(False), seconds)


def thread_ping_pong(seconds: float) -> dict[str, Any]:
    """Round trips per second of a bare hand-off between two threads, with two primitives.

    Thread A wakes thread B and waits; B answers. With two `threading.Event` (set,
    wait, clear) and with two `queue.SimpleQueue` (put, get); the faster is the floor.

    Args:
        seconds: How long each primitive is timed.

    Returns:
        ``{"events": rate, "simple_queues": rate, "fastest": name, "rate": its rate}``.
    """
    rates = {"events": _event_ping_pong(seconds), "simple_queues": _queue_ping_pong(seconds)}
    fastest = max(rates, key=rates.__getitem__)
    return {**rates, "fastest": fastest, "rate": rates[fastest]}


async def _noop() -> None:
    return None


def portal_round_trip(seconds: float) -> float:
    """Round trips per second of ``portal.call(noop)`` on an asyncio blocking portal.

    Args:
        seconds: How long it is timed.

    Returns:
        Calls per second.
    """
    with start_blocking_portal("asyncio") as portal:
        return _round_trips(lambda: portal.call(_noop), seconds)


def _show(side: str, pattern: str, figures: dict[str, Any]) -> None:
    if "error" in figures:
        print(f"{side:9} {pattern:11} FAILED: {figures['error'].strip().splitlines()[-1][:200]}", flush=True)
        return
    held = "" if figures.get("connections") is None else f"  {figures['connections']} connections"
    print(f"{side:9} {pattern:11} {figures['rate']:10,.0f} steps/s  {figures['cpu_us_per_step']:7.1f} µs/step{held}")


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every figure, interleaved run by run: upstream's patterns, ours, the floors.

    Args:
        args: ``runs``, ``seconds`` and ``sessions``.

    Returns:
        One dict per run: ``{"upstream": {pattern: figures}, "ours": {...}, "floors": {...}}``.
    """
    python = ensure_reference_python(reference=OPENENV_0_10)
    runs: list[dict[str, Any]] = []
    for run in range(args.runs):
        print(f"-- run {run + 1} of {args.runs}", flush=True)
        figures: dict[str, Any] = {"upstream": {}, "ours": {}}
        with upstream_server(python) as upstream:
            for pattern in PATTERNS:
                figures["upstream"][pattern] = upstream_client(
                    python, upstream.url, pattern, args.seconds, args.sessions
                )
                _show("upstream", pattern, figures["upstream"][pattern])
        with our_server(FACTORY, "asyncio", "--max-sessions", str(MAX_SESSIONS)) as ours:
            for pattern in OUR_PATTERNS:
                figures["ours"][pattern] = our_client(ours.url, pattern, args.seconds, args.sessions)
                _show("ours", pattern, figures["ours"][pattern])
            if args.before is not None:
                figures["before"] = {}
                for pattern in PATTERNS:
                    before = our_client(ours.url, pattern, args.seconds, args.sessions, tree=args.before)
                    figures["before"][pattern] = before
                    _show("before", pattern, before)
        figures["floors"] = {"thread_ping_pong": thread_ping_pong(args.seconds)}
        figures["floors"]["portal_round_trip"] = portal_round_trip(args.seconds)
        floors = figures["floors"]
        ping, portal = floors["thread_ping_pong"], floors["portal_round_trip"]
        print(
            f"floors    thread_ping_pong {ping['rate']:,.0f}/s ({ping['fastest']}), portal {portal:,.0f}/s", flush=True
        )
        runs.append(figures)
    return runs


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians over the runs that succeeded: rates, CPU, connections and the per-run ratios' medians.

    Args:
        runs: What `measure` returned.

    Returns:
        ``{"patterns": {pattern: {...}}, "floors": {...}}``; a figure no run produced is ``None``.
    """
    patterns: dict[str, Any] = {}
    for pattern in OUR_PATTERNS:
        row: dict[str, Any] = {}
        for side in ("ours", "upstream"):
            ran = [run[side][pattern] for run in runs if pattern in run[side]]
            done = [figures for figures in ran if "error" not in figures]
            row[f"{side}_rate"] = _median([figures["rate"] for figures in done])
            row[f"{side}_cpu_us_per_step"] = _median([figures["cpu_us_per_step"] for figures in done])
            held = [figures["connections"] for figures in done if figures.get("connections") is not None]
            row[f"{side}_connections"] = _median(held)
            row[f"{side}_failed_runs"] = len(ran) - len(done)
        both = [
            run for run in runs if "rate" in run["ours"].get(pattern, {}) and "rate" in run["upstream"].get(pattern, {})
        ]
        row["ours_over_upstream"] = _median(
            [run["ours"][pattern]["rate"] / run["upstream"][pattern]["rate"] for run in both]
        )
        befores = [run for run in both if "rate" in run.get("before", {}).get(pattern, {})]
        if befores:
            row["before_rate"] = _median([run["before"][pattern]["rate"] for run in befores])
            row["before_over_upstream"] = _median(
                [run["before"][pattern]["rate"] / run["upstream"][pattern]["rate"] for run in befores]
            )
        patterns[pattern] = row
    sync_async = [
        run["ours"]["one"]["rate"] / run["ours"]["async_one"]["rate"]
        for run in runs
        if "rate" in run["ours"]["one"] and "rate" in run["ours"]["async_one"]
    ]
    patterns["one"]["ours_sync_over_async"] = _median(sync_async)
    pings = [run["floors"]["thread_ping_pong"] for run in runs]
    floors: dict[str, Any] = {
        "thread_ping_pong": {name: _median([ping[name] for ping in pings]) for name in ("events", "simple_queues")},
        "portal_round_trip": _median([run["floors"]["portal_round_trip"] for run in runs]),
    }
    fastest = max(("events", "simple_queues"), key=lambda name: floors["thread_ping_pong"][name] or 0.0)
    floors["thread_ping_pong"].update(fastest=fastest, rate=floors["thread_ping_pong"][fastest])
    return {"patterns": patterns, "floors": floors}


def _number(value: float | None, form: str = ",.0f", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{form}}{suffix}"


def table(medians: dict[str, Any], runs: int) -> list[str]:
    """The table printed at the end: per pattern, the medians and ratios; then the floors.

    Args:
        medians: What `summarize` returned.
        runs: How many runs they are the medians of.

    Returns:
        Its lines (Markdown).
    """
    lines = [
        f"Steps/s, medians of {runs} run(s); ratios are the medians of the per-run ratios.",
        "",
        "| pattern | ours steps/s | upstream steps/s | ours ÷ upstream | ours sync ÷ our async "
        "| connections (ours / upstream) | client CPU µs/step (ours / upstream) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for pattern, row in medians["patterns"].items():
        notes = [f"{side} failed in {row[f'{side}_failed_runs']} run(s)" for side in ("ours", "upstream")]
        notes = [note for note, side in zip(notes, ("ours", "upstream"), strict=True) if row[f"{side}_failed_runs"]]
        if pattern == "async_one":
            notes.insert(0, "our async client")
        note = "; ".join(notes)
        held = "—"
        if pattern == "sequential":
            held = f"{_number(row['ours_connections'])} / {_number(row['upstream_connections'])}"
        cpu = f"{_number(row['ours_cpu_us_per_step'])} / {_number(row['upstream_cpu_us_per_step'])}"
        name = f"{pattern} ({note})" if note else pattern
        lines.append(
            f"| {name} | {_number(row['ours_rate'])} | {_number(row['upstream_rate'])} "
            f"| {_number(row['ours_over_upstream'], '.2f', 'x')} "
            f"| {_number(row.get('ours_sync_over_async'), '.2f', 'x')} | {held} | {cpu} |"
        )
    floors = medians["floors"]
    ping = floors["thread_ping_pong"]
    lines += [
        "",
        f"Floors (this process, no server): thread_ping_pong {_number(ping['rate'])} round trips/s "
        f"(fastest: {ping['fastest']}; events {_number(ping['events'])}, "
        f"simple_queues {_number(ping['simple_queues'])}); "
        f"portal_round_trip {_number(floors['portal_round_trip'])} round trips/s.",
    ]
    return lines


def _commit_of(tree: Path) -> str:
    """The commit checked out in ``tree`` (short), or the tree's path when it is no git checkout."""
    done = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or str(tree)


def main() -> None:
    """Measure, print the table, and write the JSON when ``--json`` is given."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sessions", type=int, default=SESSIONS, help="clients of sequential and threads")
    parser.add_argument(
        "--before", type=Path, default=None, help="also time our client from this checkout (an earlier commit's)"
    )
    parser.add_argument("--json", type=Path, default=DOCS / "benchmarks-sync.json", help="where the figures go")
    args = parser.parse_args()
    meta: dict[str, Any] = {
        "runs": args.runs,
        "seconds": args.seconds,
        "sessions": args.sessions,
        "server_factory": FACTORY,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "command": " ".join(["python -m tests.benchmarks.bench_sync", *sys.argv[1:]]),
        "before": None if args.before is None else _commit_of(args.before),
        "machine": _machine.describe(reference_versions(reference=OPENENV_0_10)),
    }
    runs = measure(args)
    meta["machine"]["load_average_after"] = _machine.describe({})["load_average"]
    medians = summarize(runs)
    print("\n".join(["", *table(medians, args.runs)]), flush=True)
    args.json.write_text(json.dumps({"meta": meta, "runs": runs, "medians": medians}, indent=1) + "\n")
    page = DOCS / "benchmarks.json"
    if page.exists() and args.json.parent == DOCS:  # the page again, from the last full comparison, with this section
        subprocess.run([sys.executable, "-m", "tests.benchmarks.compare", "--from-json", str(page)], check=True)


if __name__ == "__main__":
    main()

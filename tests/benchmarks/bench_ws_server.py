"""Our WebSocket server against the same server at another git revision, one client, interleaved runs.

Not a test: run it by hand from a checkout (it exports the other revision with ``git archive``).

    python -m tests.benchmarks.bench_ws_server [--baseline main] [--runs 5] [--seconds 2] [--sessions 1,256]
        [--envs async,sync]

Each revision serves the echo environment (``async def`` and plain ``def``
versions, `tests.benchmarks.envs`) with ``openenv serve`` on uvicorn; this
checkout's client steps each server in turn. One session is measured by
`tests.benchmarks.our_client`, C sessions by ``openenv bench``. Beside steps/s
(and p99 for C sessions) it reports the server process's CPU time per step,
read from ``/proc`` around the client's whole run (connecting and warm-up
included, the same for both revisions): what a change to the server's hot path
saves. Each figure is the median of ``--runs``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from tests.benchmarks._pairs import say
from tests.benchmarks._servers import ROOT, Server, cpu_seconds, free_port, run_client, server_process
from tests.benchmarks.bench_ws_client import export

ENVS = {"async": "tests.benchmarks.envs:AsyncMessageEchoEnv", "sync": "tests.benchmarks.envs:MessageEchoEnv"}
ACTION = '{"message": "hello"}'


@contextmanager
def serve(tree: Path, factory: str) -> Iterator[Server]:
    """``openenv serve FACTORY`` on uvicorn, run from ``tree``'s code."""
    port = free_port()
    command = [sys.executable, "-m", "transports.cli", "serve", factory, "--port", str(port)]
    command += ["--backend", "asyncio", "--log-level", "warning", "--max-sessions", "4096"]
    with server_process(command, port, tree) as server:
        yield Server(server.url.replace("http://", "ws://", 1), server.pid)


def measure(server: Server, sessions: int, seconds: float) -> dict[str, float]:
    """One client run against ``server``: steps/s, p99 (ms; 0 for one session), server CPU us per step."""
    before = cpu_seconds(server.pid)
    if sessions == 1:
        command = [sys.executable, "-m", "tests.benchmarks.our_client", server.url, "--seconds", str(seconds)]
        result = run_client(command, timeout=seconds + 60)
        steps, rate, p99 = float(result["steps"]) + 201, float(result["rate"]), 0.0  # type: ignore[arg-type]
    else:
        options = ["--sessions", str(sessions), "--seconds", str(seconds), "--action", ACTION, "--json"]
        result = run_client(
            [sys.executable, "-m", "transports.cli", "bench", server.url, *options], timeout=seconds + 180
        )
        one = result["results"][0]  # type: ignore[index]
        steps = float(one["steps"]) + 5 * sessions  # the warm-up steps load the server too
        rate, p99 = float(one["steps_per_second"]), float(one["latency_ms"]["p99"])
    cpu = cpu_seconds(server.pid) - before
    return {"rate": rate, "p99": p99, "cpu_us": 1e6 * cpu / steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="the git revision to compare with (default main)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--sessions", default="1,256", help="session counts (1 uses our_client)")
    parser.add_argument("--envs", default="async,sync", help="which echo environments: async, sync")
    args = parser.parse_args()
    counts = [int(c) for c in args.sessions.split(",")]
    kinds = args.envs.split(",")
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        trees = {"this checkout": ROOT, args.baseline: export(args.baseline, Path(folder))}
        servers = {
            (name, kind): stack.enter_context(serve(tree, ENVS[kind])) for name, tree in trees.items() for kind in kinds
        }
        keys = [(name, kind, count) for kind in kinds for count in counts for name in trees]
        figures: dict[tuple[str, str, int], list[dict[str, float]]] = {key: [] for key in keys}
        for number in range(args.runs):
            for name, kind, count in keys:
                row = measure(servers[(name, kind)], count, args.seconds)
                figures[(name, kind, count)].append(row)
                say(f"run {number + 1}/{args.runs}  {name:14} {kind:5} C={count:<5} {row['rate']:>8,.0f}/s  "
                    f"server CPU {row['cpu_us']:>6.1f} us/step  p99 {row['p99']:.1f} ms")  # fmt: skip
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; CPU per step: the server process's, whole client run")
    print(
        f"{'server':16} {'env':5} {'sessions':>8} {'steps/s':>9} {'x baseline':>10} {'CPU us/step':>11} {'p99 ms':>7}"
    )
    for kind in kinds:
        for count in counts:
            base = statistics.median(r["rate"] for r in figures[(args.baseline, kind, count)])
            for name in trees:
                rows = figures[(name, kind, count)]
                rate = statistics.median(r["rate"] for r in rows)
                cpu = statistics.median(r["cpu_us"] for r in rows)
                p99 = statistics.median(r["p99"] for r in rows)
                print(f"{name:16} {kind:5} {count:>8} {rate:>9,.0f} {rate / base:>10.2f} {cpu:>11.1f} {p99:>7.1f}")


if __name__ == "__main__":
    main()

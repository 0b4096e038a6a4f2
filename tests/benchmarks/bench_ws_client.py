"""Our WebSocket client against the same client at another git revision, one server, interleaved runs.

Not a test: run it by hand from a checkout (it exports the other revision with ``git archive``).

    python -m tests.benchmarks.bench_ws_client [--baseline main] [--runs 5] [--seconds 2] [--sessions 1,256]

Both clients step the same async echo server (this checkout's, uvicorn) in turn;
each figure is the median of ``--runs``. One session is measured by
`tests.benchmarks.our_client` (steps/s, and the client's CPU per step over the
timed span); C sessions by ``openenv bench`` (aggregate steps/s, p99, and the
client process's CPU per step over its whole run, connecting included). This is
how a change to the client's design earns its place: say, the caller reading the
socket itself against one background reader feeding a queue.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.benchmarks._pairs import say
from tests.benchmarks._servers import ROOT, our_server

ECHO = "tests.benchmarks.envs:AsyncMessageEchoEnv"
ACTION = '{"message": "hello"}'


def export(revision: str, into: Path) -> Path:
    """The tree of ``revision`` (this checkout's benchmark helpers on top), under ``into``."""
    archive = subprocess.run(["git", "archive", revision], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    for helper in ("_timing.py", "our_client.py"):  # the same measuring code on both sides
        (into / "tests" / "benchmarks" / helper).write_bytes((ROOT / "tests" / "benchmarks" / helper).read_bytes())
    return into


def run(tree: Path, command: list[str], timeout: float) -> tuple[dict[str, Any], float]:
    """Run a client from ``tree``; return its JSON and the CPU seconds it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, *command], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:  # one (maybe indented) JSON document, as openenv bench --json prints; or a last JSON line
        result: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    return result, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="main", help="the git revision to compare with (default main)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--sessions", default="1,256", help="session counts (1 uses our_client)")
    args = parser.parse_args()
    counts = [int(c) for c in args.sessions.split(",")]
    with tempfile.TemporaryDirectory() as folder, our_server(ECHO, "asyncio", "--max-sessions", "4096") as server:
        trees = {"this checkout": ROOT, args.baseline: export(args.baseline, Path(folder))}
        figures: dict[tuple[str, int], list[dict[str, float]]] = {(n, c): [] for n in trees for c in counts}
        url = server.url.replace("http://", "ws://", 1)
        for number in range(args.runs):
            for count in counts:
                for name, tree in trees.items():
                    if count == 1:
                        command = ["-m", "tests.benchmarks.our_client", url, "--seconds", str(args.seconds)]
                        result, _ = run(tree, command, args.seconds + 60)
                        row = {"rate": result["rate"], "cpu_us": result["cpu_us_per_step"], "p99": 0.0}
                    else:
                        options = ["--sessions", str(count), "--seconds", str(args.seconds), "--action", ACTION]
                        command = ["-m", "transports.cli", "bench", url, *options, "--json"]
                        result, cpu = run(tree, command, args.seconds + 180)
                        one = result["results"][0]
                        row = {"rate": one["steps_per_second"], "cpu_us": 1e6 * cpu / max(one["steps"], 1),
                               "p99": one["latency_ms"]["p99"], "errors": one["errors"]}  # fmt: skip
                    figures[(name, count)].append(row)
                    say(f"run {number + 1}/{args.runs}  {name:14} C={count:<5} {row['rate']:>8,.0f}/s  "
                        f"CPU {row['cpu_us']:>6.1f} us/step  p99 {row['p99']:.1f} ms")  # fmt: skip
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; CPU per step: the client process's")
    print(f"{'client':16} {'sessions':>8} {'steps/s':>9} {'x baseline':>10} {'CPU us/step':>11} {'p99 ms':>7}")
    for count in counts:
        base = statistics.median(r["rate"] for r in figures[(args.baseline, count)])
        for name in trees:
            rows = figures[(name, count)]
            rate = statistics.median(r["rate"] for r in rows)
            cpu = statistics.median(r["cpu_us"] for r in rows)
            p99 = statistics.median(r["p99"] for r in rows)
            print(f"{name:16} {count:>8} {rate:>9,.0f} {rate / base:>10.2f} {cpu:>11.1f} {p99:>7.1f}")


if __name__ == "__main__":
    main()

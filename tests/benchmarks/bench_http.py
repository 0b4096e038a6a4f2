"""HTTP long-polling round trips per second: openenv beside a bare httpx loop and beside WebSocket, in one run.

Not a test: run it by hand.

    python -m tests.benchmarks.bench_http [--seconds 3] [--runs 5] [--json FILE]

Every server and every client is a process of its own, on loopback, as in
`tests.benchmarks.bench_websocket`: the same echo environment
(``tests.envs:AsyncMessageEchoEnv``), the same client (`tests.benchmarks.our_client`,
which takes any URL), small frames. Each figure is the median of ``--runs``
timed runs of ``--seconds``, the pairs interleaved run by run so that drift hits
all alike. Compare ratios within one run: absolute figures drift from run to run.

The floor is `tests.benchmarks.http_floor`: ``await client.post(...)`` in a loop
against one bare Starlette route, on the same ASGI server. What openenv adds
above it (its overhead) is ``floor / ours - 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks._servers import client_rate, http_floor_server, our_server

FACTORY = "tests.envs:AsyncMessageEchoEnv"


@dataclass
class Pair:
    label: str
    server: str  # a key of the servers dict
    client: list[str]  # the client command, the URL appended
    scheme: str  # what the server's http:// URL becomes for this client


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()

    seconds = ["--seconds", str(args.seconds)]
    ours = [sys.executable, "-m", "tests.benchmarks.our_client", *seconds]
    floor = [sys.executable, "-m", "tests.benchmarks.http_floor", "client", *seconds]
    pairs = [
        Pair("bare httpx POST loop -> bare Starlette route [uvicorn]", "floor-asyncio", floor, "http"),
        Pair("openenv http+poll [asyncio] -> openenv server [uvicorn]", "ours-asyncio", [*ours], "http+poll"),
        Pair(
            "openenv http+poll msgpack [asyncio] -> openenv [uvicorn]",
            "ours-asyncio",
            [*ours, "--encoding", "msgpack"],
            "http+poll",
        ),
        Pair("openenv ws [asyncio] -> openenv server [uvicorn]", "ours-asyncio", [*ours], "ws"),
        Pair(
            "bare httpx POST loop [trio] -> bare Starlette route [hypercorn]",
            "floor-trio",
            [*floor, "--backend", "trio"],
            "http",
        ),
        Pair(
            "openenv http+poll [trio] -> openenv server [hypercorn]",
            "ours-trio",
            [*ours, "--backend", "trio"],
            "http+poll",
        ),
        Pair("openenv ws [trio] -> openenv server [hypercorn]", "ours-trio", [*ours, "--backend", "trio"], "ws"),
    ]
    rates: dict[str, list[float]] = {pair.label: [] for pair in pairs}
    with ExitStack() as stack:
        servers = {
            "floor-asyncio": stack.enter_context(http_floor_server("asyncio")).url,
            "floor-trio": stack.enter_context(http_floor_server("trio")).url,
            "ours-asyncio": stack.enter_context(our_server(FACTORY, "asyncio")).url,
            "ours-trio": stack.enter_context(our_server(FACTORY, "trio")).url,
        }
        timeout = args.seconds + 60
        for run in range(args.runs):
            for pair in pairs:
                url = servers[pair.server].replace("http://", f"{pair.scheme}://", 1)
                rate = client_rate([*pair.client, url], timeout=timeout)
                rates[pair.label].append(rate)
                print(f"run {run + 1}/{args.runs}  {pair.label:62} {rate:>9,.0f}/s", file=sys.stderr, flush=True)

    medians = {label: statistics.median(values) for label, values in rates.items()}
    floors = {"uvicorn": medians[pairs[0].label], "hypercorn": medians[pairs[4].label]}
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; {os.cpu_count()} cores\n")
    print(f"{'pair':64} {'steps/s':>9} {'x bare httpx':>12} {'overhead':>9}")
    for label, value in medians.items():
        bare = floors["hypercorn" if "hypercorn" in label else "uvicorn"]
        overhead = f"{bare / value - 1:>+8.0%}" if "http+poll" in label else ""
        print(f"{label:64} {value:>9,.0f} {value / bare:>12.2f} {overhead:>9}")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": args.runs, "seconds": args.seconds, "rates": rates, "medians": medians}, indent=2)
        )


if __name__ == "__main__":
    main()

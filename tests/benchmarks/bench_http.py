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
import sys
from collections.abc import Callable
from pathlib import Path

from tests.benchmarks._pairs import Pair, measure_pairs, our_client, with_scheme
from tests.benchmarks._servers import http_floor_server, our_server

FACTORY = "tests.envs:AsyncMessageEchoEnv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()

    s = ["--seconds", str(args.seconds)]

    def floor(*options: str) -> Callable[[str], list[str]]:
        return lambda url: [sys.executable, "-m", "tests.benchmarks.http_floor", "client", url, *s, *options]

    asyncio, trio = our_client(*s), our_client(*s, "--backend", "trio")
    pairs = [
        Pair("floor-asyncio", "bare httpx POST loop -> bare Starlette route [uvicorn]", "floor", "floor-asyncio",
             floor()),
        Pair("poll-asyncio", "openenv http+poll [asyncio] -> openenv server [uvicorn]", "http+poll", "ours-asyncio",
             with_scheme("http+poll", asyncio)),
        Pair("poll-msgpack", "openenv http+poll msgpack [asyncio] -> openenv [uvicorn]", "http+poll",
             "ours-asyncio", with_scheme("http+poll", our_client(*s, "--encoding", "msgpack"))),
        Pair("ws-asyncio", "openenv ws [asyncio] -> openenv server [uvicorn]", "ws", "ours-asyncio",
             with_scheme("ws", asyncio)),
        Pair("floor-trio", "bare httpx POST loop [trio] -> bare Starlette route [hypercorn]", "floor", "floor-trio",
             floor("--backend", "trio")),
        Pair("poll-trio", "openenv http+poll [trio] -> openenv server [hypercorn]", "http+poll", "ours-trio",
             with_scheme("http+poll", trio)),
        Pair("ws-trio", "openenv ws [trio] -> openenv server [hypercorn]", "ws", "ours-trio",
             with_scheme("ws", trio)),
    ]  # fmt: skip
    servers = {
        "floor-asyncio": http_floor_server("asyncio"),
        "floor-trio": http_floor_server("trio"),
        "ours-asyncio": our_server(FACTORY, "asyncio"),
        "ours-trio": our_server(FACTORY, "trio"),
    }
    rows = measure_pairs(pairs, servers, args.runs, args.seconds, "http")

    medians = {row["label"]: row["median"] for row in rows}
    floors = {"uvicorn": rows[0]["median"], "hypercorn": rows[4]["median"]}
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; {os.cpu_count()} cores\n")
    print(f"{'pair':64} {'steps/s':>9} {'x bare httpx':>12} {'overhead':>9}")
    for row in rows:
        label, value = row["label"], row["median"]
        bare = floors["hypercorn" if "hypercorn" in label else "uvicorn"]
        if value is None or not bare:
            print(f"{label:64} failed: {row['error'] or 'its floor failed'}")
            continue
        overhead = f"{bare / value - 1:>+8.0%}" if "http+poll" in label else ""
        print(f"{label:64} {value:>9,.0f} {value / bare:>12.2f} {overhead:>9}")
    if args.json:
        rates = {row["label"]: row["rates"] for row in rows}
        args.json.write_text(
            json.dumps({"runs": args.runs, "seconds": args.seconds, "rates": rates, "medians": medians}, indent=2)
        )


if __name__ == "__main__":
    main()

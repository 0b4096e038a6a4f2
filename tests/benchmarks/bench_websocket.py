"""WebSocket round trips per second: openenv against the reference and the raw floor, in one run.

Not a test: run it by hand (it builds the reference's throwaway venv on first use).

    python -m tests.benchmarks.bench_websocket [--seconds 3] [--runs 3] [--json FILE]

Every server and every client is a process of its own, on loopback. Each pair
runs the same echo logic (action ``{message}``, observation ``{echoed_message}``)
with small frames; each figure is the median of ``--runs`` timed runs of
``--seconds``, the pairs interleaved run by run so that drift hits all alike.
Compare ratios within one run: absolute figures drift from run to run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tests.benchmarks._pairs import Pair, measure_pairs, our_client
from tests.benchmarks._servers import REFERENCE_CLIENT, our_server, reference_server, ws_floor_server
from tests.interop.reference_venv import OPENENV_0_10, ensure_reference_python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()

    python = ensure_reference_python(reference=OPENENV_0_10)  # the reference: upstream's current release
    s = ["--seconds", str(args.seconds)]
    asyncio, trio = our_client(*s, "--backend", "asyncio"), our_client(*s, "--backend", "trio")
    reference = [str(python), str(REFERENCE_CLIENT)]
    pairs = [
        Pair("ref-sync", "reference client -> reference server (sync env)", "reference", "ref-sync",
             lambda url: [*reference, url, *s], reference=True),
        Pair("ref-async", "reference client -> reference server (step_async env)", "reference", "ref-async",
             lambda url: [*reference, url, *s], reference=True),
        Pair("asyncio-sync", "openenv [asyncio] -> openenv server [asyncio] (sync env)", "ws", "ours-asyncio-sync",
             asyncio),
        Pair("asyncio-async", "openenv [asyncio] -> openenv server [asyncio] (async env)", "ws",
             "ours-asyncio-async", asyncio),
        Pair("trio-sync", "openenv [trio] -> openenv server [trio] (sync env)", "ws", "ours-trio-sync", trio),
        Pair("trio-async", "openenv [trio] -> openenv server [trio] (async env)", "ws", "ours-trio-async", trio),
        Pair("trio-asyncio", "openenv [trio] -> openenv server [asyncio] (async env)", "ws", "ours-asyncio-async",
             trio),
        Pair("ours-to-ref", "openenv [asyncio] -> reference server (sync env)", "ws", "ref-sync", asyncio),
        Pair("floor", "raw websockets client -> websockets echo server", "floor", "floor",
             lambda url: [sys.executable, "-m", "tests.benchmarks.ws_floor", "client", url, *s]),
    ]  # fmt: skip
    servers = {
        "ref-sync": reference_server(python),
        "ref-async": reference_server(python, "--async-step"),
        "ours-asyncio-sync": our_server("tests.envs:MessageEchoEnv", "asyncio"),
        "ours-asyncio-async": our_server("tests.envs:AsyncMessageEchoEnv", "asyncio"),
        "ours-trio-sync": our_server("tests.envs:MessageEchoEnv", "trio"),
        "ours-trio-async": our_server("tests.envs:AsyncMessageEchoEnv", "trio"),
        "floor": ws_floor_server(),
    }
    rows = measure_pairs(pairs, servers, args.runs, args.seconds, "websocket")

    medians = {row["label"]: row["median"] for row in rows}
    baseline, floor = rows[0]["median"], rows[-1]["median"]
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; {os.cpu_count()} cores\n")
    print(f"{'pair':62} {'steps/s':>9} {'x ref(sync)':>11} {'x floor':>8}")
    for row in rows:
        value = row["median"]
        if value is None:
            print(f"{row['label']:62} failed: {row['error']}")
        else:
            versus = [f"{value / base:.2f}" if base else "-" for base in (baseline, floor)]
            print(f"{row['label']:62} {value:>9,.0f} {versus[0]:>11} {versus[1]:>8}")
    if args.json:
        rates = {row["label"]: row["rates"] for row in rows}
        args.json.write_text(
            json.dumps({"runs": args.runs, "seconds": args.seconds, "rates": rates, "medians": medians}, indent=2)
        )


if __name__ == "__main__":
    main()

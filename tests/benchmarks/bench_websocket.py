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
import statistics
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tests.benchmarks._servers import (
    REFERENCE_CLIENT,
    client_rate,
    our_server,
    reference_server,
    ws_floor_server,
)
from tests.interop.reference_venv import ensure_reference_python


@dataclass
class Pair:
    label: str
    server: str  # a key of the servers dict
    client: list[str]  # the client command, the server URL appended
    reference: bool = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the medians here")
    args = parser.parse_args()

    python = ensure_reference_python()
    ours = [sys.executable, "-m", "tests.benchmarks.our_client", "--seconds", str(args.seconds)]
    pairs = [
        Pair("reference client -> reference server (sync env)", "ref-sync", [], reference=True),
        Pair("reference client -> reference server (step_async env)", "ref-async", [], reference=True),
        Pair(
            "openenv [asyncio] -> openenv server [asyncio] (sync env)",
            "ours-asyncio-sync",
            [*ours, "--backend", "asyncio"],
        ),
        Pair(
            "openenv [asyncio] -> openenv server [asyncio] (async env)",
            "ours-asyncio-async",
            [*ours, "--backend", "asyncio"],
        ),
        Pair("openenv [trio] -> openenv server [trio] (sync env)", "ours-trio-sync", [*ours, "--backend", "trio"]),
        Pair("openenv [trio] -> openenv server [trio] (async env)", "ours-trio-async", [*ours, "--backend", "trio"]),
        Pair(
            "openenv [trio] -> openenv server [asyncio] (async env)",
            "ours-asyncio-async",
            [*ours, "--backend", "trio"],
        ),
        Pair("openenv [asyncio] -> reference server (sync env)", "ref-sync", [*ours, "--backend", "asyncio"]),
        Pair(
            "raw websockets client -> websockets echo server",
            "floor",
            [sys.executable, "-m", "tests.benchmarks.ws_floor", "client", "--seconds", str(args.seconds)],
        ),
    ]
    rates: dict[str, list[float]] = {pair.label: [] for pair in pairs}
    with ExitStack() as stack:
        servers = {
            "ref-sync": stack.enter_context(reference_server(python)).url,
            "ref-async": stack.enter_context(reference_server(python, "--async-step")).url,
            "ours-asyncio-sync": stack.enter_context(our_server("tests.envs:MessageEchoEnv", "asyncio")).url,
            "ours-asyncio-async": stack.enter_context(our_server("tests.envs:AsyncMessageEchoEnv", "asyncio")).url,
            "ours-trio-sync": stack.enter_context(our_server("tests.envs:MessageEchoEnv", "trio")).url,
            "ours-trio-async": stack.enter_context(our_server("tests.envs:AsyncMessageEchoEnv", "trio")).url,
            "floor": stack.enter_context(ws_floor_server()).url,
        }
        timeout = args.seconds + 60
        for run in range(args.runs):
            for pair in pairs:
                url = servers[pair.server]
                if pair.reference:
                    command = [str(python), str(REFERENCE_CLIENT), url, "--seconds", str(args.seconds)]
                    rate = client_rate(command, timeout=timeout, reference=True)
                else:
                    rate = client_rate([*pair.client, url], timeout=timeout)
                rates[pair.label].append(rate)
                print(f"run {run + 1}/{args.runs}  {pair.label:60} {rate:>9,.0f}/s", file=sys.stderr, flush=True)

    medians = {label: statistics.median(values) for label, values in rates.items()}
    baseline = medians[pairs[0].label]
    floor = medians[pairs[-1].label]
    print(f"\nmedians of {args.runs} runs of {args.seconds:g} s; {os.cpu_count()} cores\n")
    print(f"{'pair':62} {'steps/s':>9} {'x ref(sync)':>11} {'x floor':>8}")
    for label, value in medians.items():
        print(f"{label:62} {value:>9,.0f} {value / baseline:>11.2f} {value / floor:>8.2f}")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": args.runs, "seconds": args.seconds, "rates": rates, "medians": medians}, indent=2)
        )


if __name__ == "__main__":
    main()

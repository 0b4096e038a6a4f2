"""Steps per second over the in-process transport, beside a direct ``env.step()`` loop.

Not a test: run it by hand.

    python -m tests.benchmarks.bench_inprocess [--seconds 2] [--runs 5] [--backend asyncio|trio|both]

Each figure is the median of several timed runs, all in this one process and run,
so the ratio between them is what to compare (the machine is noisy).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Awaitable, Callable

import anyio

from openenv.examples.echo import CallToolAction, EchoEnv, EchoEnvironment
from tests.benchmarks._timing import timed_rate

ACTION = CallToolAction(tool_name="echo_message", arguments={"message": "hello"})


async def rate(step: Callable[[], Awaitable[object]], seconds: float) -> float:
    """Calls of ``step`` per second, over about ``seconds`` (checked every 256 calls)."""
    return (await timed_rate(step, seconds, batch=256))["rate"]


async def measure(seconds: float, runs: int) -> dict[str, float]:
    env = EchoEnvironment()
    await env.reset()

    async def direct() -> object:
        return await env.step(ACTION)

    direct_rates, client_rates = [], []
    async with EchoEnv("inproc://openenv.examples.echo:EchoEnvironment") as client:
        await client.reset()

        async def via_client() -> object:
            return await client.step(ACTION)

        for _ in range(runs):  # interleaved, so drift hits both alike
            direct_rates.append(await rate(direct, seconds))
            client_rates.append(await rate(via_client, seconds))
    return {
        "direct env.step()": statistics.median(direct_rates),
        "EnvClient.step over inproc://": statistics.median(client_rates),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    args = parser.parse_args()
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    for backend in backends:
        figures = anyio.run(measure, args.seconds, args.runs, backend=backend)
        direct = figures["direct env.step()"]
        for label, value in figures.items():
            print(f"{backend:8} {label:32} {value:>12,.0f} steps/s  ({value / direct:.3f} of direct)")


if __name__ == "__main__":
    main()

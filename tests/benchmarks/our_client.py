"""Round trips per second of openenv's EnvClient against a server URL, on either backend.

    python -m tests.benchmarks.our_client URL --backend asyncio|trio --seconds 3

Prints one JSON line: {"steps": N, "seconds": S, "rate": N/S, "dialect": ...}.
"""

from __future__ import annotations

import argparse
import json

import anyio

from openenv import EnvClient, State
from tests.benchmarks._timing import timed_rate
from tests.envs import MessageAction, MessageObservation


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


async def measure(url: str, seconds: float, options: dict[str, str]) -> dict[str, object]:
    action = MessageAction(message="hello")
    async with MessageEnv(url, **options) as env:
        await env.reset()
        figures: dict[str, object] = dict(await timed_rate(lambda: env.step(action), seconds))
        assert env.transport is not None
        dialect = env.transport.dialect
    figures["dialect"] = [dialect.encoding, dialect.request_ids]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--encoding", choices=["json", "msgpack"], default=None)
    args = parser.parse_args()
    options = {"encoding": args.encoding} if args.encoding else {}
    print(json.dumps(anyio.run(measure, args.url, args.seconds, options, backend=args.backend)), flush=True)


if __name__ == "__main__":
    main()

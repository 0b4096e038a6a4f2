"""Round trips per second of openenv's EnvClient against a server URL, on either backend.

    python -m tests.benchmarks.our_client URL --backend asyncio|trio --seconds 3 [--observation echo|blob]

Prints one JSON line: {"steps": N, "seconds": S, "rate": N/S, "cpu_us_per_step": ..., "dialect": ...,
"payload_bytes": ...}; ``cpu_us_per_step`` is the client process's CPU time per timed step.
``--observation blob`` decodes the 1 MiB observations of `tests.benchmarks.envs.BlobEnv`;
``payload_bytes`` is the size of the last observation's ``data`` (0 for the echo).
"""

from __future__ import annotations

import argparse
import json

import anyio

from openenv import EnvClient, State
from tests.benchmarks._timing import timed_rate
from tests.benchmarks.envs import BlobObservation, MessageAction, MessageObservation


class MessageEnv(EnvClient[MessageAction, MessageObservation, State]):
    pass


class BlobEnvClient(EnvClient[MessageAction, BlobObservation, State]):
    pass


async def measure(url: str, seconds: float, options: dict[str, str], blob: bool) -> dict[str, object]:
    action = MessageAction(message="hello")
    client = BlobEnvClient if blob else MessageEnv
    async with client(url, **options) as env:
        await env.reset()
        # Few big steps per second: a smaller batch keeps the timed span close to ``seconds``.
        rate = await timed_rate(lambda: env.step(action), seconds, warmup=20 if blob else 200, batch=4 if blob else 64)
        figures: dict[str, object] = dict(rate)
        last = await env.step(action)
        assert env.transport is not None
        dialect = env.transport.dialect
    figures["dialect"] = [dialect.encoding, dialect.request_ids]
    figures["payload_bytes"] = len(last.observation.data) if isinstance(last.observation, BlobObservation) else 0
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--encoding", choices=["json", "msgpack"], default=None)
    parser.add_argument("--observation", choices=["echo", "blob"], default="echo")
    args = parser.parse_args()
    options = {"encoding": args.encoding} if args.encoding else {}
    blob = args.observation == "blob"
    print(json.dumps(anyio.run(measure, args.url, args.seconds, options, blob, backend=args.backend)), flush=True)


if __name__ == "__main__":
    main()

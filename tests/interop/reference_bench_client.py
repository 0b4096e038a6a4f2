"""Round trips per second of the *reference* GenericEnvClient (run with the reference venv's python).

    python reference_bench_client.py URL --seconds 3

Prints one JSON line: {"steps": N, "seconds": S, "rate": N/S}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.modules.setdefault("openenv.core.env_server.web_interface", None)  # type: ignore[arg-type]
import openenv  # noqa: E402 - after the gradio shortcut above

if not os.path.realpath(openenv.__file__).startswith(os.path.realpath(sys.prefix)):
    sys.exit(f"refusing to run: 'openenv' resolves to {openenv.__file__}, not the reference venv ({sys.prefix})")

from openenv.core import GenericEnvClient  # noqa: E402


async def main(url: str, seconds: float) -> dict[str, float]:
    action = {"message": "hello"}
    async with GenericEnvClient(base_url=url) as client:
        await client.reset()
        for _ in range(200):  # warm up
            await client.step(action)
        steps = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(64):
                await client.step(action)
            steps += 64
        elapsed = time.perf_counter() - start
    return {"steps": steps, "seconds": elapsed, "rate": steps / elapsed}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.url, args.seconds))), flush=True)

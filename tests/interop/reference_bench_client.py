"""Round trips per second of the *reference* GenericEnvClient (run with the reference venv's python).

    python reference_bench_client.py URL --seconds 3 [--blob]
    python reference_bench_client.py URL --seconds 3 --sessions C

The first form prints one JSON line: {"steps": N, "seconds": S, "rate": N/S, "cpu_us_per_step": ...,
"payload_bytes": ...}; ``--blob`` base64-decodes the ``data`` of every
observation (the reference server's ``--blob-bytes`` environment), as a user
wanting the bytes must, and ``payload_bytes`` is the last one's decoded size.

The second form opens C sessions at once, steps each in a loop for S seconds
after all are open, and prints the JSON shape of ``openenv bench --json``:
{"openenv_version", "backend", "results": [{"url", "transport", "sessions",
"steps", "errors", "seconds", "steps_per_second", "latency_ms": {"mean",
"p50", "p90", "p99", "max"}, "error_examples"}]}.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import time
from importlib import metadata

from reference_import import import_reference_openenv

import_reference_openenv()

from openenv.core import GenericEnvClient  # noqa: E402

ACTION = {"message": "hello"}


async def rate(url: str, seconds: float, blob: bool) -> dict[str, float]:
    batch = 4 if blob else 64  # few big steps per second: keep the timed span close to ``seconds``
    payload = 0
    async with GenericEnvClient(base_url=url) as client:
        await client.reset()
        for _ in range(20 if blob else 200):  # warm up
            await client.step(ACTION)
        steps = 0
        start, cpu_start = time.perf_counter(), time.process_time()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            for _ in range(batch):
                result = await client.step(ACTION)
                if blob:
                    payload = len(base64.b64decode(result.observation["data"]))
            steps += batch
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "steps": steps,
        "seconds": elapsed,
        "rate": steps / elapsed,
        "payload_bytes": payload,
        "cpu_us_per_step": 1e6 * cpu / steps,
    }


async def sessions(url: str, seconds: float, count: int, connect_timeout: float, stagger: int) -> dict[str, object]:
    latencies: list[float] = []
    errors: list[str] = []
    all_open = asyncio.Event()
    opening = asyncio.Semaphore(stagger)
    opened = 0
    window: list[float] = []  # [start, deadline], set once every session is open
    last_reply = 0.0

    async def one() -> None:
        nonlocal opened, last_reply
        client = GenericEnvClient(base_url=url)
        try:
            async with opening:  # a few handshakes at a time (see --stagger)
                if all_open.is_set():
                    return  # another session could not open: give up rather than queue on timeouts
                await client.connect()
                await client.reset()
            opened += 1
            if opened == count:
                now = time.perf_counter()
                window.extend([now, now + seconds])
                all_open.set()
            await asyncio.wait_for(all_open.wait(), connect_timeout)
            while window:
                began = time.perf_counter()
                if began >= window[1]:
                    return
                await client.step(ACTION)
                last_reply = time.perf_counter()
                latencies.append(last_reply - began)
        except Exception as exc:  # counted, as openenv bench counts them
            errors.append(f"{type(exc).__name__}: {exc}")
            all_open.set()  # releases the others; with no window they do not step
        finally:
            await client.close()

    await asyncio.gather(*(one() for _ in range(count)))
    # Up to the last reply, not to the end of gather: closing the sessions is not stepping.
    elapsed = last_reply - window[0] if window and last_reply else 0.0
    ordered = sorted(latencies) or [0.0]
    cuts = statistics.quantiles(ordered, n=100, method="inclusive") if len(ordered) > 1 else ordered * 99
    result = {
        "url": url,
        "transport": "ws",
        "sessions": count,
        "steps": len(latencies),
        "errors": len(errors),
        "seconds": elapsed,
        "steps_per_second": len(latencies) / elapsed if elapsed else 0.0,
        "latency_ms": {
            "mean": 1000 * statistics.fmean(ordered),
            "p50": 1000 * cuts[49],
            "p90": 1000 * cuts[89],
            "p99": 1000 * cuts[98],
            "max": 1000 * ordered[-1],
        },
        "error_examples": sorted(set(errors))[:5],
    }
    return {"openenv_version": _reference_version(), "backend": "asyncio", "results": [result]}


def _reference_version() -> str:
    """The reference's version: ``openenv`` since 0.3.1, ``openenv-core`` before."""
    for name in ("openenv", "openenv-core"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--blob", action="store_true", help="base64-decode each observation's data")
    parser.add_argument("--action", type=json.loads, help="the action to step with, as JSON (default: the echo's)")
    parser.add_argument("--sessions", type=int, default=0, help="C concurrent sessions, openenv bench's JSON")
    parser.add_argument("--stagger", type=int, default=16, help="sessions opening at once (0: all)")
    parser.add_argument("--connect-timeout", type=float, default=120.0, help="seconds for all sessions to open")
    args = parser.parse_args()
    if args.action is not None:
        ACTION = args.action
    if args.sessions:
        stagger = args.stagger or args.sessions
        figures = asyncio.run(sessions(args.url, args.seconds, args.sessions, args.connect_timeout, stagger))
    else:
        figures = asyncio.run(rate(args.url, args.seconds, args.blob))
    print(json.dumps(figures), flush=True)

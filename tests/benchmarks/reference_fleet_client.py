"""A fleet of the reference's clients (openenv-core's GenericEnvClient) against its server, with its venv's python.

    python tests/benchmarks/reference_fleet_client.py URL --sessions N --seconds T [--server-pid PID]

N independent clients, each opened and stepped in a task of its own, all opened
at once: the way trainers use it, one WebSocket per session. A session that
cannot open (in ``--open-timeout`` seconds) is an error, and the others step
without it, as upstream's own scaling study counted its failures. Prints the
JSON line of our fleet client (`_fleet_record`), measured the same way: one
warm-up session first, then the server's idle memory, the time to open every
session, the connections this process holds to the server's port with all of
them open, steps/s and latency over ``--seconds`` once all are open and reset.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from urllib.parse import urlsplit

sys.modules.setdefault("openenv.core.env_server.web_interface", None)  # type: ignore[arg-type]
import openenv  # noqa: E402 - after the gradio shortcut above

if not os.path.realpath(openenv.__file__).startswith(os.path.realpath(sys.prefix)):
    sys.exit(f"refusing to run: 'openenv' resolves to {openenv.__file__}, not the reference venv ({sys.prefix})")

from _fleet_record import FleetRecord  # noqa: E402 - this folder is on the path: the script's own

from openenv.core import GenericEnvClient  # noqa: E402

ACTION = {"message": "hello"}


async def warm_up(url: str) -> None:
    client = GenericEnvClient(base_url=url)
    try:
        await client.connect()
        await client.reset()
        for _ in range(3):
            await client.step(ACTION)
    finally:
        await client.close()


async def fleet(url: str, record: FleetRecord, seconds: float, open_timeout: float) -> None:
    count = record.sessions
    ready_left, finished_left = [count], [count]
    all_ready, all_finished, go, release = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    opened_at: list[float] = []
    last_reply = [0.0]
    deadline = [0.0]

    def passed(left: list[int], event: asyncio.Event) -> None:
        left[0] -= 1
        if left[0] == 0:
            event.set()

    async def session() -> None:
        client = GenericEnvClient(base_url=url)
        passed_ready = passed_finished = False
        try:
            await asyncio.wait_for(client.connect(), open_timeout)
            opened_at.append(time.perf_counter())
            record.opened += 1
            await client.reset()
            passed_ready = True
            passed(ready_left, all_ready)
            await go.wait()
            while time.perf_counter() < deadline[0]:
                began = time.perf_counter()
                try:
                    await client.step(ACTION)
                except Exception as exc:  # counted; the echo fails only when its connection does: the session ends
                    record.error(exc)
                    break
                now = time.perf_counter()
                record.latencies.append(now - began)
                last_reply[0] = max(last_reply[0], now)
            passed_finished = True
            passed(finished_left, all_finished)
            await release.wait()
        except Exception as exc:  # a session that cannot open or reset: an error, the others go on
            record.error(exc)
        finally:
            if not passed_ready:
                passed(ready_left, all_ready)
            if not passed_finished:
                passed(finished_left, all_finished)
            with contextlib.suppress(Exception):  # closing a session that never opened
                await client.close()

    started = time.perf_counter()
    tasks = [asyncio.ensure_future(session()) for _ in range(count)]
    await all_ready.wait()
    record.open_s = (max(opened_at) - started) if opened_at else None
    record.all_open()
    record.start()
    deadline[0] = time.perf_counter() + seconds
    go.set()
    await all_finished.wait()
    record.stop(at=last_reply[0] or None)
    record.steps = len(record.latencies)
    record.count_connections()
    release.set()
    await asyncio.gather(*tasks)


async def main(args: argparse.Namespace) -> dict[str, object]:
    record = FleetRecord(args.sessions, server_pid=args.server_pid, port=urlsplit(args.url).port)
    await warm_up(args.url)
    record.idle()
    await fleet(args.url, record, args.seconds, args.open_timeout)
    return record.document(mode="clients", share=False, backend="asyncio")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--server-pid", type=int)
    parser.add_argument("--open-timeout", type=float, default=60.0, help="seconds a session may take to open")
    arguments = parser.parse_args()
    print(json.dumps(asyncio.run(main(arguments))), flush=True)

"""The floor of a Python WebSocket stack: raw ``websockets`` client and echo server, pre-built frames.

    python -m tests.benchmarks.ws_floor server [--port 0]     # prints READY <port>
    python -m tests.benchmarks.ws_floor client URL --seconds 3  # prints one JSON line

No openenv code runs here: it measures what any client on this stack could reach.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve

from tests.benchmarks._timing import timed_rate

REQUEST = b'{"type":"step","data":{"message":"hello"}}'
REPLY = b'{"type":"observation","data":{"observation":{"echoed_message":"hello"},"reward":5.0,"done":false}}'


async def run_server(port: int) -> None:
    async def answer(connection: ServerConnection) -> None:
        async for _ in connection:
            await connection.send(REPLY.decode())

    async with serve(answer, "127.0.0.1", port, max_size=100 * 2**20) as server:
        bound = next(iter(server.sockets)).getsockname()[1]
        print(f"READY {bound}", flush=True)
        await asyncio.Event().wait()


async def run_client(url: str, seconds: float) -> dict[str, float]:
    text = REQUEST.decode()
    async with connect(url, max_size=100 * 2**20) as connection:

        async def round_trip() -> object:
            await connection.send(text)
            return await connection.recv()

        return await timed_rate(round_trip, seconds)


def floor_main(
    run_server: Callable[[int], Coroutine[Any, Any, object]],
    run_client: Callable[[str, float], Coroutine[Any, Any, dict[str, float]]],
) -> None:
    """The command line of a floor script: ``server [--port P]`` serves, ``client URL [--seconds S]`` measures."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("server")
    server.add_argument("--port", type=int, default=0)
    client = sub.add_parser("client")
    client.add_argument("url")
    client.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    if args.role == "server":
        try:
            asyncio.run(run_server(args.port))
        except KeyboardInterrupt:
            sys.exit(0)
    else:
        print(json.dumps(asyncio.run(run_client(args.url, args.seconds))), flush=True)


def main() -> None:
    floor_main(run_server, run_client)


if __name__ == "__main__":
    main()

"""The floor of HTTP on this stack: a bare httpx POST loop against a bare Starlette endpoint.

    python -m tests.benchmarks.http_floor server [--backend asyncio|trio]  # prints READY <port>
    python -m tests.benchmarks.http_floor client URL --seconds 3 [--backend asyncio|trio]

No openenv code runs here. The server is one Starlette route that reads the
request body and answers with a fixed reply frame, on the same ASGI server
openenv's runner picks for the backend (uvicorn on asyncio, hypercorn on trio);
the client is the plainest httpx loop, ``await client.post(url, content=...)``.
The frames are those of the echo benchmark, so the bytes on the wire match.
"""

from __future__ import annotations

import argparse
import json
import sys

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.benchmarks._timing import timed_rate
from transports.server.runner import serve

REQUEST = b'{"type":"step","id":1,"data":{"message":"hello"}}'
REPLY = b'{"type":"observation","id":1,"data":{"observation":{"echoed_message":"hello"},"reward":5.0,"done":false}}'
HEADERS = {"Content-Type": "application/json"}


async def step(request: Request) -> Response:
    await request.body()
    return Response(REPLY, media_type="application/json")


async def run_server() -> None:
    app = Starlette(routes=[Route("/step", step, methods=["POST"])])
    async with serve(app, port=0) as server:
        print(f"READY {server.port}", flush=True)
        await anyio.sleep_forever()


async def run_client(url: str, seconds: float) -> dict[str, float]:
    async with httpx.AsyncClient() as client:
        for _ in range(200):  # warm up, checking every answer
            (await client.post(url, content=REQUEST, headers=HEADERS)).raise_for_status()
        return await timed_rate(lambda: client.post(url, content=REQUEST, headers=HEADERS), seconds, warmup=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("server")
    server.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    client = sub.add_parser("client")
    client.add_argument("url")
    client.add_argument("--seconds", type=float, default=3.0)
    client.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = parser.parse_args()
    if args.role == "server":
        try:
            anyio.run(run_server, backend=args.backend)
        except KeyboardInterrupt:
            sys.exit(0)
    else:
        print(json.dumps(anyio.run(run_client, args.url, args.seconds, backend=args.backend)), flush=True)


if __name__ == "__main__":
    main()

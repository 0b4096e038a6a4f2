"""The server's CPU time per step of one session: on a link, and on a connection of its own.

Not a test: run it by hand.

    python -m tests.benchmarks.bench_link_server [--steps 5000] [--runs 3] [--backend asyncio|trio] [--plain]

The whole app (`transports.server.app.create_app`: its middleware, the WebSocket
endpoint, the session) is driven as an ASGI server would drive it, with no
socket: each step is one ``websocket.receive`` message handed to the app and
one ``websocket.send`` taken from it, on one event loop. So the figure is the
app's own work per step (and this driver's, the same for both), without the
network and the second process that make end-to-end figures noisy. The
subprotocol picks the path: ``openenv.v1.json`` is a connection of its own (one
frame a message), ``openenv.v2.json`` a link carrying the one session (an
envelope a message). Printed: the CPU microseconds per step of each run, and
their medians.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections import deque
from collections.abc import MutableMapping
from typing import Any

import anyio
import msgspec

from tests.benchmarks.envs import AsyncMessageEchoEnv, MessageEchoEnv
from transports.link._envelope import EnvelopeCodec, Open
from transports.server.app import create_app

CONNECTION = "openenv.v1.json"
LINK = "openenv.v2.json"

_RESET = b'{"type":"reset","data":{},"id":0}'
_STEP = b'{"type":"step","data":{"message":"hello"},"id":1}'
_WARMUP = 200


class _Driver:
    """One WebSocket connection to the app, driven by hand: messages in, messages out."""

    def __init__(self, subprotocol: str) -> None:
        self.subprotocol = subprotocol
        self.link = subprotocol == LINK
        self._codec = EnvelopeCodec("json")
        self._inbox: deque[dict[str, Any]] = deque()
        self._outbox: deque[MutableMapping[str, Any]] = deque()
        self._inbox_ready = anyio.Event()
        self._outbox_ready = anyio.Event()
        self._sent = 0  # the link's frames numbered so far
        self._received = 0  # the link's last frame from the app, acknowledged with the next

    def scope(self) -> dict[str, Any]:
        return {
            "type": "websocket",
            "path": "/ws",
            "raw_path": b"/ws",
            "query_string": b"",
            "headers": [(b"host", b"127.0.0.1")],
            "subprotocols": [self.subprotocol],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
            "scheme": "ws",
            "root_path": "",
            "asgi": {"version": "3.0"},
            "extensions": {},
        }

    async def receive(self) -> dict[str, Any]:
        """The app's ``receive``."""
        while not self._inbox:
            self._inbox_ready = anyio.Event()
            await self._inbox_ready.wait()
        return self._inbox.popleft()

    async def send(self, message: MutableMapping[str, Any]) -> None:
        """The app's ``send``."""
        self._outbox.append(message)
        self._outbox_ready.set()

    def put(self, message: dict[str, Any]) -> None:
        self._inbox.append(message)
        self._inbox_ready.set()

    async def take(self) -> MutableMapping[str, Any]:
        while not self._outbox:
            self._outbox_ready = anyio.Event()
            await self._outbox_ready.wait()
        return self._outbox.popleft()

    def put_frame(self, frame: bytes) -> None:
        if self.link:
            self._sent += 1
            frame = self._codec.encode([(1, self._sent, self._received, msgspec.Raw(frame))])
        self.put({"type": "websocket.receive", "text": frame.decode()})

    async def take_reply(self) -> None:
        message = await self.take()
        if self.link:
            for _, seq, _, _ in self._codec.decode(message["text"].encode()):
                self._received = max(self._received, seq)

    async def open(self) -> None:
        self.put({"type": "websocket.connect"})
        accepted = await self.take()
        if accepted != {"type": "websocket.accept", "subprotocol": self.subprotocol}:
            raise RuntimeError(f"the app did not accept {self.subprotocol}: {accepted}")
        if self.link:
            await self.take()  # the link's Hello
            opening = self._codec.encode([(1, 0, 0, self._codec.control(Open()))])
            self.put({"type": "websocket.receive", "text": opening.decode()})


async def cpu_per_step(subprotocol: str, steps: int, plain: bool) -> float:
    """CPU microseconds per step of one session over ``subprotocol``, after a warm-up."""
    app = create_app(MessageEchoEnv if plain else AsyncMessageEchoEnv)
    driver = _Driver(subprotocol)
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(functools.partial(app, driver.scope(), driver.receive, driver.send))
        await driver.open()
        driver.put_frame(_RESET)
        await driver.take_reply()
        for _ in range(_WARMUP):
            driver.put_frame(_STEP)
            await driver.take_reply()
        cpu = time.process_time()
        for _ in range(steps):
            driver.put_frame(_STEP)
            await driver.take_reply()
        cpu = time.process_time() - cpu
        driver.put({"type": "websocket.disconnect", "code": 1000})
        task_group.cancel_scope.cancel()
    return cpu / steps * 1e6


async def measure(steps: int, runs: int, plain: bool) -> dict[str, list[float]]:
    """Each path's figure for each run, the two paths alternated."""
    figures: dict[str, list[float]] = {CONNECTION: [], LINK: []}
    for _ in range(runs):
        for subprotocol in figures:
            figures[subprotocol].append(await cpu_per_step(subprotocol, steps, plain))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    parser.add_argument("--plain", action="store_true", help="a plain (def step) environment instead of async")
    args = parser.parse_args()
    figures = anyio.run(measure, args.steps, args.runs, args.plain, backend=args.backend)
    for subprotocol, runs in figures.items():
        path = "link" if subprotocol == LINK else "connection of its own"
        shown = ", ".join(f"{figure:.1f}" for figure in runs)
        print(f"{path:>22}: median {statistics.median(runs):6.1f} us of CPU per step ({shown})")


if __name__ == "__main__":
    main()

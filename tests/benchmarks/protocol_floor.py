"""The practical limit of one session: raw asyncio Protocols exchanging a step's WebSocket frames.

    python -m tests.benchmarks.protocol_floor server [--port 0]     # prints READY <port>
    python -m tests.benchmarks.protocol_floor client URL --seconds 3  # prints one JSON line

Two processes, as a client and a server are: the client writes the bytes of a
masked text frame holding a step request, the server answers each with the bytes
of the reply's frame, both pre-built. No parsing, no WebSocket library, no anyio:
what is left is the event loop and the system calls, which no client can skip.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlsplit

from websockets.frames import Frame, Opcode

from tests.benchmarks.ws_floor import REPLY, REQUEST, floor_main

REQUEST_FRAME = Frame(Opcode.TEXT, REQUEST).serialize(mask=True)  # one random mask, reused: bytes are bytes
REPLY_FRAME = Frame(Opcode.TEXT, REPLY).serialize(mask=False)


class Answer(asyncio.Protocol):
    """The server's side: one reply frame for every whole request frame received."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pending = 0

    def data_received(self, data: bytes) -> None:
        self.pending += len(data)
        replies, self.pending = divmod(self.pending, len(REQUEST_FRAME))
        if replies:
            self.transport.write(REPLY_FRAME * replies)


class RoundTrips(asyncio.Protocol):
    """The client's side: a request, then wait for its whole reply, then the next, until told to stop."""

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.done = done
        self.received = 0
        self.count = 0
        self.stop_at: int | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(REQUEST_FRAME)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        while self.received >= len(REPLY_FRAME):
            self.received -= len(REPLY_FRAME)
            self.count += 1
            if self.count == self.stop_at:
                self.done.set_result(None)
                return
            self.transport.write(REQUEST_FRAME)


async def run_server(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Answer, "127.0.0.1", port)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    await server.serve_forever()


async def run_client(url: str, seconds: float) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    address = urlsplit(url)
    done: asyncio.Future[None] = loop.create_future()
    protocol = RoundTrips(done)
    transport, _ = await loop.create_connection(lambda: protocol, address.hostname, address.port)
    await asyncio.sleep(0.2)  # warm up
    start, cpu_start, first = time.perf_counter(), time.process_time(), protocol.count
    await asyncio.sleep(seconds)
    protocol.stop_at = protocol.count + 1
    await done
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    transport.close()
    steps = protocol.count - first
    return {"steps": steps, "seconds": elapsed, "rate": steps / elapsed, "cpu_us_per_step": 1e6 * cpu / steps}


def main() -> None:
    floor_main(run_server, run_client)


if __name__ == "__main__":
    main()

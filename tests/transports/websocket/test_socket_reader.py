"""The reader of a link's socket (`transports.websocket._socket_reader`): the same behaviour on every backend.

On asyncio the socket stays registered with the loop between waits; on trio
(and with ``OPENENV_PUBLIC_IO=1``) each wait is `anyio.wait_readable`. Either
way: bytes come in order, a cancelled wait loses none, the end and the errors
come after the bytes before them, closing wakes a waiter, and bytes nobody
waits for stay (mostly) in the kernel, so the peer is held back.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest

from tests.helpers import all_tasks_blocked
from transports.server.runner import current_backend
from transports.websocket._socket_reader import SocketReader, socket_reader

pytestmark = pytest.mark.anyio

READ_SIZE = 4096
WAIT = 10.0


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    with ours, peer:
        yield ours, peer


@pytest.fixture
async def reader(pair: tuple[socket.socket, socket.socket]) -> AsyncIterator[SocketReader]:
    """A reader of ``pair``'s first socket, made in the test's event loop and closed after it."""
    reading = socket_reader(pair[0], READ_SIZE)
    yield reading
    reading.close()


async def turns_of_the_loop() -> None:
    """Let the event loop run its callbacks (a reader's) a few times."""
    for _ in range(5):
        await anyio.lowlevel.checkpoint()


async def receive_sent_meanwhile(reader: SocketReader, peer: socket.socket, data: bytes) -> bytes:
    """Receive ``data``, sent by the peer once the reader waits for it."""
    received: list[bytes] = []

    async def receive() -> None:
        received.append(await reader.receive())

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(receive)
        await all_tasks_blocked()
        peer.sendall(data)
    return received[0]


async def test_bytes_come_in_order_whoever_waits(
    pair: tuple[socket.socket, socket.socket], reader: SocketReader
) -> None:
    peer = pair[1]
    with anyio.fail_after(WAIT):
        assert reader.receive_nowait() == b""
        peer.sendall(b"one")
        assert await reader.receive() == b"one"
        assert await receive_sent_meanwhile(reader, peer, b"two") == b"two"
        peer.sendall(b"three")
        await turns_of_the_loop()  # on asyncio, read while nobody waits: kept for the next receive
        assert await reader.receive() == b"three"


async def test_a_cancelled_wait_loses_nothing(pair: tuple[socket.socket, socket.socket], reader: SocketReader) -> None:
    peer = pair[1]
    with anyio.fail_after(WAIT):
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(reader.receive)
                await all_tasks_blocked()
                scope.cancel()
        peer.sendall(b"after")
        assert await reader.receive() == b"after"
        with anyio.move_on_after(0):
            await reader.receive()
        peer.sendall(b"again")
        assert await reader.receive() == b"again"


async def test_the_end_comes_after_the_bytes_before_it(
    pair: tuple[socket.socket, socket.socket], reader: SocketReader
) -> None:
    peer = pair[1]
    with anyio.fail_after(WAIT):
        assert reader.receive_nowait() == b""
        peer.sendall(b"last words")
        peer.shutdown(socket.SHUT_WR)
        assert await reader.receive() == b"last words"
        with pytest.raises(anyio.EndOfStream):
            await reader.receive()
        with pytest.raises(anyio.EndOfStream):
            reader.receive_nowait()


async def test_a_peer_that_resets_is_an_os_error() -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # TCP: a reset needs it
    with listener, socket.create_connection(listener.getsockname()) as tcp_ours:
        tcp_peer, _ = listener.accept()
        tcp_ours.setblocking(False)
        reader = socket_reader(tcp_ours, READ_SIZE)
        with anyio.fail_after(WAIT):

            async def reset_once_waited_on() -> None:
                await all_tasks_blocked()
                tcp_peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                tcp_peer.close()  # an RST, not a FIN

            async with anyio.create_task_group() as task_group:
                task_group.start_soon(reset_once_waited_on)
                with pytest.raises(ConnectionResetError):
                    await reader.receive()
        reader.close()


async def test_closing_wakes_a_waiter(reader: SocketReader) -> None:
    with anyio.fail_after(WAIT):

        async def close_once_waited_on() -> None:
            await all_tasks_blocked()
            reader.close()

        async with anyio.create_task_group() as task_group:
            task_group.start_soon(close_once_waited_on)
            with pytest.raises(anyio.ClosedResourceError):
                await reader.receive()


async def test_bytes_nobody_waits_for_hold_the_peer_back(
    pair: tuple[socket.socket, socket.socket], reader: SocketReader
) -> None:
    peer = pair[1]
    peer.setblocking(False)
    chunk = b"x" * READ_SIZE
    with anyio.fail_after(WAIT):
        # Waited for: on asyncio, the socket stays registered after it.
        assert await receive_sent_meanwhile(reader, peer, b"first") == b"first"
        sent = 0
        for _ in range(100_000):  # ~400 MB: far past what the kernel buffers
            try:
                sent += peer.send(chunk)
            except BlockingIOError:
                await turns_of_the_loop()  # a reader that read on would make room meanwhile
                try:
                    sent += peer.send(chunk)
                except BlockingIOError:
                    break
        else:
            pytest.fail("the reader read on with nobody waiting: the peer was never held back")
        received = 0
        while received < sent:
            received += len(await reader.receive())
        assert received == sent


async def test_the_switch_to_public_io_reads_with_anyio_alone(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENENV_PUBLIC_IO", "1")
    assert type(socket_reader(pair[0], READ_SIZE)) is SocketReader


@pytest.mark.speed_path
async def test_on_asyncio_the_socket_stays_registered_between_waits(
    pair: tuple[socket.socket, socket.socket], reader: SocketReader
) -> None:
    peer = pair[1]
    if current_backend() != "asyncio":
        assert type(reader) is SocketReader
        return
    with anyio.fail_after(WAIT):
        for word in (b"one", b"two", b"three"):
            assert await receive_sent_meanwhile(reader, peer, word) == word
            assert reader._registered  # type: ignore[attr-defined]
    reader.close()
    assert not reader._registered  # type: ignore[attr-defined]

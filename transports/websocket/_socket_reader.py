"""Reading a connected non-blocking socket for whoever waits for its bytes.

A link is read by whichever of its sessions waits (`transports.websocket._link`),
straight from its TCP socket. `anyio.wait_readable` registers the socket with
the event loop for each wait and unregisters it after: on asyncio that is a
pass through the selector's Python code twice per message, about a quarter of
a lone session's client time per step. So on asyncio the socket stays
registered: the loop's reader callback reads whatever came and wakes the
waiter. It stops reading (unregisters) once bytes wait with nobody waiting for
them, so a link that holds back its reading still holds back the server.

Elsewhere (trio, an asyncio loop with no ``add_reader``, ``OPENENV_PUBLIC_IO=1``)
each wait is `anyio.wait_readable`.
"""

from __future__ import annotations

import socket
from typing import Any

import anyio
import sniffio

from transports.shared._public_io import public_io_only

__all__ = ["SocketReader", "socket_reader"]


class SocketReader:
    """Reads a socket with `anyio.wait_readable`: see the module's docstring.

    Args:
        sock: A connected, non-blocking socket (closed by its owner, after `close`).
        read_size: The most bytes one read takes.
    """

    def __init__(self, sock: socket.socket, read_size: int) -> None:
        self._socket = sock
        self._read_size = read_size

    async def receive(self) -> bytes:
        """The next bytes from the socket, waiting for some.

        Raises:
            anyio.EndOfStream: The peer ended the TCP connection.
            OSError: The socket failed.
        """
        sock = self._socket
        while True:
            try:
                data = sock.recv(self._read_size)
            except (BlockingIOError, InterruptedError):
                await anyio.wait_readable(sock)
                continue
            if not data:
                raise anyio.EndOfStream
            return data

    def receive_nowait(self) -> bytes:
        """Bytes that came already, without waiting (``b""``: none yet).

        Raises:
            anyio.EndOfStream: The peer ended the TCP connection.
            OSError: The socket failed.
        """
        try:
            data = self._socket.recv(self._read_size)
        except (BlockingIOError, InterruptedError):
            return b""
        if not data:
            raise anyio.EndOfStream
        return data

    def pause(self) -> bool:
        """Stop reading until the next `receive`, so that another may read the socket.

        Call it when nobody waits in `receive`. ``False``: it cannot, as it
        holds bytes read already (or the socket's end).
        """
        return True

    def close(self) -> None:
        """Stop reading, before the socket is closed: a waiter wakes up (`anyio.notify_closing`)."""
        anyio.notify_closing(self._socket)


class _LoopReader(SocketReader):
    """Reads a socket that stays registered with an asyncio loop while a waiter may want its bytes."""

    def __init__(self, sock: socket.socket, read_size: int, loop: Any) -> None:
        super().__init__(sock, read_size)
        self._loop = loop
        self._fd = sock.fileno()
        self._registered = False
        self._waiter: Any = None  # the loop's future a receive waits on
        self._chunks: list[bytes] = []
        self._end: BaseException | None = None  # EndOfStream, the socket's error, or ClosedResourceError

    async def receive(self) -> bytes:
        while True:
            data = self._take()
            if data:
                return data
            if not self._registered:
                data = super().receive_nowait()  # it may have come while nobody read
                if data:
                    return data
                self._loop.add_reader(self._fd, self._on_readable)
                self._registered = True
            self._waiter = waiter = self._loop.create_future()
            try:
                await waiter  # cancelled with its task: what the callback reads meanwhile waits in _chunks
            finally:
                self._waiter = None

    def receive_nowait(self) -> bytes:
        return self._take() or super().receive_nowait()

    def _take(self) -> bytes:
        """The bytes the callback read (``b""``: none); its end, raised, once they are taken."""
        chunks = self._chunks
        if chunks:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            chunks.clear()
            return data
        end = self._end
        if end is not None:
            raise end
        return b""

    def pause(self) -> bool:
        if self._chunks or self._end is not None or self._waiter is not None:
            return False
        self._unregister()
        return True

    def close(self) -> None:
        if self._end is None:
            self._end = anyio.ClosedResourceError()
        self._unregister()
        self._wake()

    def _on_readable(self) -> None:
        try:
            data = self._socket.recv(self._read_size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end = exc
            self._unregister()
        else:
            if data:
                self._chunks.append(data)
                if self._waiter is None:
                    self._unregister()  # nobody wants them yet: read no more until someone does
            else:
                self._end = anyio.EndOfStream()
                self._unregister()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _unregister(self) -> None:
        if self._registered:
            self._registered = False
            self._loop.remove_reader(self._fd)


def socket_reader(sock: socket.socket, read_size: int) -> SocketReader:
    """A reader of ``sock`` for the running event loop (call it there).

    Args:
        sock: A connected, non-blocking socket.
        read_size: The most bytes one read takes.
    """
    if sniffio.current_async_library() == "asyncio" and not public_io_only():
        # anyio's token holds the running loop on asyncio; anything else (a later anyio's) is not used.
        loop = anyio.lowlevel.current_token().native_token
        if all(callable(getattr(loop, name, None)) for name in ("add_reader", "remove_reader", "create_future")):
            try:
                loop.add_reader(sock.fileno(), _nothing)  # type: ignore[attr-defined]
            except NotImplementedError:  # a proactor loop (Windows) has no readers
                pass
            else:
                loop.remove_reader(sock.fileno())  # type: ignore[attr-defined]
                return _LoopReader(sock, read_size, loop)
    return SocketReader(sock, read_size)


def _nothing() -> None:
    pass

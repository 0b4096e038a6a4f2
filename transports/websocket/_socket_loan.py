"""A WebSocket connection's socket, lent to its session's thread: requests answered with no event loop in between.

A session whose environment is plain (``def step``) runs its methods on a
thread of its own (`openenv._worker`). Served the usual way, each request
crosses from the event loop to that thread and its reply back: two thread
wake-ups, which cost more than the rest of the server's work on a small step.
So while the connection has nothing else to do, the server lends its socket to
that thread: the thread waits on the socket itself, reads whole data frames
(`next_data_frame`), answers them (`openenv.server.ServerSession.handle_on_thread`)
and writes each reply straight back, one wake-up per request, as the event
loop's own would be. The loan ends, and the connection goes back to the event
loop and websockets' protocol, at the first thing that is not a whole data
frame the session answers on the thread (a ping, a close, a partial or
oversized frame, a close or MCP request, an error), when a write does not go
out whole, when the connection is quiet for ``quiet_limit`` seconds (so the
server's keepalive pings go on), or when the event loop calls `SocketLoan.stop`
(the session must end, or the connection must write something itself). A
request that keeps the thread long (a slow ``step``) ends it too
(`SocketLoan.release_if_running`): the connection goes back to the event loop
at once, which answers the client's pings meanwhile, and sends the reply.

Lending and taking back is the server protocol's business (uvicorn's, in
`transports.server.drivers._uvicorn_protocols`); this module is the loan itself. The event loop's side
(`SocketLoan.stop`, `SocketLoan.end`) and the thread's (`SocketLoan.serve`)
share one lock, held only around each read and each write, so a stop never
waits for a step, and once `stop` returns the thread writes nothing more.
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import threading
import time
from collections.abc import Callable

from transports.websocket._quick_frames import next_data_frame, server_data_frame

__all__ = ["SOCKET_LOAN", "LendSocket", "SocketLoan"]

SOCKET_LOAN = "openenv.socket_loan"
"""The ASGI scope extension under which a server that can lend a WebSocket's socket puts its `LendSocket`."""

_READ_SIZE = 64 * 1024

_WRITTEN, _PARTLY_WRITTEN, _NOT_WRITTEN = range(3)

# An eventfd's counter takes 8 bytes; a pipe takes them as well.
_WAKE_UP = (1).to_bytes(8, sys.byteorder)


def _wake_up_descriptors() -> tuple[int, int]:
    """A descriptor the thread polls, and one the event loop writes to wake it: one eventfd, else a pipe.

    An eventfd is one descriptor per loan where a pipe takes two: a server
    with a thousand sessions lent stays further from its descriptor limit.
    """
    if hasattr(os, "eventfd"):
        wake_up = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        return wake_up, wake_up
    read, write = os.pipe()
    os.set_blocking(write, False)
    return read, write


class SocketLoan:
    """One loan of a connection's socket to the session's thread, from `serve` to `end`.

    Args:
        fd: The connection's socket: plain TCP (no TLS), non-blocking, with
            nothing read from it that the protocol has not parsed, and nothing
            waiting to be written.
        max_size: The largest message to read here (larger ones go back to
            the protocol, which refuses them), or ``None``.
        quiet_limit: Seconds without a request after which the loan ends by
            itself (the connection's keepalive interval), or ``None``.
        write_back: Writes bytes through the connection's transport (on the
            event loop): the rest of a frame the thread could not write whole.
        give_back: Hands the protocol the bytes the thread read but left (on
            the event loop), and lets it read the socket again.
    """

    def __init__(
        self,
        fd: int,
        *,
        max_size: int | None,
        quiet_limit: float | None,
        write_back: Callable[[bytes], object],
        give_back: Callable[[bytes], object],
    ) -> None:
        self._fd = fd
        self._max_size = max_size
        self._quiet_ms = None if quiet_limit is None else max(1, round(quiet_limit * 1000))
        self._write_back = write_back
        self._give_back = give_back
        self._lock = threading.Lock()
        self._stopped = False
        self._given_back = False
        self._ended = False
        self._unread = b""  # what the thread read and left, from the first frame it did not answer
        # The read in hand and where the frame being answered ends in it: the rest is what it read after that frame.
        self._read: bytes = b""
        self._read_after = 0
        self._running_since: float | None = None
        self._unwritten = b""
        self._wake_read, self._wake_write = _wake_up_descriptors()
        self.on_released: Callable[[], object] | None = None
        """Called on the event loop when `release_if_running` hands the connection back mid-request."""

    @property
    def stopped(self) -> bool:
        """Whether the loan has been stopped (or has ended)."""
        return self._stopped

    def serve(
        self,
        on_frame: Callable[[bool, bytes], bytes | None],
        on_idle: Callable[[], bool],
        on_sent: Callable[[bytes], object] | None = None,
    ) -> bytes | None:
        """Answer requests on the calling thread (the session's) until the loan must end.

        Args:
            on_frame: Called with ``(is_text, payload)`` for each whole data
                frame read; returns the reply's payload (sent in a frame of
                the same kind), or ``None`` to leave that frame, and all after
                it, to the protocol. Before it runs anything that may take
                long (the environment), it must call `begin`, and return
                ``None`` if that returns ``False``.
            on_idle: Called before each wait for the client; ``False`` ends the loan.
            on_sent: Called with each reply once it is written (or the
                connection failed under it), with the loan's lock held: the
                event loop sees it happen before a `stop` returns.

        Returns:
            A reply the loan was stopped before writing, for the event loop to
            send; else ``None``.
        """
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake_read, select.POLLIN)
        while on_idle():
            if not poller.poll(self._quiet_ms):
                return None  # quiet: back to the event loop, which pings
            with self._lock:
                if self._stopped:
                    return None
                try:
                    data = os.read(self._fd, _READ_SIZE)
                except BlockingIOError:
                    continue
                except OSError:
                    return None  # the protocol reads the error again, and reports it
            if not data:
                return None  # the end of the stream: the protocol reads it again
            self._read = data
            position = 0
            while position < len(data):
                frame = next_data_frame(data, position, self._max_size, masked=True)
                if frame is None:
                    self._unread = data[position:]
                    return None
                is_text, payload, self._read_after = frame
                reply = on_frame(is_text, payload)
                if reply is None:
                    self._unread = data[position:]  # not begun: nothing was given back early
                    return None
                position = self._read_after
                outcome = self._write(server_data_frame(reply, text=is_text), reply, on_sent)
                if outcome != _WRITTEN:
                    if not self._given_back:
                        self._unread = data[position:]
                    return reply if outcome == _NOT_WRITTEN else None
        return None

    def begin(self) -> bool:
        """On the thread: it starts answering the frame in hand; ``False`` if the loan was stopped.

        From then on the frame gets a reply, so `release_if_running` may hand
        the rest of the connection back to the event loop meanwhile.
        """
        with self._lock:
            if self._stopped:
                return False
            self._running_since = time.monotonic()
            return True

    def stop_after_this(self) -> None:
        """On the thread, from ``on_frame``: end the loan after the frame in hand, its reply unwritten.

        `serve` returns that reply for the event loop to deal with (one the
        thread must not write itself: a reply over the client's limit, say).
        """
        with self._lock:
            self._stopped = True

    def _write(self, frame: bytes, reply: bytes, on_sent: Callable[[bytes], object] | None) -> int:
        with self._lock:
            self._running_since = None
            if self._stopped:
                return _NOT_WRITTEN
            try:
                written = os.write(self._fd, frame)
            except BlockingIOError:
                written = 0
            except OSError:  # the client is gone: the protocol finds out when it reads
                written = len(frame)
            if on_sent is not None:
                on_sent(reply)
            if written == len(frame):
                return _WRITTEN
            self._unwritten = frame[written:]
            return _PARTLY_WRITTEN

    def release_if_running(self, longer_than: float) -> bool:
        """On the event loop: end the loan now if the thread has been answering one request that long.

        The connection goes back to the protocol at once (with what the thread
        read after that request), so it answers pings while the environment
        runs; the thread writes nothing more, and `serve` returns the reply
        for the event loop to send.

        Args:
            longer_than: Seconds.

        Returns:
            Whether the loan ended.
        """
        with self._lock:
            since = self._running_since
            if self._stopped or since is None or time.monotonic() - since < longer_than:
                return False
            self._stopped = True
            self._given_back = True
            rest = self._read[self._read_after :]
        self._give_back(rest)
        if self.on_released is not None:
            self.on_released()
        return True

    def stop(self) -> None:
        """Make `serve` return soon; call it on the event loop, before it writes to the connection.

        Once it returns, the thread writes nothing more, and the rest of a
        frame it could not write whole has been written: the event loop's next
        write comes after it. Idempotent.
        """
        with self._lock:
            if not self._stopped:
                self._stopped = True
                with contextlib.suppress(OSError):
                    os.write(self._wake_write, _WAKE_UP)
            self._flush()

    def end(self) -> None:
        """End the loan once `serve` has returned: on the event loop, exactly once.

        Writes what the thread could not, closes the loan's wake-up descriptor and
        gives the protocol what the thread read but left.
        """
        with self._lock:
            self._stopped = True
            self._flush()
            give_back = not self._given_back
            self._given_back = True
        if not self._ended:
            self._ended = True
            os.close(self._wake_read)
            if self._wake_write != self._wake_read:
                os.close(self._wake_write)
        if give_back:
            unread, self._unread = self._unread, b""
            self._give_back(unread)

    def _flush(self) -> None:
        if self._unwritten:
            unwritten, self._unwritten = self._unwritten, b""
            self._write_back(unwritten)


LendSocket = Callable[[], "SocketLoan | None"]
"""Lends a connection's socket to the calling session's thread (see `SocketLoan`), or ``None`` if not now."""

"""One open WebSocket connection, client side: a reader task, a lock for writes, a keepalive.

websockets' sans-I/O `ClientProtocol` does the protocol work; this module drives
it over an anyio byte stream. One background task owns the reading: it feeds the
protocol, answers pings, and queues data messages for `receive`; a second pings
the server. Writes from the caller and from both tasks go through one lock, so
frames never interleave. The tasks run on the event loop's background host
(`openenv._background`), not in a task group of the caller's: the connection may
be closed from any task, under any cancel scope.
"""

from __future__ import annotations

import contextlib
import os
from typing import NoReturn, Protocol

import anyio
from anyio.abc import ByteStream, SocketAttribute
from websockets.client import ClientProtocol
from websockets.exceptions import PayloadTooBig
from websockets.exceptions import ProtocolError as WebSocketProtocolError
from websockets.frames import CloseCode, Frame, Opcode
from websockets.protocol import Event, State

from openenv import Clock, ConnectionClosed, OpenEnvError, ProtocolError
from openenv._background import start_background
from openenv.channel import FrameQueue, QueueClosed

from .._network_client import STREAM_ERRORS, ConnectionEnd, describe

# Bytes asked of the socket per read: large, so that a burst of frames (or a big
# one) takes few system calls and few trips through the protocol's parser.
READ_SIZE = 65536

# Messages the reader queues ahead of `receive` before it stops reading. OpenEnv's
# server speaks only when spoken to, so a few replies at most are ever unread; a
# server that floods us is pushed back on through TCP instead of buffered without
# bound (each message may be up to `max_message_size`). Pings go unanswered while
# the reader waits, as with websockets' own clients when their queue is full.
RECEIVE_BUFFER = 64

# The peer broke the WebSocket protocol (the parser's reasons to fail a connection).
PEER_PROTOCOL_ERRORS = (WebSocketProtocolError, PayloadTooBig, UnicodeDecodeError)


class OpenConnection(Protocol):
    """What the transport uses of an open connection: `Connection`, or on asyncio `AsyncioConnection`."""

    url: str

    async def send(self, message: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def aclose(self) -> None: ...

    async def wait_ended(self) -> None: ...

    @property
    def dropped(self) -> bool: ...

    def closed_error(self) -> ConnectionClosed: ...


def _send_now(fd: int, data: bytes) -> int:
    """Write what a non-blocking socket takes at once; the number of bytes written."""
    try:
        return os.write(fd, data)
    except (BlockingIOError, InterruptedError):
        return 0


async def close_quietly(stream: ByteStream) -> None:
    """Close a socket now, even under cancellation; it may already be broken."""
    with anyio.CancelScope(shield=True):
        with contextlib.suppress(*STREAM_ERRORS):
            await stream.aclose()


class Connection:
    """An open WebSocket connection: send and receive messages, close it; built by `open`.

    Attributes:
        url: The WebSocket URL, for error messages.
    """

    def __init__(
        self,
        stream: ByteStream,
        protocol: ClientProtocol,
        *,
        url: str,
        binary: bool,
        tls: bool,
        close_timeout: float,
    ) -> None:
        self.url = url
        self._stream = stream
        # The descriptor of the plain TCP socket under the stream, written to directly
        # while it takes every write whole; None for TLS, and once a write did not fit.
        self._fd: int | None = None if tls else stream.extra(SocketAttribute.raw_socket).fileno()
        self._protocol = protocol
        self._send_data = protocol.send_binary if binary else protocol.send_text
        self._close_timeout = close_timeout
        self._write_lock = anyio.Lock(fast_acquire=True)
        self._messages: FrameQueue[bytes] = FrameQueue()
        self._room: anyio.Event | None = None  # set when `receive` makes room in a full queue
        self._partial = bytearray()  # a data message arriving in fragments, until its last one
        self._pong: tuple[bytes, anyio.Event] | None = None  # the keepalive ping awaiting its pong
        self._scope = anyio.CancelScope()  # cancels the background tasks
        self._reader_done = anyio.Event()  # set once the reader saw the end (EOF, a failure, the close)
        self._done = anyio.Event()  # set once the socket is closed
        self._end = ConnectionEnd(url, "WebSocket connection")  # the client's close, or a failure of ours

    @classmethod
    async def open(
        cls,
        stream: ByteStream,
        protocol: ClientProtocol,
        early_events: list[Event],
        *,
        url: str,
        binary: bool,
        tls: bool,
        close_timeout: float,
        ping_interval: float | None,
        ping_timeout: float | None,
        clock: Clock,
    ) -> Connection:
        """Take over a handshaken stream: act on the events that came with the response, start the tasks.

        Args:
            stream: The socket, past the handshake.
            protocol: The protocol, in the OPEN state.
            early_events: Events the server sent right behind its handshake response.
            url: The WebSocket URL, for error messages.
            binary: Send binary frames (msgpack) instead of text frames.
            tls: The stream is TLS over the socket (so the socket is not written to directly).
            close_timeout: Seconds the server gets to end the TCP connection after a close frame.
            ping_interval: Seconds between keepalive pings (``None``: no pings).
            ping_timeout: Seconds a pong may take before the connection is declared dead.
            clock: Where the keepalive's interval and timeout are measured.

        Returns:
            The connection, its background tasks running.
        """
        connection = cls(stream, protocol, url=url, binary=binary, tls=tls, close_timeout=close_timeout)
        try:
            connection._queue_messages(early_events)
            await connection._flush_from_reader()  # a pong owed already, say
            await start_background(lambda: connection._run(ping_interval, ping_timeout, clock))
        except BaseException:  # cancelled: nothing will close the socket but us
            await close_quietly(stream)
            raise
        return connection

    # -- the caller's side -------------------------------------------------------

    async def send(self, message: bytes) -> None:
        """Send one message. Raises `ConnectionClosed` if the connection is not open."""
        protocol = self._protocol
        if self._end.by_client or protocol.state is not State.OPEN:
            self._raise_closed(receiving=False)
        # Acquiring the lock raises a pending cancellation before the protocol is
        # touched; one that interrupts the write below abandons the connection.
        async with self._write_lock:
            if protocol.state is not State.OPEN:
                self._raise_closed(receiving=False)
            self._send_data(message)
            await self._write_pending()

    async def receive(self) -> bytes:
        """The next message; raises once the connection ended and every earlier message was taken."""
        messages = self._messages
        if self._end.by_client:
            self._raise_closed(receiving=True)
        try:
            message = await messages.get()
        except QueueClosed:
            self._raise_closed(receiving=True)
        if self._room is not None and len(messages) < RECEIVE_BUFFER:
            self._room.set()
        return message

    async def aclose(self) -> None:
        """The closing handshake (code 1000), then the socket; bounded by the close timeout, idempotent.

        Shielded: it completes under any cancel scope of the caller's.
        """
        if self._end.by_client:
            return
        self._end.close_by_client()
        self._messages.close()  # wakes receivers, who see `_end.by_client`
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self._close_timeout):
                if self._protocol.state is State.OPEN:
                    with contextlib.suppress(ConnectionClosed):  # already broken: nothing to hand-shake with
                        async with self._write_lock:
                            if self._protocol.state is State.OPEN:
                                self._protocol.send_close(CloseCode.NORMAL_CLOSURE)
                                await self._write_pending()
                await self._done.wait()  # the server echoes the close and ends the TCP connection
            self._scope.cancel()
            await self._done.wait()

    # -- how it ended ------------------------------------------------------------

    async def wait_ended(self) -> None:
        """Return once the connection has ended and its socket is closed, however it ended."""
        await self._done.wait()

    @property
    def dropped(self) -> bool:
        """Whether the connection ended with neither side closing it on purpose.

        True once it ended by EOF or a reset without a closing handshake, a
        failed or interrupted write, or a keepalive timeout: what a resumable
        session may survive. False while it is open, and when the client closed
        it, the server sent a close frame, or the server broke the protocol.
        """
        if not self._done.is_set() or self._end.by_client or self._protocol.close_rcvd is not None:
            return False
        return not isinstance(self._protocol.parser_exc, PEER_PROTOCOL_ERRORS)

    def closed_error(self) -> ConnectionClosed:
        """The error that says why the connection is not usable (for a connection that ended)."""
        try:
            self._raise_closed(receiving=False)
        except ConnectionClosed as exc:
            return exc

    # -- the background tasks ----------------------------------------------------

    async def _run(self, ping_interval: float | None, ping_timeout: float | None, clock: Clock) -> None:
        """Read until the connection ends (and ping meanwhile); then close the socket."""
        try:
            with self._scope:
                async with anyio.create_task_group() as task_group:
                    if ping_interval is not None:
                        task_group.start_soon(self._keepalive, ping_interval, ping_timeout, clock)
                    try:
                        await self._read_until_closed()
                    finally:
                        self._reader_done.set()
                    task_group.cancel_scope.cancel()
        except Exception as exc:  # a safety net: a bug must end the connection, not hang it
            self._note_failure(f"internal error in the WebSocket transport: {exc!r}", exc)
        finally:
            with anyio.CancelScope(shield=True):
                self._protocol.receive_eof()  # idempotent; the protocol is CLOSED after it
                self._protocol.data_to_send()  # nothing more to say on a closed socket
                await close_quietly(self._stream)  # a writer still waiting gets ClosedResourceError
            self._messages.close()
            if self._pong is not None:
                self._pong[1].set()
            if self._room is not None:
                self._room.set()
            self._done.set()

    async def _read_until_closed(self) -> None:
        """Feed the protocol what the socket brings; return at EOF, on failure, or once the close is done."""
        protocol, stream = self._protocol, self._stream
        close_deadline = anyio.current_time() + self._close_timeout if protocol.state is not State.OPEN else None
        while True:
            if len(self._messages) >= RECEIVE_BUFFER:
                self._room = anyio.Event()
                await self._room.wait()  # until `receive` makes room: backpressure through TCP
                self._room = None
            try:
                if close_deadline is None:
                    data = await stream.receive(READ_SIZE)
                else:
                    data = b""  # if the server does not end the TCP connection in time after the close
                    with anyio.move_on_at(close_deadline):
                        data = await stream.receive(READ_SIZE)
                    if not data:
                        return
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return
            except STREAM_ERRORS as exc:
                self._note_failure(f"the connection to {self.url} broke: {describe(exc)}", exc)
                return
            protocol.receive_data(data)
            events = protocol.events_received()
            if protocol.writes:  # pongs, a close echo: answer them first
                await self._flush_from_reader()
            self._queue_messages(events)
            if protocol.state is not State.OPEN and close_deadline is None:
                # A close frame went one way or the other: nothing can follow, and
                # the server should end the TCP connection soon.
                self._messages.close()
                close_deadline = anyio.current_time() + self._close_timeout

    def _queue_messages(self, events: list[Event]) -> None:
        """Queue data messages for `receive` (reassembling fragments); note the keepalive's pong."""
        for event in events:
            if not isinstance(event, Frame):
                continue
            opcode = event.opcode
            if opcode is Opcode.TEXT or opcode is Opcode.BINARY:
                if event.fin:
                    self._put(event.data)
                else:
                    self._partial = bytearray(event.data)
            elif opcode is Opcode.CONT:  # the protocol checks the sequence
                self._partial += event.data
                if event.fin:
                    self._put(self._partial)
                    self._partial = bytearray()
            elif opcode is Opcode.PONG and self._pong is not None and self._pong[0] == event.data:
                self._pong[1].set()
            # PING: the protocol queued the pong. CLOSE: the reader sees the state change.

    def _put(self, data: bytes | bytearray | memoryview) -> None:
        if not self._end.by_client:  # nobody reads any more: drop it
            with contextlib.suppress(QueueClosed):
                self._messages.put(data if type(data) is bytes else bytes(data))

    async def _flush_from_reader(self) -> None:
        """Write the protocol's queued answers, unless a writer holds the lock.

        The reader never waits for the lock: a writer blocked on a full socket
        must not stop us reading (both peers would then wait on each other), and
        whoever holds the lock writes everything queued before letting go.
        """
        if not self._write_lock.locked():
            with contextlib.suppress(ConnectionClosed):  # noted; the reader's next receive ends it
                async with self._write_lock:
                    await self._write_pending()

    async def _keepalive(self, interval: float, timeout: float | None, clock: Clock) -> None:
        """Ping every ``interval`` seconds; fail the connection if a pong is ``timeout`` late."""
        count = 0
        while True:
            await clock.sleep(interval)
            count = (count + 1) % 2**32
            payload = count.to_bytes(4, "big")
            pong = anyio.Event()
            self._pong = (payload, pong)
            try:
                async with self._write_lock:
                    if self._protocol.state is not State.OPEN:
                        return
                    self._protocol.send_ping(payload)
                    await self._write_pending()
            except ConnectionClosed:
                return
            if timeout is None:
                continue
            with clock.move_on_after(timeout) as scope:
                await pong.wait()
            if scope.cancelled_caught:
                self._fail(f"the server at {self.url} did not answer a keepalive ping within {timeout} s")
                return

    # -- writing and failing -----------------------------------------------------

    async def _write_pending(self) -> None:
        """Write every byte the protocol has queued; call with the write lock held.

        Raises:
            ConnectionClosed: The socket failed; the connection is now broken.
        """
        protocol = self._protocol
        try:
            while protocol.writes:  # a loop: the reader may queue a pong while we wait on the socket
                writes = protocol.data_to_send()
                data = writes[0] if len(writes) == 1 else b"".join(writes)
                if not data:
                    continue  # b"" alone is the protocol asking for EOF: the reader closes the socket
                if self._fd is not None and protocol.state is not State.CLOSED:
                    # Straight to the socket, which takes a small frame whole: anyio's
                    # send would add a pass through the event loop to every request.
                    # The descriptor is ours while the protocol is not CLOSED: the
                    # socket is closed only after it is (a closed one's number may be
                    # reused by another socket).
                    sent = _send_now(self._fd, data)
                    if sent == len(data):
                        continue
                    # The socket is full: the rest, and every write after it, goes
                    # through the stream, which waits for room (and keeps the order).
                    self._fd = None
                    data = data[sent:]
                await self._stream.send(data)
        except STREAM_ERRORS as exc:
            self._note_failure(f"the connection to {self.url} broke while sending: {describe(exc)}", exc)
            try:
                # A server that hangs up on us often said why first (a close frame with
                # 1009, message too big): let the reader find it before the error is told.
                with anyio.move_on_after(self._close_timeout):
                    await self._reader_done.wait()
            finally:
                self._scope.cancel()  # end the connection (its reason is noted), whatever happened meanwhile
            self._raise_closed(receiving=False)
        except BaseException:
            # Interrupted (cancelled) part-way: what reached the wire is unknown.
            self._fail(f"a write to {self.url} was interrupted; the connection was abandoned")
            raise

    def _note_failure(self, reason: str, cause: BaseException | None = None) -> None:
        """Remember why the connection ended, unless it has a reason already or has ended."""
        if not self._done.is_set():
            self._end.note(ConnectionClosed(reason), cause)

    def _fail(self, reason: str, cause: BaseException | None = None) -> None:
        """End the connection now: the background task stops reading and closes the socket."""
        self._note_failure(reason, cause)
        self._scope.cancel()

    def _raise_closed(self, *, receiving: bool) -> NoReturn:
        """Raise the error that says why the connection is not usable, from its cause."""
        raise closed_error(self.url, self._protocol, self._end, receiving=receiving)


def closed_error(url: str, protocol: ClientProtocol, end: ConnectionEnd, *, receiving: bool) -> OpenEnvError:
    """The error that says why a connection is not usable, its cause chained: the most telling reason first.

    Args:
        url: The WebSocket URL.
        protocol: The connection's protocol.
        end: The connection's record of the client's close or of our side's failure.
        receiving: For a receive: a peer's protocol violation is then a `ProtocolError`.
    """
    if end.by_client:
        return end.closed_by_client_error()
    error: OpenEnvError
    parser_exc = protocol.parser_exc
    if isinstance(parser_exc, PEER_PROTOCOL_ERRORS):
        text = f"the server at {url} broke the WebSocket protocol: {parser_exc}"
        error = ProtocolError(text) if receiving else ConnectionClosed(text)
        error.__cause__ = parser_exc
    elif protocol.close_rcvd is not None:  # the server's own reason first
        error = ConnectionClosed(f"the server at {url} closed the WebSocket connection: {protocol.close_rcvd}")
    elif end.error is not None:
        error = end.ended_error()
    else:
        error = ConnectionClosed(f"the connection to {url} was lost without a WebSocket closing handshake")
        error.__cause__ = parser_exc
    return error

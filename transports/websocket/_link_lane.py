"""A link lent to blocking callers: each thread writes its request and reads its reply itself, no event loop between.

A blocking client (`openenv.SyncEnvClient`) drives an async client on an event
loop in a background thread. Each call made that way crosses from the caller's
thread to the loop's and back, and the loop thread sleeps between calls: two
thread wake-ups that cost more than the rest of a small step. So a link that
only blocking clients ride (`openenv.BLOCKING_CALLERS`) is lent to their
threads while it has nothing else to do, as a server lends a connection to a
session's thread (`transports.websocket._socket_loan`): a caller's thread posts
its frame and writes it, then waits on the socket and reads whole data frames,
handing every session of the link its own. While one thread reads, the others
wait for their frames, and the one whose frame has not come takes the reading
over when the reader is done (as async sessions share a link's reading).

The loan is the link's business (`transports.websocket._link.Link.lend`,
`Link.reclaim`); this module is the threads' side. A thread gives the link back
at the first thing it should not handle itself: the connection closing or
failing, a message that ends a channel or the link, a frame the link would
refuse. (A ping it answers itself: whatever is not a whole data frame goes
through websockets' protocol, as on the event loop.) It keeps the bytes, or
the failure, for the event loop (`LinkLane.take_back`), and its call goes on
through the event loop, where the async client deals with all of it as always.
The event loop takes the link back itself before it does anything with it
(a session's call through the event loop, a session opening or leaving), and its
keeper takes it back once no thread used it for `IDLE_READ` seconds, so that the
server's pings are answered, and the server pinged, while the callers think.

One lock (`LinkLane.mutex`) covers the link's state and its socket's writes
while the link is lent. A reading thread waits on the socket without it. The
event loop never blocks on it: it tries it, and sleeps a millisecond between tries.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

import anyio
import msgspec
from websockets.protocol import Event, State

from openenv import ConnectionClosed, ProtocolError
from openenv._lane import BlockingLane, Sent
from transports.link._client import LinkChannel
from transports.websocket._link_write import LinkWriter
from transports.websocket._quick_frames import FrameBoundaries
from transports.websocket._socket_reader import SocketReader

__all__ = ["LendingLink", "LinkLane", "SessionLane"]

_READ_SIZE = 64 * 1024
_CAN_POLL = hasattr(select, "poll")  # not on Windows: no lane there, every call goes through the event loop
_READABLE = select.POLLIN | select.POLLERR | select.POLLHUP if _CAN_POLL else 0
_WRITABLE = select.POLLOUT | select.POLLERR | select.POLLHUP if _CAN_POLL else 0
_TAKE_BACK_RETRY = 0.001  # seconds the event loop sleeps between tries of the lane's lock


def _acquire(lock: threading.Lock) -> None:
    """Take ``lock``, even across an interrupt (Ctrl-C): raised once the lock is held."""
    interrupted: BaseException | None = None
    while True:
        try:
            lock.acquire()
            break
        except BaseException as exc:
            interrupted = exc
    if interrupted is not None:
        lock.release()
        raise interrupted


def _poll(fd: int, events: int, deadline: float | None) -> bool:
    """Wait until ``fd`` is ready for ``events``, or the deadline (``time.monotonic``); whether it is ready."""
    poller = select.poll()
    poller.register(fd, events)
    timeout = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
    return bool(poller.poll(timeout))


class LendingLink(LinkWriter):
    """A WebSocket link's side of its loan to blocking clients' threads; see the module's docstring.

    Its connection's attributes, and the read path it calls (`_took`,
    `_message`, `_after_events`, `_release_reading`), are the link's
    (`transports.websocket._link.Link`); so is ending every session, which a
    borrowing thread defers to the event loop (``_on_lane``, ``_deferred_end``).
    """

    _lane: LinkLane | None
    _reader: SocketReader | None
    _early: list[Event]
    _pong: tuple[bytes, anyio.Event] | None
    _coalescing: bool
    _quick: bool
    _fragmented: bool
    _boundaries: FrameBoundaries
    _max_message_size: int | None
    _last_received: float
    _gone: anyio.Event
    _on_lane: bool
    _deferred_end: tuple[ConnectionClosed | ProtocolError, BaseException | None] | None

    def _refusal(self, frame: bytes) -> str | None:
        raise NotImplementedError

    async def _took(self, data: bytes) -> None:
        raise NotImplementedError

    def _parse(self, data: bytes) -> list[Event] | None:
        raise NotImplementedError

    def _message(self, message: bytes) -> None:
        raise NotImplementedError

    def _after_events(self, events: list[Event]) -> None:
        raise NotImplementedError

    def _release_reading(self) -> None:
        raise NotImplementedError

    @property
    def channels(self) -> dict[int, LinkChannel]:
        """The sessions on the link, by channel number."""
        return self._channels

    @property
    def lane(self) -> LinkLane | None:
        """What lends the link to blocking callers' threads; ``None`` for a link never lent (TLS: no plain socket)."""
        return self._lane if self._socket is not None and _CAN_POLL else None

    def lend(self) -> bool:
        """Lend the link to its blocking callers' threads, if nothing else uses it now; whether it is lent."""
        lane, reader = self._lane, self._reader
        if lane is None or reader is None or self._socket is None:
            return False
        if lane.held:
            return lane.lent
        if (
            self._reading
            or self._waiting
            or self._coalescing
            or self._early
            or self._unsent
            or self._pong is not None
            or self._write_lock.locked()
            or self._broken is not None
            or self._ended is not None
            or self._closing
            or self._protocol.state is not State.OPEN
            or not reader.pause()
        ):
            return False
        self._reading = True  # the threads read it now
        lane.lend()
        return True

    async def reclaim(self) -> None:
        """Take the link back from the threads, if lent, and act on what they left: bytes, a failure, an end."""
        lane = self._lane
        if lane is None or not lane.held:
            return
        taken = await lane.take_back()
        if taken is None:
            return  # another task took it back first (and has the reading)
        unwritten, leftover, failure, received = taken
        if unwritten:
            self._unsent.insert(0, unwritten)  # the rest of a write a thread began: before anything else
        try:
            if received:
                self._last_received = self._clock.now()
            deferred, self._deferred_end = self._deferred_end, None
            if deferred is not None:
                self._end_all(*deferred)
            if failure is not None:
                self._gone.set()
                self._break(failure, failure.__cause__)
            for data in leftover:
                await self._took(data)
        finally:
            self._release_reading()

    def lane_socket(self) -> int:
        """The descriptor a borrowing thread reads and writes."""
        assert self._socket is not None
        return self._socket.fileno()

    def failure(self, text: str, cause: BaseException | None = None) -> ConnectionClosed:
        """The error a borrowing thread leaves for the event loop when the connection fails."""
        error = ConnectionClosed(f"{text} ({self.url})")
        error.__cause__ = cause
        return error

    def post_on_lane(self, channel: LinkChannel, frame: bytes) -> bool:
        """Queue a session's frame on the protocol, from a borrowing thread; ``False``: the event loop must send it."""
        state = self._state
        if state is None:
            self._send_data(frame)
            return True
        channel_state = state.channels.get(channel.number)
        if channel_state is None or self._refusal(frame) is not None:
            return False
        state.post(channel_state, msgspec.Raw(frame))
        self._queue(state.outgoing())
        return True

    def take_output(self) -> bytes:
        """What the protocol queued, for a borrowing thread to write."""
        data = self._protocol.data_to_send()
        return data[0] if len(data) == 1 else b"".join(data)

    def take_on_lane(self, data: bytes) -> bool:
        """Act on bytes a borrowing thread read (not the end); ``False``: the link must go back to the event loop.

        Whole data frames are handed out at once; anything else goes through the
        protocol, as on the event loop: a ping's pong waits in the protocol for
        the thread to write it. What changes the connection's state (a close, a
        broken protocol) or ends the link is left for the event loop.
        """
        self._on_lane = True
        try:
            events = self._parse(data)
            if events is not None:
                self._after_events(events)
        finally:
            self._on_lane = False
        return self._deferred_end is None and self._protocol.state is State.OPEN


class LinkLane:
    """The threads' side of a link's loan; see the module's docstring.

    Args:
        link: The link it lends.

    Attributes:
        mutex: Guards the link, its socket's writes and what follows, while it is lent.
        lent: Whether threads may use the link now.
        held: Whether the event loop has lent the link and not yet taken it back
            (a thread that gave it back leaves ``lent`` false, ``held`` true).
        last_used: When a thread last used the link (``time.monotonic()``).
    """

    def __init__(self, link: LendingLink) -> None:
        self._link = link
        self.mutex = threading.Lock()
        self.lent = False
        self.held = False
        self.last_used = 0.0
        self._received = False  # bytes came while lent: the keeper's silence counts from the take back
        self._reading = False  # a thread waits on the socket for every session
        self._waiters: dict[int, threading.Condition] = {}  # threads waiting for another's reading
        self._leftover: list[bytes] = []  # bytes read that the event loop must act on
        self._failure: ConnectionClosed | ProtocolError | None = None  # the connection failed while lent
        self._writing = False  # a thread writes (without the mutex)
        self._unwritten = memoryview(b"")  # bytes taken from the protocol and not written yet
        self.posted: bytes | None = None  # the last frame posted: whether an interrupted send went out

    # -- the event loop's side ---------------------------------------------------------

    def lend(self) -> None:
        """Lend the link to threads (the event loop, with nothing else to do on it)."""
        with self.mutex:
            self.lent = self.held = True
            self.last_used = time.monotonic()

    def idle_for(self) -> float:
        """Seconds since a thread last used the link; ``inf`` once a thread gave it back."""
        return time.monotonic() - self.last_used if self.lent else float("inf")

    async def take_back(self) -> tuple[bytes, list[bytes], ConnectionClosed | ProtocolError | None, bool] | None:
        """Take the link back (the event loop); threads waiting on it wake up and go on through the event loop.

        Returns:
            The bytes of a write a thread began (to write before anything
            else), the bytes read to act on (``b""``: the end), the
            connection's failure, and whether bytes came while it was lent;
            ``None`` if another task of the event loop took it back meanwhile.
        """
        while True:
            # A thread's lock, held briefly (a frame posted, frames handed out), or a write under way: try again.
            if self.mutex.acquire(blocking=False):
                if not self._writing:
                    break
                self.mutex.release()
            await anyio.sleep(_TAKE_BACK_RETRY)
        try:
            if not self.held:
                return None
            self.lent = self.held = False
            unwritten, self._unwritten = bytes(self._unwritten), memoryview(b"")
            leftover, self._leftover = self._leftover, []
            failure, self._failure = self._failure, None
            received, self._received = self._received, False
            for waiter in self._waiters.values():
                waiter.notify()
        finally:
            self.mutex.release()
        return unwritten, leftover, failure, received

    # -- the threads' side (with the mutex held) ---------------------------------------

    def _give_back(
        self, *, leftover: bytes | None = None, failure: ConnectionClosed | ProtocolError | None = None
    ) -> None:
        """Stop lending: what the event loop must act on (bytes read, ``b""`` for the end) waits for `take_back`."""
        self.lent = False
        if leftover is not None:
            self._leftover.append(leftover)
        if failure is not None and self._failure is None:
            self._failure = failure
        for waiter in self._waiters.values():
            waiter.notify()

    def send(self, channel: LinkChannel, frame: bytes) -> Sent:
        """Send a session's frame from the calling thread (see `Sent`).

        Frames that other threads post while one writes leave with its next
        write: threads that send at once share messages, as the sessions of one
        turn of an event loop do. A write cut short (Ctrl-C) leaves the rest
        for the next writer, a thread's or the event loop's: the connection's
        framing holds.
        """
        link = self._link
        _acquire(self.mutex)
        try:
            if not self.lent or channel.ended is not None or not link.post_on_lane(channel, frame):
                return Sent.NOT_SENT
            self.posted = frame
            self.last_used = time.monotonic()
            if self._writing:
                return Sent.SENT  # the thread writing now sends it with its next write
            return self._write_all()
        finally:
            self.mutex.release()

    def _write_all(self) -> Sent:
        """Write what the protocol holds, and what others post meanwhile; with the mutex (released while writing)."""
        link = self._link
        fd = link.lane_socket()
        self._writing = True
        try:
            while True:
                if not self._unwritten:
                    data = link.take_output()
                    if not data:
                        return Sent.SENT
                    self._unwritten = memoryview(data)
                self.mutex.release()
                try:
                    error = self._write_out(fd)
                finally:
                    _acquire(self.mutex)
                if error is not None:
                    self._unwritten = memoryview(b"")
                    self._give_back(failure=link.failure(f"the connection broke while sending: {error}", error))
                    return Sent.HANDED_BACK
        finally:
            self._writing = False

    def _write_out(self, fd: int) -> OSError | None:
        """Write `_unwritten` whole (the writer alone touches it, without the mutex); the socket's error, if any."""
        while self._unwritten:
            try:
                written = os.write(fd, self._unwritten)
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError as exc:
                return exc
            self._unwritten = self._unwritten[written:]
            if self._unwritten:
                _poll(fd, _WRITABLE, None)  # full: wait for room (Ctrl-C leaves the rest for the next writer)
        return None

    def receive(self, channel: LinkChannel, deadline: float | None) -> bytes | None:
        """The session's next frame, read by this thread or another; ``None``: go through the event loop.

        Raises:
            TimeoutError: The deadline (``time.monotonic``) passed first.
        """
        _acquire(self.mutex)
        try:
            frames = channel.frames
            while True:
                while frames:
                    frame = frames.popleft()
                    if type(frame) is bytes:
                        return frame
                if not self.lent or channel.ended is not None:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError
                if self._reading:
                    self._wait_for_reader(channel, deadline)
                else:
                    self._read_once(channel, deadline)
        finally:
            self.mutex.release()

    def _wait_for_reader(self, channel: LinkChannel, deadline: float | None) -> None:
        waiter = threading.Condition(self.mutex)
        self._waiters[channel.number] = waiter
        try:
            waiter.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        finally:
            self._waiters.pop(channel.number, None)

    def _read_once(self, channel: LinkChannel, deadline: float | None) -> None:
        """Read for ``channel``'s thread: wait on the socket (without the lock), hand out what came, wake the next."""
        link = self._link
        fd = link.lane_socket()
        self._reading = True
        leaving = True  # the reading goes to another thread, unless this one reads again for its own frame
        try:
            self.mutex.release()
            try:
                ready = _poll(fd, _READABLE, deadline)
            finally:
                _acquire(self.mutex)
            if not ready or not self.lent:
                return
            try:
                data = os.read(fd, _READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._give_back(failure=link.failure(f"the connection broke: {exc}", exc))
                return
            self.last_used = time.monotonic()
            self._received = True
            if not data:  # the server ended the connection: the event loop reads the rest of the story
                self._give_back(leftover=data)
                return
            if not link.take_on_lane(data):
                self._give_back()
                return
            if not self._writing:
                self._write_all()  # what the protocol queued in answer (a pong), if anything
            leaving = bool(channel.frames) or channel.ended is not None or not self.lent
        finally:
            self._reading = False
            self._wake_waiters(hand_over=leaving)

    def _wake_waiters(self, *, hand_over: bool = True) -> None:
        """Wake the threads whose frames came (or whose channel ended); with ``hand_over``, one to read for the rest."""
        channels = self._link.channels
        reader_needed = hand_over
        for number, waiter in self._waiters.items():
            channel = channels.get(number)
            if channel is None or channel.frames or channel.ended is not None or not self.lent:
                waiter.notify()
            elif reader_needed:
                waiter.notify()
                reader_needed = False


class SessionLane(BlockingLane):
    """One session's use of a lent link: what `openenv.BlockingLane` asks of a transport.

    Args:
        lane: The link's lane.
        channel: The session's channel on the link.
        relend: Lends the link again (on the event loop), after a call that went through it.
    """

    __slots__ = ("_channel", "_lane", "_relend")

    def __init__(self, lane: LinkLane, channel: LinkChannel, relend: Callable[[], bool]) -> None:
        self._lane = lane
        self._channel = channel
        self._relend = relend

    def relend(self) -> bool:
        """Lend the link again, if it can be (call on the event loop); whether it is lent."""
        return self._relend()

    def send(self, frame: bytes) -> Sent:
        """Send one frame from the calling thread (see `Sent`)."""
        return self._lane.send(self._channel, frame)

    def posted(self, frame: bytes) -> bool:
        """Whether ``frame`` was the last frame posted (it goes out, even if its send was interrupted)."""
        return self._lane.posted is frame

    def receive(self, deadline: float | None) -> bytes | None:
        """The next frame, read from the calling thread; ``None``: wait for it through the event loop.

        Raises:
            TimeoutError: ``deadline`` (``time.monotonic``) passed first.
        """
        return self._lane.receive(self._channel, deadline)

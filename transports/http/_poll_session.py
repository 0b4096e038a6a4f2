"""One HTTP long-polling session's record: its frames both ways, their numbers, and its waiters (no I/O).

The ``/poll/sessions`` endpoint (`transports.http._server`) keeps a `PollSession`
for each session it hosts: the request frames queued for its environment (in
``OpenEnv-Seq`` order), and its replies until the client acknowledges them
(``OpenEnv-Ack``). The environment's task takes requests and gives replies
(`PollSession.receive_request`, `PollSession.send_reply`); the HTTP requests queue
frames, acknowledge replies and wait for the next one (`PollSession.queue_request`,
`PollSession.acknowledge`, `PollSession.next_reply`).
"""

from __future__ import annotations

import hmac
import secrets
from collections import deque
from collections.abc import Callable
from typing import Final

import anyio
import anyio.lowlevel

from openenv import Clock, ConnectionClosed, Dialect
from openenv.channel import FrameQueue, QueueClosed
from transports.admission._lease import SessionLease
from transports.http._protocol import MEDIA_TYPES

__all__ = ["HeldBytes", "PollSession"]

# The most unacknowledged reply bytes an ended session keeps without holding
# its slot while its record lingers (the last reply, unacknowledged, is usual).
_LINGER_FREE_BYTES: Final = 64 * 1024

# Times a frame request lets other tasks run before it waits for a reply: twice,
# as trio may run the woken session after the request's task once.
_YIELDS_BEFORE_WAITING: Final = 2


class HeldBytes:
    """The bytes every session of an endpoint holds for its client: replies not acknowledged, requests not taken."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class PollSession:
    """One HTTP session: the frames queued for its environment, and its replies until acknowledged.

    Its endpoint sets `lease` (its slot) before its environment's task runs.
    Request frames are numbered by the client (``received`` is the highest one
    queued), replies by the server (``sent``). ``outbox`` holds each reply not
    yet acknowledged, with the number of the request it answers, so a request
    whose reply the client has acknowledged is known to be done with (``answered``).
    """

    __slots__ = (
        "acked",
        "answered",
        "clock",
        "current",
        "deleted",
        "dialect",
        "end_reason",
        "forgotten",
        "held",
        "id",
        "idempotency_key",
        "inbox",
        "inbox_bytes",
        "key",
        "lease",
        "media_type",
        "new_event",
        "outbox",
        "outbox_bytes",
        "received",
        "scope",
        "sent",
        "served",
        "waiter",
    )

    def __init__(
        self,
        session_id: str,
        dialect: Dialect,
        new_event: Callable[[], anyio.Event],
        clock: Clock,
        held: HeldBytes | None = None,
    ) -> None:
        self.id = session_id
        self.clock = clock
        self.held = held if held is not None else HeldBytes()  # the endpoint's count, shared by its sessions
        self.inbox_bytes = 0  # the requests queued and not yet taken by the environment
        self.key = secrets.token_urlsafe(32).encode()
        self.dialect = dialect
        self.media_type = MEDIA_TYPES[dialect.encoding].encode()
        self.lease: SessionLease | None = None
        self.scope = anyio.CancelScope()
        self.inbox: FrameQueue[tuple[int, bytes]] = FrameQueue()
        self.outbox: deque[tuple[int, int, bytes]] = deque()  # (reply seq, request seq, frame)
        self.outbox_bytes = 0
        self.received = 0
        self.sent = 0
        self.acked = 0
        self.answered = 0
        self.current = 0  # the request being handled (0 before any)
        self.served = False  # whether the environment was built and asked for a request
        self.end_reason: str | None = None  # set once the session has ended
        self.deleted = False
        self.idempotency_key: tuple[str, str] | None = None  # (client, key): a retry must come from its client
        self.new_event = new_event
        self.waiter: anyio.Event | None = None  # set when a reply comes or the session ends
        self.forgotten = new_event()  # set when the record is dropped (DELETE)

    # -- the environment's side (host_session's receive and send) ------------------

    async def receive_request(self) -> bytes:
        """The next request frame for the environment (`openenv.server.host_session`'s ``receive``).

        Raises:
            ConnectionClosed: The session was asked to end, or the client deleted it.
        """
        lease = self.lease
        assert lease is not None
        if lease.close_reason is not None:  # asked to end while it was busy
            raise ConnectionClosed(lease.close_reason)
        if self.deleted:  # frames queued behind the DELETE never run
            raise ConnectionClosed("the client deleted the session")
        self.served = True
        inbox = self.inbox
        if not inbox:
            lease.touch()  # waiting for the client: the idle clock runs
        try:
            seq, frame = await inbox.get()
        except QueueClosed:
            raise ConnectionClosed("the client deleted the session") from None
        self.inbox_bytes -= len(frame)
        self.held.bytes -= len(frame)
        lease.mark_busy()
        self.current = seq
        return frame

    async def send_reply(self, frame: bytes) -> None:
        """Keep a reply for the client (`openenv.server.host_session`'s ``send``).

        Raises:
            ConnectionClosed: The client deleted the session.
        """
        if self.deleted:
            raise ConnectionClosed("the client deleted the session")
        self.push(frame)

    def push(self, frame: bytes) -> None:
        """Keep a reply for the client until it acknowledges it, and wake whoever waits for one."""
        self.sent += 1
        self.outbox.append((self.sent, self.current, frame))
        self.outbox_bytes += len(frame)
        self.held.bytes += len(frame)
        self.wake()

    def wake(self) -> None:
        """Wake whoever waits for a reply, or for the first frame."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            waiter.set()

    @property
    def lingers_lightly(self) -> bool:
        """Whether it keeps few enough unacknowledged replies for its ended record to linger without its slot."""
        return self.outbox_bytes <= _LINGER_FREE_BYTES

    def vacate_unless_lingering(self) -> None:
        """Free the slot once the session is over, unless large replies the client has yet to fetch keep it."""
        if self.lease is not None and self.outbox_bytes <= _LINGER_FREE_BYTES:
            self.lease.vacate()

    @property
    def holds(self) -> int:
        """The bytes it holds for its client: replies not acknowledged, and requests not taken yet."""
        return self.outbox_bytes + self.inbox_bytes

    def queue_request(self, seq: int, frame: bytes) -> None:
        """Queue a request frame for the environment, counted as held until it is taken."""
        self.inbox_bytes += len(frame)
        self.held.bytes += len(frame)
        self.inbox.put((seq, frame))

    def forget_held(self) -> None:
        """Uncount what it holds: its record is gone, and all it held with it."""
        self.held.bytes -= self.outbox_bytes + self.inbox_bytes
        self.outbox_bytes = self.inbox_bytes = 0
        self.outbox.clear()

    def end(self, reason: str) -> None:
        """Note that the session has ended (its environment is closed); wake every waiter."""
        if self.end_reason is None:
            self.end_reason = reason
        self.inbox.close()
        self.wake()

    def stop(self) -> None:
        """End the session at the registry's request (idle too long, the server stopping): its ``on_close``.

        The session's task is cancelled, and its record ends now, so a request
        waiting for a reply gets ``410`` with the reason at once, even while a
        plain environment's step still holds the session's thread.
        """
        self.scope.cancel()
        lease = self.lease
        if lease is not None and lease.close_reason is not None:
            self.end(lease.close_reason)

    def delete(self) -> None:
        """End the session at the client's request: after the request in hand, if any."""
        self.deleted = True
        if self.end_reason is None:
            self.end_reason = "the client deleted the session"
        self.inbox.close()
        self.forgotten.set()
        self.wake()

    # -- the client's side (the HTTP requests) -----------------------------------

    def holds_key(self, key: bytes | None) -> bool:
        """Whether a request carries this session's key (compared in constant time)."""
        return key is not None and hmac.compare_digest(key, self.key)

    async def first_request(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the first frame; whether one came (or the session ended)."""
        with self.clock.move_on_after(timeout):
            while not self.inbox and self.end_reason is None:
                waiter = self.waiter
                if waiter is None:  # shared with long polls waiting for a reply
                    waiter = self.waiter = self.new_event()
                await waiter.wait()
            return True
        return False

    def acknowledge(self, ack: int) -> None:
        """Forget the replies up to ``ack``; the client holds them."""
        if ack <= self.acked:
            return
        outbox = self.outbox
        while outbox and outbox[0][0] <= ack:
            _, request_seq, frame = outbox.popleft()
            self.outbox_bytes -= len(frame)
            self.held.bytes -= len(frame)
            if request_seq > self.answered:
                self.answered = request_seq
        self.acked = ack

    async def next_reply(self, wait: float) -> tuple[int, bytes] | None:
        """The oldest unacknowledged reply, waiting up to ``wait`` seconds; ``None`` if none came."""
        outbox = self.outbox
        if outbox:
            reply = outbox[0]
            return reply[0], reply[2]
        if self.end_reason is not None or wait <= 0:
            return None
        # A request just queued is often answered at once (an async environment
        # steps on the event loop): let the session run before arming a timed
        # wait, which costs more than such a step.
        for _ in range(_YIELDS_BEFORE_WAITING):
            await anyio.lowlevel.checkpoint()
            if outbox:
                reply = outbox[0]
                return reply[0], reply[2]
        with self.clock.move_on_after(wait):
            while not outbox and self.end_reason is None:
                waiter = self.waiter
                if waiter is None:
                    waiter = self.waiter = self.new_event()
                await waiter.wait()
        if outbox:
            reply = outbox[0]
            return reply[0], reply[2]
        return None

"""The admission queue: sessions waiting, in the order they came, for a slot of the app's registry.

`transports.admission._sessions.SessionRegistry` keeps one `AdmissionQueue`
when it has a ``queue_timeout``: a session it cannot give a slot joins it with
a `QueueTicket`, and each slot freed goes to the ticket first in line
(`AdmissionQueue.next`), handed its lease (`QueueTicket.admit`). When the
server stops, every ticket is turned away (`AdmissionQueue.turn_away`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import anyio

from transports.admission._lease import SessionLease

__all__ = ["AdmissionQueue", "QueueTicket"]


class QueueTicket:
    """A session's place in the queue for a slot (`SessionRegistry.enqueue`); handed its lease when one frees.

    Attributes:
        admitted: Set once the ticket has its lease, or the queue was turned away (then `lease` is ``None``).
        lease: The session's slot, once admitted.
        transport: Which transport the session runs on.
        client: Who waits, for the per-client quota, or ``None``.
    """

    __slots__ = ("admitted", "client", "lease", "on_close", "transport")

    def __init__(self, transport: str, on_close: Callable[[], object] | None, client: str | None) -> None:
        self.transport = transport
        self.on_close = on_close
        self.client = client
        self.admitted = anyio.Event()
        self.lease: SessionLease | None = None

    def admit(self, lease: SessionLease | None) -> None:
        """Hand the ticket its lease (``None``: it is turned away), and wake whoever waits for it."""
        self.lease = lease
        self.admitted.set()


class AdmissionQueue:
    """The tickets waiting for a slot, first come first served."""

    __slots__ = ("_tickets",)

    def __init__(self) -> None:
        self._tickets: deque[QueueTicket] = deque()

    def __len__(self) -> int:
        return len(self._tickets)

    def join(self, transport: str, on_close: Callable[[], object] | None, client: str | None) -> QueueTicket:
        """Join the queue at its end.

        Args:
            transport: Which transport the session runs on.
            on_close: Its lease's ``on_close``, once admitted.
            client: Who waits, or ``None``.

        Returns:
            The session's ticket.
        """
        ticket = QueueTicket(transport, on_close, client)
        self._tickets.append(ticket)
        return ticket

    def position(self, ticket: QueueTicket) -> int:
        """Where a ticket stands: 1 for the next admitted, 0 once it has left the queue."""
        try:
            return self._tickets.index(ticket) + 1
        except ValueError:
            return 0

    def remove(self, ticket: QueueTicket) -> bool:
        """Take a ticket out of the queue; whether it was in it."""
        if ticket in self._tickets:
            self._tickets.remove(ticket)
            return True
        return False

    def next(self) -> QueueTicket:
        """Take the ticket first in line out of the queue (there must be one), to admit it."""
        return self._tickets.popleft()

    def turn_away(self) -> Iterator[QueueTicket]:
        """Take every ticket out, each told it gets no lease (`QueueTicket.admit` with ``None``); yield each."""
        while self._tickets:
            ticket = self._tickets.popleft()
            ticket.admitted.set()
            yield ticket

"""A link's socket lent to its lone session's thread: what the host needs of a loan, and the session's side of it.

A link that carries one plain session and nothing else may lend its socket to
that session's thread (`transports.link._host.LinkHost.lend_to_lone_session`),
as a connection of its own would: the thread reads each envelope, steps, and
writes the reply's envelope itself, one thread wake-up a request and no trip
through the event loop. The loan itself is the carrier's
(`transports.websocket._socket_loan.SocketLoan` is one): `Loan` is what the
host uses of it, `LentChannel` what answers the envelopes on the thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import msgspec

from openenv.server import ServerSession
from transports.admission._lease import SessionLease
from transports.link._envelope import EnvelopeCodec, fits
from transports.link._state import ChannelState

__all__ = ["Lender", "LentChannel", "Loan"]


class Loan(Protocol):
    """A connection's socket lent to a session's thread, as the link's host uses it.

    Attributes:
        on_released: Called on the event loop when the connection comes back
            mid-request (the thread has been answering one for long).
    """

    on_released: Callable[[], object] | None

    def serve(
        self,
        on_frame: Callable[[bool, bytes], bytes | None],
        on_idle: Callable[[], bool],
        on_sent: Callable[[bytes], object] | None = None,
    ) -> bytes | None:
        """On the thread: answer whole data frames until the loan must end; a reply it could not write, if any."""
        ...

    def begin(self) -> bool:
        """On the thread: it starts answering the frame in hand; ``False`` if the loan was stopped."""
        ...

    def stop_after_this(self) -> None:
        """On the thread: end the loan after the frame in hand, its reply unwritten (`serve` returns it)."""
        ...

    def stop(self) -> None:
        """On the event loop: make `serve` return soon; once this returns, the thread writes nothing more."""
        ...

    def end(self) -> None:
        """On the event loop, once `serve` has returned: give the connection back (what the thread read and left)."""
        ...


Lender = Callable[[], Loan | None]
"""Lends a connection's socket to the calling session's thread, or ``None`` if not now."""


class LentChannel:
    """The lone session's side of a loan, on its thread: reads its envelopes, answers them, numbers the replies.

    The thread changes the link's numbering only in `on_sent`, with the loan's
    lock held and the loan not stopped; the event loop stops the loan before it
    changes anything (`transports.link._host.LinkHost`'s end of a session, a
    write to the connection): the two never change it at once.

    Args:
        number: The session's channel number.
        session: The session.
        lease: Its slot.
        channel: Its channel's numbering.
        loan: The loan.
        codec: The link's envelope codec.
        binary: The link's messages are binary (MessagePack), not text.
        client_limit: The largest message the client takes (``None``: no limit).

    Attributes:
        in_hand: ``(seq, ack, reply)`` of the frame answered last, until its reply is written.
    """

    __slots__ = ("_binary", "_channel", "_client_limit", "_codec", "_lease", "_loan", "_number", "_session", "in_hand")

    def __init__(
        self,
        number: int,
        session: ServerSession,
        lease: SessionLease,
        channel: ChannelState,
        loan: Loan,
        *,
        codec: EnvelopeCodec,
        binary: bool,
        client_limit: int | None,
    ) -> None:
        self._number = number
        self._session = session
        self._lease = lease
        self._channel = channel
        self._loan = loan
        self._codec = codec
        self._binary = binary
        self._client_limit = client_limit
        self.in_hand: tuple[int, int, bytes] | None = None

    def on_frame(self, is_text: bool, payload: bytes) -> bytes | None:
        """Answer one envelope holding the session's next frame alone; ``None`` leaves it to the event loop."""
        if is_text is self._binary:
            return None
        try:
            entries = self._codec.decode(payload)
        except msgspec.DecodeError:
            return None
        channel = self._channel
        if len(entries) != 1:
            return None
        number, seq, ack, frame = entries[0]
        if number != self._number or seq != channel.received + 1:
            return None  # a control, another channel, a frame sent again: the link's own business
        self._lease.mark_busy()
        reply = self._session.handle_on_thread(bytes(frame), self._begin)
        if reply is None:
            return None
        self.in_hand = (seq, ack, reply)
        if not fits(len(reply), self._client_limit):
            self._loan.stop_after_this()  # the event loop ends the session, as for any reply too large
        entry = (number, channel.sent + 1, seq, msgspec.Raw(reply))
        return self._codec.encode([entry])

    def _begin(self, request_id: int | None) -> bool:
        return self._loan.begin()

    def on_idle(self) -> bool:
        """Before each wait for the client: go on while the session is wanted."""
        lease = self._lease
        lease.touch()  # before looking at close_reason: see SessionLease.ask_to_end
        return lease.close_reason is None

    def on_sent(self, written: bytes) -> None:
        """The reply in hand is written (the loan's lock held): number it, and keep it until acknowledged."""
        reply = self.take_in_hand()
        channel = self._channel
        channel.sent = sent = channel.sent + 1
        channel.unacked.append((sent, msgspec.Raw(reply)))

    def take_in_hand(self) -> bytes:
        """Take the frame answered last as received (and what it acknowledged); return its reply."""
        in_hand, self.in_hand = self.in_hand, None
        assert in_hand is not None
        seq, ack, reply = in_hand
        channel = self._channel
        channel.acknowledged(ack)
        channel.received = seq
        return reply

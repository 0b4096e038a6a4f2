"""A WebSocket's socket lent to its session's thread (`transports.websocket._socket_loan`).

First the loan alone, over a socket pair: its thread side (`SocketLoan.serve`)
runs on a real thread, the test plays the client on the other end and the
event loop's side (`stop`, `end`, the ``write_back`` and ``give_back`` hooks).
Then whole sessions against a real server: on asyncio (uvicorn) a plain
environment's requests are answered on the lent socket, which each test checks
it was; on trio (hypercorn with websockets' protocol) nothing is lent, and
every test must pass the same.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from websockets.frames import Frame, Opcode

from transports.websocket._quick_frames import server_data_frame
from transports.websocket._socket_loan import SocketLoan

WAIT = 30.0  # seconds: the bound of every wait on a thread or a socket


def client_frame(payload: bytes, opcode: Opcode = Opcode.TEXT, *, fin: bool = True) -> bytes:
    """One frame as a client sends it: masked."""
    return Frame(opcode, payload, fin=fin).serialize(mask=True, extensions=[])


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the connection ended early"
        data += chunk
    return data


def receive_frame(sock: socket.socket) -> tuple[int, bytes]:
    """The next frame from the server's side: ``(opcode, payload)``."""
    first, length = receive_exactly(sock, 2)
    assert first & 0x80, "a server's frames are whole"
    assert not length & 0x80, "a server's frames are not masked"
    if length == 126:
        length = int.from_bytes(receive_exactly(sock, 2), "big")
    elif length == 127:
        length = int.from_bytes(receive_exactly(sock, 8), "big")
    return first & 0x0F, receive_exactly(sock, length)


def nothing_to_read(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)
        sock.settimeout(WAIT)
    return False


def echo(is_text: bool, payload: bytes) -> bytes:
    return b"re:" + payload


class Lent:
    """A socket pair, its server end lent: the test holds the client end and the event loop's hooks."""

    def __init__(self, *, max_size: int | None = None, quiet_limit: float | None = None) -> None:
        self.server, self.client = socket.socketpair()
        self.server.setblocking(False)
        self.client.settimeout(WAIT)
        self.written_back: list[bytes] = []
        self.given_back: list[bytes] = []
        self.loan = SocketLoan(
            self.server.fileno(),
            max_size=max_size,
            quiet_limit=quiet_limit,
            write_back=self.written_back.append,
            give_back=self.given_back.append,
        )
        self._thread: threading.Thread | None = None
        self._outcome: list[Any] = []

    def start(
        self,
        on_frame: Callable[[bool, bytes], bytes | None] = echo,
        on_idle: Callable[[], bool] = lambda: True,
        on_sent: Callable[[bytes], object] | None = None,
    ) -> None:
        """Run `SocketLoan.serve` on a thread of its own, as the session's thread would."""

        def run() -> None:
            try:
                self._outcome.append(self.loan.serve(on_frame, on_idle, on_sent))
            except BaseException as exc:  # handed to the test by `returned`
                self._outcome.append(exc)

        self._thread = threading.Thread(target=run, name="test-loan", daemon=True)
        self._thread.start()

    def returned(self) -> bytes | None:
        """What `serve` returned, once it has (a bounded wait)."""
        assert self._thread is not None
        self._thread.join(WAIT)
        assert not self._thread.is_alive(), "serve did not return"
        (outcome,) = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is None or isinstance(outcome, bytes)
        return outcome

    def given_back_at_end(self) -> bytes:
        """End the loan (as the event loop does once `serve` returned); what it gave back."""
        self.loan.end()
        (unread,) = self.given_back
        return unread

    def close(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.loan.stop()
            self._thread.join(WAIT)
        self.server.close()
        self.client.close()


@pytest.fixture
def lent() -> Iterator[Callable[..., Lent]]:
    made: list[Lent] = []

    def make(**options: Any) -> Lent:
        made.append(Lent(**options))
        return made[-1]

    yield make
    for each in made:
        each.close()


# -- the loan alone ------------------------------------------------------------------------


def test_whole_frames_are_answered_in_order_on_the_thread(lent: Callable[..., Lent]) -> None:
    pair = lent()
    threads: list[int] = []

    def on_frame(is_text: bool, payload: bytes) -> bytes:
        threads.append(threading.get_ident())
        return (b"text:" if is_text else b"binary:") + payload

    pair.start(on_frame)
    for index in range(5):
        pair.client.sendall(client_frame(f"m{index}".encode()))
        assert receive_frame(pair.client) == (Opcode.TEXT.value, f"text:m{index}".encode())
    pair.client.sendall(client_frame(b"\x00\x01", Opcode.BINARY))
    assert receive_frame(pair.client) == (Opcode.BINARY.value, b"binary:\x00\x01")
    pair.client.sendall(client_frame(b"y" * 300))  # a 16-bit length
    assert receive_frame(pair.client) == (Opcode.TEXT.value, b"text:" + b"y" * 300)
    pair.client.shutdown(socket.SHUT_WR)  # the end of the stream
    assert pair.returned() is None
    assert set(threads) == {pair._thread.ident if pair._thread else None}
    assert pair.given_back_at_end() == b""
    assert pair.written_back == []


def test_several_frames_in_one_read_are_all_answered_in_order(lent: Callable[..., Lent]) -> None:
    pair = lent()
    pair.client.sendall(b"".join(client_frame(f"m{index}".encode()) for index in range(10)))
    pair.start()
    for index in range(10):
        assert receive_frame(pair.client)[1] == f"re:m{index}".encode()
    pair.client.shutdown(socket.SHUT_WR)
    assert pair.returned() is None
    assert pair.given_back_at_end() == b""


def test_a_partial_frame_goes_back_to_the_protocol_intact(lent: Callable[..., Lent]) -> None:
    pair = lent()
    second = client_frame(b"the second, cut short")
    pair.client.sendall(client_frame(b"first") + second[:7])
    pair.start()
    assert receive_frame(pair.client)[1] == b"re:first"
    assert pair.returned() is None
    assert pair.given_back_at_end() == second[:7]
    pair.client.sendall(second[7:])  # the rest stays in the socket, for the protocol
    assert pair.server.recv(100) == second[7:]


@pytest.mark.parametrize(
    "other",
    [
        client_frame(b"are you there", Opcode.PING),
        client_frame(b"", Opcode.CLOSE),
        client_frame(b"fragment", fin=False),
        client_frame(b"continued", Opcode.CONT),
        Frame(Opcode.TEXT, b"unmasked").serialize(mask=False, extensions=[]),
        client_frame(b"\xc3\x28"),  # text, not UTF-8
    ],
    ids=["ping", "close", "first-fragment", "continuation", "unmasked", "bad-utf8"],
)
def test_anything_but_a_whole_data_frame_goes_back_with_all_after_it(
    lent: Callable[..., Lent], other: bytes
) -> None:
    pair = lent()
    after = client_frame(b"after")
    pair.client.sendall(client_frame(b"before") + other + after)
    answered: list[bytes] = []
    pair.start(lambda is_text, payload: answered.append(payload) or echo(is_text, payload))
    assert receive_frame(pair.client)[1] == b"re:before"
    assert pair.returned() is None
    assert answered == [b"before"]
    assert pair.given_back_at_end() == other + after
    assert nothing_to_read(pair.client)


def test_a_frame_over_the_size_limit_goes_back_unread(lent: Callable[..., Lent]) -> None:
    pair = lent(max_size=10)
    within, over = client_frame(b"x" * 10), client_frame(b"x" * 11)
    pair.client.sendall(within + over)
    answered: list[bytes] = []
    pair.start(lambda is_text, payload: answered.append(payload) or echo(is_text, payload))
    assert receive_frame(pair.client)[1] == b"re:" + b"x" * 10
    assert pair.returned() is None
    assert answered == [b"x" * 10]
    assert pair.given_back_at_end() == over


def test_a_frame_the_session_declines_goes_back_with_all_after_it(lent: Callable[..., Lent]) -> None:
    pair = lent()
    frames = [client_frame(name) for name in (b"a", b"decline", b"c")]
    pair.client.sendall(b"".join(frames))
    pair.start(lambda is_text, payload: None if payload == b"decline" else echo(is_text, payload))
    assert receive_frame(pair.client)[1] == b"re:a"
    assert pair.returned() is None
    assert pair.given_back_at_end() == frames[1] + frames[2]
    assert nothing_to_read(pair.client)


def test_the_loan_ends_when_the_session_must_end(lent: Callable[..., Lent]) -> None:
    pair = lent()
    pair.client.sendall(client_frame(b"one"))
    answers = iter([True, False])
    pair.start(on_idle=lambda: next(answers))
    assert receive_frame(pair.client)[1] == b"re:one"
    assert pair.returned() is None
    assert pair.given_back_at_end() == b""
    later = client_frame(b"later")
    pair.client.sendall(later)
    assert pair.server.recv(100) == later  # not read by the thread: left for the protocol


def test_on_idle_false_at_once_reads_nothing(lent: Callable[..., Lent]) -> None:
    pair = lent()
    frame = client_frame(b"waiting")
    pair.client.sendall(frame)
    pair.start(on_idle=lambda: False)
    assert pair.returned() is None
    assert pair.given_back_at_end() == b""
    assert pair.server.recv(100) == frame
    assert nothing_to_read(pair.client)


def test_a_quiet_connection_ends_the_loan(lent: Callable[..., Lent]) -> None:
    pair = lent(quiet_limit=0.001)
    pair.start()
    assert pair.returned() is None
    assert pair.given_back_at_end() == b""


def test_stop_wakes_a_thread_waiting_for_the_client(lent: Callable[..., Lent]) -> None:
    pair = lent()  # no quiet limit: only stop() can end the wait
    waiting = threading.Event()

    def on_idle() -> bool:
        waiting.set()
        return True

    pair.start(on_idle=on_idle)
    assert waiting.wait(WAIT)
    pair.loan.stop()
    assert pair.loan.stopped
    assert pair.returned() is None
    pair.loan.stop()  # idempotent
    assert pair.given_back_at_end() == b""


def test_a_reply_computed_after_stop_is_handed_back_not_written(lent: Callable[..., Lent]) -> None:
    pair = lent()
    stepping, may_finish = threading.Event(), threading.Event()
    after = client_frame(b"after")

    def on_frame(is_text: bool, payload: bytes) -> bytes:
        stepping.set()
        assert may_finish.wait(WAIT)
        return echo(is_text, payload)

    pair.client.sendall(client_frame(b"slow") + after)
    pair.start(on_frame)
    assert stepping.wait(WAIT)
    pair.loan.stop()  # the event loop must write now: the thread writes nothing more
    may_finish.set()
    assert pair.returned() == b"re:slow"
    assert pair.given_back_at_end() == after
    assert nothing_to_read(pair.client)


def test_on_sent_sees_each_reply_under_the_loans_lock(lent: Callable[..., Lent]) -> None:
    pair = lent()
    sent: list[tuple[bytes, bool]] = []

    def on_sent(reply: bytes) -> None:
        sent.append((reply, pair.loan._lock.locked()))

    pair.client.sendall(client_frame(b"a") + client_frame(b"b"))
    pair.start(on_sent=on_sent)
    assert receive_frame(pair.client)[1] == b"re:a"
    assert receive_frame(pair.client)[1] == b"re:b"
    pair.client.shutdown(socket.SHUT_WR)
    assert pair.returned() is None
    assert sent == [(b"re:a", True), (b"re:b", True)]


@pytest.mark.parametrize("finish", ["stop", "end"])
def test_the_rest_of_a_reply_not_written_whole_is_written_back_first(lent: Callable[..., Lent], finish: str) -> None:
    pair = lent()
    pair.server.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    pair.client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    big = os.urandom(4 * 1024 * 1024)  # far more than the socket takes while the client does not read
    after = client_frame(b"after")
    sent: list[bytes] = []
    pair.client.sendall(client_frame(b"big") + after)
    pair.start(lambda is_text, payload: big if payload == b"big" else echo(is_text, payload), on_sent=sent.append)
    assert pair.returned() is None  # the write did not go out whole: the loan ends
    assert sent == [big]
    assert pair.written_back == []
    if finish == "stop":
        pair.loan.stop()
    assert pair.given_back_at_end() == after  # end() writes back (if stop() did not) before giving back
    (rest,) = pair.written_back
    assert 0 < len(rest) < len(big)
    frame = server_data_frame(big, text=True)
    written = frame[: len(frame) - len(rest)]
    assert written + rest == frame
    # What reached the client is the frame's start, and only that, so the rest follows it in order.
    received = b""
    while len(received) < len(written):
        received += pair.client.recv(len(written) - len(received))
    assert received == written
    assert nothing_to_read(pair.client)


def test_the_end_of_the_stream_ends_the_loan(lent: Callable[..., Lent]) -> None:
    pair = lent()
    pair.start()
    pair.client.close()
    assert pair.returned() is None
    assert pair.given_back_at_end() == b""


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_end_closes_the_loans_own_descriptors(lent: Callable[..., Lent]) -> None:
    server, client = socket.socketpair()
    try:
        server.setblocking(False)
        before = _open_descriptors()
        for _ in range(20):
            loan = SocketLoan(server.fileno(), max_size=None, quiet_limit=0.001, write_back=print, give_back=len)
            assert _open_descriptors() > before
            assert loan.serve(echo, lambda: True) is None
            loan.end()
            assert _open_descriptors() == before
    finally:
        server.close()
        client.close()


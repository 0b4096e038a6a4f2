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

import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import anyio.abc
import pytest
from websockets.frames import Frame, Opcode

import transports.server.drivers._uvicorn
from openenv import Action, Observation, State
from openenv.server import Environment
from tests.helpers import wait_until
from tests.server.test_server_app import RawWebSocket, registry_of
from transports.server.runner import RunningServer, current_backend, serve
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


def recording(answered: list[bytes]) -> Callable[[bool, bytes], bytes]:
    """`echo`, noting each payload it answers."""

    def on_frame(is_text: bool, payload: bytes) -> bytes:
        answered.append(payload)
        return echo(is_text, payload)

    return on_frame


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
def test_anything_but_a_whole_data_frame_goes_back_with_all_after_it(lent: Callable[..., Lent], other: bytes) -> None:
    pair = lent()
    after = client_frame(b"after")
    pair.client.sendall(client_frame(b"before") + other + after)
    answered: list[bytes] = []
    pair.start(recording(answered))
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
    pair.start(recording(answered))
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


def test_a_long_request_hands_the_rest_of_the_connection_back_at_once(lent: Callable[..., Lent]) -> None:
    pair = lent()
    stepping, may_finish = threading.Event(), threading.Event()
    after = client_frame(b"after") + client_frame(b"and more")

    def on_frame(is_text: bool, payload: bytes) -> bytes | None:
        if not pair.loan.begin():
            return None
        stepping.set()
        assert may_finish.wait(WAIT)
        return echo(is_text, payload)

    pair.client.sendall(client_frame(b"slow") + after)
    pair.start(on_frame)
    assert stepping.wait(WAIT)
    assert not pair.loan.release_if_running(10 * WAIT)  # not running that long yet
    assert pair.loan.release_if_running(0.0)
    assert pair.given_back == [after]  # at once, while the request still runs
    assert pair.loan.stopped
    assert not pair.loan.release_if_running(0.0)
    may_finish.set()
    assert pair.returned() == b"re:slow"  # for the event loop to send
    pair.loan.end()
    assert pair.given_back == [after]  # given back once
    assert nothing_to_read(pair.client)


def test_a_loan_answering_nothing_is_not_released(lent: Callable[..., Lent]) -> None:
    pair = lent()
    waiting = threading.Event()

    def on_idle() -> bool:
        waiting.set()
        return True

    def on_frame(is_text: bool, payload: bytes) -> bytes | None:
        return echo(is_text, payload) if pair.loan.begin() else None

    pair.start(on_frame, on_idle)
    assert waiting.wait(WAIT)
    assert not pair.loan.release_if_running(0.0)  # waiting for the client
    pair.client.sendall(client_frame(b"one"))
    assert receive_frame(pair.client)[1] == b"re:one"
    assert not pair.loan.release_if_running(0.0)  # answered: running no more
    assert not pair.loan.stopped
    pair.client.shutdown(socket.SHUT_WR)
    assert pair.returned() is None
    assert pair.given_back_at_end() == b""


def test_a_request_begun_after_stop_goes_back_unanswered(lent: Callable[..., Lent]) -> None:
    pair = lent()
    read, may_begin = threading.Event(), threading.Event()
    frames = client_frame(b"late") + client_frame(b"later")

    def on_frame(is_text: bool, payload: bytes) -> bytes | None:
        read.set()
        assert may_begin.wait(WAIT)
        return echo(is_text, payload) if pair.loan.begin() else None

    pair.client.sendall(frames)
    pair.start(on_frame)
    assert read.wait(WAIT)
    pair.loan.stop()
    may_begin.set()
    assert pair.returned() is None
    assert pair.given_back_at_end() == frames
    assert nothing_to_read(pair.client)


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
        pair.loan.stop()  # before the event loop writes anything itself
        assert len(pair.written_back) == 1
    assert pair.given_back_at_end() == after
    (rest,) = pair.written_back  # written once, by stop() or end()
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


# -- whole sessions on a real server ---------------------------------------------------------


class LoanAction(Action):
    message: str = ""
    block: bool = False


class LoanObservation(Observation):
    echoed: str = ""


class PlainEnv(Environment[LoanAction, LoanObservation, State]):
    """Plain methods (so served on the lent socket on uvicorn); records each step it runs.

    A step asked to ``block`` waits, on its session's thread, for the test to open ``gate``.
    """

    built: ClassVar[list[PlainEnv]] = []
    closed: ClassVar[list[PlainEnv]] = []
    entered: ClassVar[threading.Event] = threading.Event()
    gate: ClassVar[threading.Event] = threading.Event()

    def __init__(self) -> None:
        self._state = State()
        self.steps: list[str] = []
        PlainEnv.built.append(self)

    def reset(self, **kwargs: Any) -> LoanObservation:
        self._state = State(episode_id=kwargs.get("episode_id"))
        return LoanObservation()

    def step(self, action: LoanAction) -> LoanObservation:
        if action.message == "raise":
            raise RuntimeError("plain env: step raised on request")
        if action.block:
            PlainEnv.entered.set()
            assert PlainEnv.gate.wait(WAIT)
        self.steps.append(action.message)
        self._state.step_count += 1
        return LoanObservation(echoed=action.message, reward=float(len(action.message)))

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        PlainEnv.closed.append(self)


@pytest.fixture(autouse=True)
def _fresh_plain_env() -> Iterator[None]:
    PlainEnv.built.clear()
    PlainEnv.closed.clear()
    PlainEnv.entered.clear()
    PlainEnv.gate.clear()
    yield
    PlainEnv.gate.set()  # a test that failed mid-step leaves no thread waiting


@pytest.fixture
def loans(monkeypatch: pytest.MonkeyPatch) -> list[SocketLoan]:
    """Every loan the server serves on a session's thread, in order."""
    served: list[SocketLoan] = []
    original = SocketLoan.serve

    def serve(self: SocketLoan, *args: Any, **kwargs: Any) -> bytes | None:
        served.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SocketLoan, "serve", serve)
    return served


def lends() -> bool:
    """Whether the server of this backend lends sockets: uvicorn, on asyncio (hypercorn on trio does not)."""
    return current_backend() == "asyncio"


async def lent_now(loans: list[SocketLoan], count: int = 1) -> None:
    """Wait until the latest of at least ``count`` loans is on (on a server that lends sockets)."""
    if lends():
        await wait_until(lambda: len(loans) >= count and not loans[-1].stopped, "the socket is lent")


def check_lent(loans: list[SocketLoan], at_least: int = 1) -> None:
    if lends():
        assert len(loans) >= at_least, f"{len(loans)} loans, expected {at_least} or more"
    else:
        assert not loans


@asynccontextmanager
async def plain_server(**options: Any) -> AsyncIterator[RunningServer]:
    async with serve(PlainEnv, **options) as server:
        yield server


async def step(ws: RawWebSocket, message: str, request_id: int | None = None) -> Any:
    ident = "" if request_id is None else f'"id":{request_id},'
    return await ws.request(f'{{"type":"step",{ident}"data":{{"message":"{message}"}}}}')


async def next_frame(ws: RawWebSocket) -> Frame:
    """The next frame of any kind (a pong, say) from the server."""
    while not ws._frames:
        ws._protocol.receive_data(await ws._stream.receive())
        ws._frames.extend(ws._protocol.events_received())
    frame: Frame = ws._frames.pop(0)
    return frame


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_plain_session_is_answered_on_the_lent_socket(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.request('{"type":"reset","data":{"episode_id":"ep"}}')
            await lent_now(loans)
            for index in range(20):
                reply = await step(ws, f"m{index}")
                assert reply["data"]["observation"]["echoed"] == f"m{index}"
            assert await ws.request('{"type":"state"}') == {
                "type": "state",
                "data": {"episode_id": "ep", "step_count": 20},
            }
            check_lent(loans)
            if lends():
                assert len(loans) < 20, "one loan serves many requests"
            await ws.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_ping_mid_session_gets_its_pong_and_the_session_goes_on(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.request('{"type":"reset"}')
            for round_ in range(3):
                await lent_now(loans)
                ws._protocol.send_ping(f"ping {round_}".encode())
                await ws._flush()
                pong = await next_frame(ws)
                assert (pong.opcode, pong.data) == (Opcode.PONG, f"ping {round_}".encode())
                assert (await step(ws, f"after {round_}"))["data"]["observation"]["echoed"] == f"after {round_}"
            check_lent(loans, at_least=3)  # each ping ended a loan; after the next request, a new one
            assert PlainEnv.built[0].steps == ["after 0", "after 1", "after 2"]
            await ws.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_close_request_ends_the_session_normally(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await step(ws, "one")
            await lent_now(loans)
            await ws.send_text('{"type":"close"}')
            assert (await ws.expect_close()).code == 1000
            await wait_until(lambda: registry_of(server).active == 0, "the session ends")
            assert PlainEnv.closed == PlainEnv.built
            check_lent(loans)


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_bad_requests_get_their_error_replies_and_the_session_goes_on(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.request('{"type":"reset","data":{"episode_id":"ep"}}')
            await step(ws, "one")
            await lent_now(loans)
            reply = await ws.request("not json")
            assert (reply["type"], reply["data"]["code"]) == ("error", "INVALID_JSON")
            await lent_now(loans)
            reply = await ws.request('{"type":"step","data":{"messag":"typo","block":"no"}}')
            assert (reply["data"]["code"], reply["data"]["message"]) == ("VALIDATION_ERROR", "Invalid message")
            assert reply["data"]["errors"]
            await lent_now(loans)
            reply = await ws.request('{"type":"bogus"}')
            assert reply["data"]["code"] == "UNKNOWN_TYPE"
            await lent_now(loans)
            reply = await step(ws, "raise")
            assert reply["data"]["code"] == "EXECUTION_ERROR"
            assert "step raised on request" in reply["data"]["message"]
            if lends():
                assert not loans[-1].stopped  # answered on the thread: the loan goes on
            await ws.send_bytes(b'{"type":"state"}')  # a frame of the wrong kind for the dialect
            reply = await ws.receive_json()
            assert reply["data"]["code"] == "INVALID_JSON"
            assert "binary" in reply["data"]["message"]
            await step(ws, "two")
            # The same environment all along.
            assert await ws.request('{"type":"state"}') == {
                "type": "state",
                "data": {"episode_id": "ep", "step_count": 2},
            }
            assert len(PlainEnv.built) == 1
            check_lent(loans, at_least=4)
            await ws.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_an_oversized_message_closes_only_its_own_session(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with (
            plain_server(max_message_size=4096) as server,
            RawWebSocket.connect(server.ws_url) as bystander,
        ):
            await step(bystander, "before")
            async with RawWebSocket.connect(server.ws_url) as ws:
                await step(ws, "small")
                await lent_now(loans, count=2)  # the bystander's loan is the first
                await ws.send_text('{"type":"step","data":{"message":"' + "x" * 5000 + '"}}')
                assert (await ws.expect_close()).code == 1009
            assert (await step(bystander, "after"))["data"]["observation"]["echoed"] == "after"
            await wait_until(lambda: registry_of(server).active == 1, "only the bystander is left")
            assert PlainEnv.built[1].steps == ["small"]
            check_lent(loans, at_least=2)
            await bystander.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_message_split_across_two_writes_is_answered(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await step(ws, "one")
            for split in (1, 2, 5, 20):  # in the header, in the mask, in the payload
                await lent_now(loans)
                loan = loans[-1] if lends() else None
                ws._protocol.send_text(b'{"type":"step","data":{"message":"split"}}')
                frame = b"".join(ws._protocol.data_to_send())
                await ws._stream.send(frame[:split])
                if loan is not None:  # the thread read the start, and gave it back with the socket
                    await wait_until(lambda: loan.stopped, "the loan ends at a partial frame")  # noqa: B023
                await ws._stream.send(frame[split:])
                assert (await ws.receive_json())["data"]["observation"]["echoed"] == "split"
            assert PlainEnv.built[0].steps == ["one", "split", "split", "split", "split"]
            check_lent(loans, at_least=4)
            await ws.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_pipelined_requests_are_all_answered_in_order(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.request('{"type":"reset"}')
            await lent_now(loans)
            requests = [f'{{"type":"step","data":{{"message":"m{index}"}}}}' for index in range(30)]
            requests[10] = '{"type":"state"}'
            for request in requests:
                ws._protocol.send_text(request.encode())
            await ws._stream.send(b"".join(ws._protocol.data_to_send()))  # one write
            for index in range(30):
                reply = await ws.receive_json()
                if index == 10:
                    assert reply == {"type": "state", "data": {"episode_id": None, "step_count": 10}}
                else:
                    assert reply["data"]["observation"]["echoed"] == f"m{index}"
            check_lent(loans)
            await ws.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_requests_after_a_ping_in_the_same_write_are_all_answered(
    loans: list[SocketLoan], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No keepalive within the test's bound: a request left waiting behind a loan would stall the test.
    monkeypatch.setattr(transports.server.drivers._uvicorn, "_WS_PING_INTERVAL", 10 * WAIT)
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await ws.request('{"type":"reset"}')
            for round_ in range(3):
                await lent_now(loans)
                ws._protocol.send_text(b'{"type":"step","data":{"message":"a"}}')
                ws._protocol.send_ping(b"between")
                for message in ("b", "c"):
                    ws._protocol.send_text(f'{{"type":"step","data":{{"message":"{message}"}}}}'.encode())
                ws._protocol.send_text(b'{"type":"state"}')
                await ws._stream.send(b"".join(ws._protocol.data_to_send()))  # one write
                frames: list[Frame] = []
                while len([frame for frame in frames if frame.opcode is Opcode.TEXT]) < 4:
                    frames.append(await next_frame(ws))
                assert [frame.data for frame in frames if frame.opcode is Opcode.PONG] == [b"between"]
                replies = [json.loads(bytes(frame.data)) for frame in frames if frame.opcode is Opcode.TEXT]
                assert [reply["data"]["observation"]["echoed"] for reply in replies[:3]] == ["a", "b", "c"]
                assert replies[3]["data"]["step_count"] == 3 * (round_ + 1)
            check_lent(loans, at_least=3)
            await ws.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_slow_step_in_one_session_does_not_stall_another(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with (
            plain_server() as server,
            RawWebSocket.connect(server.ws_url) as slow,
            RawWebSocket.connect(server.ws_url) as quick,
        ):
            await step(slow, "first")
            await lent_now(loans)  # the blocking step runs on the thread the socket is lent to
            await slow.send_text('{"type":"step","data":{"message":"blocked","block":true}}')
            await anyio.to_thread.run_sync(PlainEnv.entered.wait, WAIT)
            await quick.request('{"type":"reset"}')
            await lent_now(loans, count=2)  # the slow session's loan is the first
            for index in range(10):
                assert (await step(quick, f"q{index}"))["data"]["observation"]["echoed"] == f"q{index}"
            if lends():  # a step that keeps the thread long gives the connection back: pings are answered
                await wait_until(lambda: loans[0].stopped, "the slow session's loan is released")
                slow._protocol.send_ping(b"still there?")
                await slow._flush()
                pong = await next_frame(slow)
                assert (pong.opcode, pong.data) == (Opcode.PONG, b"still there?")
            PlainEnv.gate.set()
            assert (await slow.receive_json())["data"]["observation"]["echoed"] == "blocked"
            assert (await step(slow, "last"))["data"]["observation"]["echoed"] == "last"
            check_lent(loans, at_least=2)
            await slow.close()
            await quick.close()


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_session_the_server_ends_while_its_socket_is_lent(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server() as server, RawWebSocket.connect(server.ws_url) as ws:
            await step(ws, "one")
            await lent_now(loans)
            [lease] = registry_of(server).leases()
            lease.request_close("ended by the server")
            closed = await ws.expect_close()
            assert (closed.code, closed.reason) == (1001, "ended by the server")
            await wait_until(lambda: registry_of(server).active == 0, "the session ends")
            assert PlainEnv.closed == PlainEnv.built
            check_lent(loans)


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_server_shutting_down_ends_a_lent_session_at_once(loans: list[SocketLoan]) -> None:
    codes: list[tuple[int | None, str]] = []

    async def hold_session(url: str, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        async with RawWebSocket.connect(url) as ws:
            await step(ws, "one")
            await lent_now(loans)
            task_status.started()
            closed = await ws.expect_close()
            codes.append((closed.code, closed.reason))

    # A grace period longer than the test's bound: the session must be asked to end at once.
    with anyio.fail_after(WAIT):
        async with anyio.create_task_group() as task_group, plain_server(shutdown_timeout=10 * WAIT) as server:
            await task_group.start(hold_session, server.ws_url)
    assert codes == [(1001, "server shutting down")]
    assert PlainEnv.closed == PlainEnv.built
    check_lent(loans)


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_a_client_gone_while_its_socket_is_lent_frees_its_slot(loans: list[SocketLoan]) -> None:
    with anyio.fail_after(WAIT):
        async with plain_server(max_sessions=1) as server:
            async with RawWebSocket.connect(server.ws_url) as ws:
                await step(ws, "one")
                await lent_now(loans)
            # The TCP connection is closed, with no closing handshake.
            await wait_until(lambda: registry_of(server).active == 0, "the slot is freed")
            assert PlainEnv.closed == PlainEnv.built
            async with RawWebSocket.connect(server.ws_url) as ws:
                assert (await step(ws, "next"))["data"]["observation"]["echoed"] == "next"
                await ws.close()
            check_lent(loans)


def session_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "openenv-session"}


@pytest.mark.speed_path
@pytest.mark.anyio
async def test_sessions_served_on_lent_sockets_leave_no_threads_behind(loans: list[SocketLoan]) -> None:
    before = session_threads()
    with anyio.fail_after(WAIT):
        async with plain_server() as server:
            for index in range(50):
                async with RawWebSocket.connect(server.ws_url) as ws:
                    await step(ws, f"m{index}")
                    await lent_now(loans, count=index + 1)
                    if index % 2:
                        await ws.send_text('{"type":"close"}')
                        await ws.close()
                    # else: the connection is dropped while lent
            await wait_until(lambda: registry_of(server).active == 0, "every session ends")
            await wait_until(lambda: session_threads() <= before, "every session's thread is gone")
    assert len(PlainEnv.closed) == 50
    check_lent(loans, at_least=50)

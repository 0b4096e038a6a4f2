"""Blocking lanes: a blocking client's requests made from the caller's own thread, when its transport allows.

`openenv.SyncEnvClient` drives an async client on an event loop in a background
thread (`openenv._blocking`). A call that crosses to that thread and back pays
two thread wake-ups, more than the rest of a small step costs. A transport that
can let the caller's thread do the I/O itself offers a `BlockingLane` per
session (`BlockingLanes.blocking_lane`): the facade then numbers and encodes the
request, sends it and reads its reply in the calling thread, with the same
`openenv._requests.RequestChannel` bookkeeping the async client uses (request
ids, late replies dropped, error frames raised). Whatever the lane cannot do (a
ping to answer, a broken connection, a session the server ended) it hands back,
and the call goes on through the event loop, where the async client does it as
always: a lane is only ever a shortcut.

A transport knows it serves blocking callers by `BLOCKING_CALLERS`, set in the
task that opens a blocking facade's client: it may then keep those sessions on
connections of their own kind (a link only blocking clients ride), which it can
lend to their threads.
"""

from __future__ import annotations

import enum
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import anyio

from ._codec import ClientCodec
from ._limits import UseClientDefault
from ._requests import Encoder, RequestChannel

__all__ = [
    "BLOCKING_CALLERS",
    "BlockingLane",
    "BlockingLanes",
    "LaneCalls",
    "Sent",
    "Unfinished",
]

_T = TypeVar("_T")

BLOCKING_CALLERS: ContextVar[bool] = ContextVar("openenv_blocking_callers", default=False)
"""Set in the task that opens a blocking facade's client: its transport may offer a `BlockingLane`."""


class Sent(enum.Enum):
    """What became of a frame a thread sent on a `BlockingLane`."""

    SENT = "sent"
    """Written whole: read the reply on the lane."""
    NOT_SENT = "not sent"
    """Nothing went out: make the whole request through the event loop."""
    HANDED_BACK = "handed back"
    """It went out, or will (the transport has it), but the lane ended: wait for the reply through the event loop."""


class BlockingLane(ABC):
    """One session's frames sent and received from the calling thread; see the module's docstring."""

    __slots__ = ()

    @abstractmethod
    def send(self, frame: bytes) -> Sent:
        """Send one frame from the calling thread.

        Args:
            frame: The encoded frame.

        Returns:
            What became of it (`Sent`).
        """

    @abstractmethod
    def posted(self, frame: bytes) -> bool:
        """Whether ``frame`` is the last frame the lane took: it goes out even if its `send` was interrupted.

        Args:
            frame: A frame given to `send`.
        """

    @abstractmethod
    def receive(self, deadline: float | None) -> bytes | None:
        """The session's next frame, read in the calling thread.

        Args:
            deadline: When to give up, on `time.monotonic`'s clock (``None``: never).

        Returns:
            The frame; ``None`` when the lane cannot get it: wait for it through the event loop.

        Raises:
            TimeoutError: The deadline passed first.
        """

    @abstractmethod
    def relend(self) -> bool:
        """Make the lane usable again after a call that went through the event loop; call it there.

        Returns:
            Whether the lane is usable now.
        """


@runtime_checkable
class BlockingLanes(Protocol):
    """A transport that can lend its session to blocking callers' threads."""

    def blocking_lane(self) -> BlockingLane | None:
        """The session's lane, made usable (call on the event loop); ``None``: it has none."""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """A request the lane could not finish: the event loop finishes it.

    Attributes:
        codec: The codec it was encoded with.
        request_id: Its id.
        deadline: When its caller gives up (`time.monotonic`), or ``None``.
        timeout: The caller's timeout, for the message.
        sent: Whether it went out (else it is to be made from the start).
    """

    codec: ClientCodec[Any, Any, Any]
    request_id: int
    deadline: float | None
    timeout: float | None
    sent: bool


class LaneCalls:
    """A blocking facade's calls: one at a time, on its session's lane when it has one.

    Attributes:
        lock: One call at a time through the facade, whichever way it goes.
        lane: The session's lane, once the client is connected over a transport
            that has one; ``None`` otherwise.
    """

    __slots__ = ("lane", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lane: BlockingLane | None = None

    @staticmethod
    def request(
        lane: BlockingLane,
        requests: RequestChannel[Any, Any, Any],
        encode: Encoder,
        payload: Any,
        timeout: float | None,
    ) -> Any:
        """Make a request on ``lane`` (call with `lock` held): its reply, or what is left for the event loop.

        Returns:
            The reply (an error frame is raised), or an `Unfinished`.

        Raises:
            TimeoutError: No reply within the timeout (the session survives; the late reply is dropped).
            ServerError: The reply is an error frame (a subclass per code).
            ProtocolError: The frame is not a reply, or answers no request.
            ReplyValidationError: The reply does not fit the client's types.
            EncodingError: The request cannot be encoded.
            ClientStateError: The client is closed.
        """
        codec, frame, request_id = requests.prepare(encode, payload)
        deadline = None if timeout is None else time.monotonic() + timeout
        unanswered = requests.unanswered
        unanswered.append(request_id)  # first: a send cut short (Ctrl-C) may still go out, and get its reply
        try:
            sent = lane.send(frame)
        except BaseException:
            if not lane.posted(frame):
                unanswered.pop()
            raise
        if sent is Sent.NOT_SENT:
            unanswered.pop()
            return Unfinished(codec, request_id, deadline, timeout, sent=False)
        if sent is Sent.HANDED_BACK:
            return Unfinished(codec, request_id, deadline, timeout, sent=True)
        while True:
            try:
                received = lane.receive(deadline)
            except TimeoutError:
                raise TimeoutError(f"no reply within {timeout} s") from None
            if received is None:
                return Unfinished(codec, request_id, deadline, timeout, sent=True)
            reply = requests.reply_in(codec, received, request_id)
            if reply is not None:
                return reply

    def make(
        self,
        on_the_loop: Callable[[Callable[[], Awaitable[Any]]], Any],
        requests: RequestChannel[Any, Any, Any],
        encode: Encoder,
        payload: Any,
        timeout: float | UseClientDefault | None,
        default_timeout: float | None,
    ) -> Any:
        """Make a request from the calling thread, one call of the facade at a time; its reply.

        On the lane (`request`); what the lane leaves unfinished, through the
        event loop (`finish`, run by ``on_the_loop``: the facade's portal). It
        raises what `request` raises, or what the async client's request does.
        """
        if isinstance(timeout, UseClientDefault):
            timeout = default_timeout
        with self.lock:
            lane = self.lane
            if lane is None or (timeout is not None and timeout <= 0):  # a timeout of 0 gives up on the loop at once
                return on_the_loop(
                    lambda: self.through_the_loop(lambda: requests.request(encode, payload, timeout, default_timeout))
                )
            reply = self.request(lane, requests, encode, payload, timeout)
            if type(reply) is Unfinished:
                unfinished = reply
                reply = on_the_loop(lambda: self.finish(requests, unfinished, encode, payload, default_timeout))
            return reply

    async def finish(
        self,
        requests: RequestChannel[Any, Any, Any],
        unfinished: Unfinished,
        encode: Encoder,
        payload: Any,
        default_timeout: float | None,
    ) -> Any:
        """Finish on the event loop what the lane left, then lend the lane again; the reply."""
        try:
            if not unfinished.sent:
                return await requests.request(encode, payload, unfinished.timeout, default_timeout)
            async with requests.lock:
                if unfinished.deadline is None:
                    return await requests.receive_reply(unfinished.codec, unfinished.request_id)
                with anyio.move_on_after(unfinished.deadline - time.monotonic()):
                    return await requests.receive_reply(unfinished.codec, unfinished.request_id)
            raise TimeoutError(f"no reply within {unfinished.timeout} s")
        finally:
            self.relend()

    async def through_the_loop(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """Make a call through the event loop, then lend the lane again."""
        try:
            return await call()
        finally:
            self.relend()

    def relend(self) -> None:
        """Lend the lane again (on the event loop), if there is one."""
        lane = self.lane
        if lane is not None:
            lane.relend()

    def attach(self, transport: object) -> None:
        """Take the transport's lane, if it has one (on the event loop, once connected)."""
        self.lane = transport.blocking_lane() if isinstance(transport, BlockingLanes) else None

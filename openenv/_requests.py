"""`RequestChannel`: one connected client's requests, one at a time: numbered, sent, their replies matched.

An `EnvClient` makes one when it connects and makes every request through it;
an `openenv.EnvPool` drives its sessions' channels directly, many at once
(`openenv._pool_steps`), with the same lock, numbering and reply matching.

Replies are matched with a lock and an ordered deque of unanswered ids: a
server answers a session's requests in order, so the oldest unanswered request
is always the next one answered, and a late reply (to a call that timed out or
was cancelled) is recognised and dropped, never handed to the next call.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, NoReturn

import anyio
import msgspec

from ._batch import LinkStepBatcher, StepBatcher, StepBatching
from ._clock import EVENT_LOOP_CLOCK, Clock
from ._codec import ClientCodec
from ._exceptions import (
    ClientStateError,
    ConnectionClosed,
    EncodingError,
    OpenEnvError,
    ProtocolError,
    ReplyValidationError,
    TimeoutError,
    server_error_from_frame,
)
from ._limits import CLOSE_FRAME_TIMEOUT, PARTING_FRAME_WAIT, SEND_GRACE, USE_CLIENT_DEFAULT, UseClientDefault
from ._messages import ErrorReply, MCPMessage, ObservationReply, StateReply
from ._request_lock import RequestLock
from ._results import StepResults
from ._transport import Transport
from ._types import ActT, ObsT, StateT
from ._watchdog import Watchdog

__all__ = ["Encoder", "RequestChannel", "encode_mcp", "encode_reset", "encode_state", "encode_step"]

Encoder = Callable[[ClientCodec[Any, Any, Any], Any, int], bytes]
"""Encodes a request: ``encode(codec, payload, request_id)``. Module functions, not closures: a pool
of thousands makes one request per session per step."""


def encode_step(codec: ClientCodec[Any, Any, Any], action: Any, request_id: int) -> bytes:
    """A step request on ``action``."""
    return codec.step(action, request_id)


def encode_reset(codec: ClientCodec[Any, Any, Any], arguments: dict[str, Any], request_id: int) -> bytes:
    """A reset request with the environment's keyword ``arguments``."""
    return codec.reset(arguments, request_id)


def encode_state(codec: ClientCodec[Any, Any, Any], _: None, request_id: int) -> bytes:
    """A state request (its payload is ``None``)."""
    return codec.state(request_id)


def encode_mcp(codec: ClientCodec[Any, Any, Any], message: dict[str, Any], request_id: int) -> bytes:
    """An ``mcp`` request carrying a JSON-RPC ``message``."""
    return codec.mcp(message, request_id)


def _no_batcher() -> None:
    """The step batcher of a transport that does not batch (`StepBatching`): none, ever."""
    return None


class RequestChannel(Generic[ActT, ObsT, StateT]):
    """A connected client's requests on its transport (see the module's docstring).

    Args:
        transport: The client's transport, entered.
        codec: The client's codec, for the dialect the transport negotiated.
        observation_type: What the client decodes observations into (see `results`).
        clock: Where the calls' deadlines are measured.

    Attributes:
        lock: One request at a time: held from a request's send until its reply
            is taken (or given up on). Owned by no task: a pool takes it in the
            task that sends and may give it back in another.
        transport: The transport.
        codec: The codec.
        results: Makes the results of the replies to steps.
        step_batcher: The transport's `StepBatching.step_batcher`; for a
            transport that does not batch, a function that always returns ``None``.
        unanswered: The ids of requests sent whose replies have not been read
            yet, oldest first. Replies come in order, so the oldest is always
            the next one to arrive.
        next_id: The id of the last request numbered; the next gets one more.
        open: Whether requests may be made: ``False`` once the client closes, or
            a send stuck past its grace closed the transport.
        watchdog: Cancels a call at its deadline, while the client's owner runs
            it; ``None``: each call arms a timer of the clock's.
    """

    __slots__ = (
        "_clock",
        "codec",
        "lock",
        "next_id",
        "open",
        "results",
        "step_batcher",
        "transport",
        "unanswered",
        "watchdog",
    )

    def __init__(
        self, transport: Transport, codec: ClientCodec[ActT, ObsT, StateT], observation_type: Any, clock: Clock
    ) -> None:
        self.transport = transport
        self.codec = codec
        self._clock = clock
        self.results: StepResults[ObsT] = StepResults(observation_type)
        self.step_batcher: Callable[[], StepBatcher | LinkStepBatcher | None] = (
            transport.step_batcher if isinstance(transport, StepBatching) else _no_batcher
        )
        self.lock = RequestLock()
        self.unanswered: deque[int] = deque()
        self.next_id = 0
        self.open = True
        self.watchdog: Watchdog | None = None

    async def request(
        self,
        encode: Encoder,
        payload: Any,
        timeout: float | UseClientDefault | None,
        default_timeout: float | None,
        codec: ClientCodec[Any, Any, Any] | None = None,
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage:
        """Make one request and return its reply, within ``timeout`` (``default_timeout`` for `USE_CLIENT_DEFAULT`).

        Waits its turn first. Late replies of earlier calls are dropped.

        Args:
            encode: Encodes the request (`Encoder`).
            payload: What it encodes besides the codec and the request id.
            timeout: The call's own timeout, in seconds (``None``: no limit).
            default_timeout: The client's, for `USE_CLIENT_DEFAULT`.
            codec: Encodes and decodes instead of the channel's own codec.

        Returns:
            The reply, as the codec decodes it (an error frame is raised, never returned).

        Raises:
            ClientStateError: The channel is closed.
            EncodingError: The request cannot be encoded.
            TimeoutError: No reply within the timeout (the channel survives,
                unless the send itself stuck: then the transport is closed).
            ServerError: The reply is an error frame (a subclass per code).
            ConnectionClosed: The channel closed or broke.
            ProtocolError: The frame is not a reply, or answers no request.
            ReplyValidationError: The reply does not fit the client's types.
        """
        if timeout is USE_CLIENT_DEFAULT:
            timeout = default_timeout
        async with self.lock:
            codec, frame, request_id = self.prepare(encode, payload, codec)
            if timeout is None:
                await self.send(codec, frame, request_id)
                return await self.receive_reply(codec, request_id)
            watchdog = self.watchdog
            deadline = self._clock.now() + timeout
            if watchdog is None:  # a client without an owner: a timer of the clock's per call
                scope = self._clock.cancel_scope(deadline=deadline)
            else:
                scope = anyio.CancelScope()
                if timeout <= 0:
                    scope.cancel()
                watchdog.arm(scope, deadline)
            try:
                with scope:
                    await self.send(codec, frame, request_id, scope, deadline)
                    return await self.receive_reply(codec, request_id)
            finally:
                if watchdog is not None:
                    watchdog.disarm(scope)
            # Reached only when the deadline cancelled the exchange.
            raise TimeoutError(f"no reply within {timeout} s")

    def prepare(
        self, encode: Encoder, payload: Any, codec: ClientCodec[Any, Any, Any] | None = None
    ) -> tuple[ClientCodec[Any, Any, Any], bytes, int]:
        """Number and encode a request; call with the lock held. Returns the codec, the frame and the request id.

        Raises:
            ClientStateError: The channel is closed.
            EncodingError: The request cannot be encoded.
        """
        if not self.open:
            raise ClientStateError("the client is closed")
        if codec is None:
            codec = self.codec
        self.next_id += 1
        request_id = self.next_id
        try:
            frame = encode(codec, payload, request_id)
        except (TypeError, msgspec.EncodeError) as exc:
            raise EncodingError(f"cannot encode the request: {exc}") from exc
        except RecursionError as exc:  # msgspec's guard against nesting deeper than the stack allows
            raise EncodingError(f"cannot encode the request: it is nested too deeply ({exc})") from exc
        return codec, frame, request_id

    async def send(
        self,
        codec: ClientCodec[Any, Any, Any],
        frame: bytes,
        request_id: int,
        scope: anyio.CancelScope | None = None,
        deadline: float = math.inf,
    ) -> None:
        """Send a prepared request and note it as unanswered; call with the lock held.

        Args:
            codec: The codec it was encoded with.
            frame: The request.
            request_id: Its id.
            scope: The call's own cancel scope, armed with ``deadline``; ``None``
                for a request with no deadline of its own.
            deadline: The call's deadline, on the channel's clock.

        Raises:
            ConnectionClosed: The channel closed or broke (or the error frame
                the server sent before closing it, if it sent one).
            TimeoutError: The deadline passed before the request went out, or
                its send stuck past its grace (the transport is then closed).
        """
        try:
            if codec.dialect.request_ids:
                # Replies name their request, so a send cut short by a cancellation
                # does no harm: a request that never went out gets no reply, and is
                # skipped when a later one's reply arrives.
                self.unanswered.append(request_id)
                await self.transport.send(frame)
            elif scope is None:
                # Replies are matched by order alone, so a cancellation must not leave
                # it unknown whether the frame went out: shield the send.
                with anyio.CancelScope(shield=True):
                    await self.transport.send(frame)
                self.unanswered.append(request_id)
            else:
                await self._send_within_grace(frame, scope, deadline)
                self.unanswered.append(request_id)
        except ConnectionClosed as exc:
            await self.raise_parting_error(codec, exc)

    async def _send_within_grace(self, frame: bytes, scope: anyio.CancelScope, deadline: float) -> None:
        """Send a plain OpenEnv request whole, in the call's ``scope``, shielded from cancellation outside it.

        Replies are matched by order alone, so a cancellation must not leave it
        unknown whether the frame went out. A deadline that has passed sends
        nothing; one that passes while the frame goes out must not cut it short
        (the channel would be lost), so the send gets at least `SEND_GRACE`
        seconds: only a stuck channel runs out of it, and closes the client.
        """
        clock = self._clock
        now = clock.now()
        if now >= deadline:
            raise TimeoutError("the timeout elapsed before the request was sent")
        watchdog = self.watchdog
        scope.shield = True
        if watchdog is not None:
            watchdog.arm(scope, max(deadline, now + SEND_GRACE))
        elif clock is EVENT_LOOP_CLOCK:
            scope.deadline = max(deadline, now + SEND_GRACE)
        try:
            await self.transport.send(frame)
        except anyio.get_cancelled_exc_class():
            if not scope.cancel_called:  # not the grace running out: someone else's cancellation
                raise
            self.open = False
            with anyio.CancelScope(shield=True):
                await self.transport.aclose()
            raise TimeoutError("timed out sending the request; the client is closed") from None
        scope.shield = False
        if clock.now() >= deadline:
            # Passed while the frame went out: cancel now, not whenever the watchdog runs next.
            scope.cancel()
        elif watchdog is not None:
            watchdog.arm(scope, deadline)
        elif clock is EVENT_LOOP_CLOCK:
            scope.deadline = deadline

    def owner_of(self, reply_id: int | None) -> int:
        """Which request a reply answers, and forget it (and any skipped request) as unanswered.

        Args:
            reply_id: The id the reply names; ``None`` where order alone decides.

        Raises:
            ProtocolError: The reply answers no request sent.
        """
        unanswered = self.unanswered
        if not unanswered:
            raise ProtocolError("the server sent a reply to no request")
        if reply_id is None:
            return unanswered.popleft()  # plain OpenEnv, or an id-less fatal error: order decides
        if reply_id not in unanswered:
            raise ProtocolError(f"the server sent a reply to an unknown request id {reply_id}")
        # Replies come in order: older requests still listed were never sent.
        while unanswered[0] != reply_id:
            unanswered.popleft()
        return unanswered.popleft()

    async def receive_reply(
        self, codec: ClientCodec[Any, Any, Any], request_id: int
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage:
        """Wait for the reply to ``request_id`` (see `reply_in`), dropping late ones."""
        while True:
            reply = self.reply_in(codec, await self.transport.receive(), request_id)
            if reply is not None:
                return reply

    def reply_in(
        self, codec: ClientCodec[Any, Any, Any], frame: bytes, request_id: int
    ) -> ObservationReply[ObsT] | StateReply[StateT] | MCPMessage | None:
        """The reply to ``request_id`` in ``frame``, or ``None`` for a late reply to an earlier request (dropped).

        Raises:
            ServerError: The reply is an error frame (a subclass per code); a
                late one too, when it is fatal.
            ProtocolError: The frame is not a reply, or answers no request.
            ReplyValidationError: The reply does not fit the client's types.
        """
        use_ids = codec.dialect.request_ids
        try:
            reply = codec.decode_reply(frame)
        except (ProtocolError, ReplyValidationError):
            # A late reply for a call that gave up is dropped even if malformed.
            if self.owner_of(codec.reply_id(frame) if use_ids else None) != request_id:
                return None
            raise
        if self.owner_of(reply.id if use_ids else None) != request_id:
            _drop_late_reply(reply)
            return None
        if isinstance(reply, ErrorReply):
            raise server_error_from_frame(reply.data)
        return reply

    async def raise_parting_error(self, codec: ClientCodec[Any, Any, Any], closed: ConnectionClosed) -> NoReturn:
        """Raise the reason a server gave before closing (``CAPACITY_REACHED``, ...), if any; else ``closed``."""
        # Transports hand out frames that arrived before the close; read what is left.
        with self._clock.move_on_after(PARTING_FRAME_WAIT):
            while True:
                try:
                    frame = await self.transport.receive()
                    reply = codec.decode_reply(frame)
                except OpenEnvError:
                    break
                if isinstance(reply, ErrorReply):
                    raise server_error_from_frame(reply.data) from closed
        raise closed

    async def close(self) -> None:
        """End the session: tell the server (best effort, bounded), then close the transport. Once.

        Call it shielded: it is bounded on the event loop's time, whatever the
        client's clock, so that it ends by itself.
        """
        if not self.open:
            return
        self.open = False
        # Best effort: the server may be gone already.
        with anyio.move_on_after(CLOSE_FRAME_TIMEOUT), contextlib.suppress(OpenEnvError):
            await self.transport.send(self.codec.close())
        await self.transport.aclose()


def _drop_late_reply(reply: ObservationReply[Any] | StateReply[Any] | ErrorReply | MCPMessage) -> None:
    """Drop the reply of a call that timed out or was cancelled; unless it is fatal."""
    if isinstance(reply, ErrorReply):
        error = server_error_from_frame(reply.data)
        if error.fatal:
            raise error

"""How an `openenv.EnvPool` exchanges one batch of requests with its sessions: the three ways, one deadline.

A pool step costs little more than its steps. It runs no task per session:

- Sessions whose transports share a host or link that steps them together
  (`openenv._batch`) are stepped as one message each way, per host.
- The others' requests are sent one after the other (frames to one server
  then leave together, as one message on a shared connection), then their
  replies are collected in order; replies that came together are taken
  without waiting.
- A session whose transport's `send` may wait on the server
  (`openenv.Transport.send_waits`) makes its request in a task of its own.

Each session's requests go through its client's `openenv._requests.RequestChannel`:
the same lock, numbering and reply matching as the client's own calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, Generic, Literal

import anyio
import msgspec

from ._batch import BatchedReply, LinkStepBatcher, StepBatcher
from ._client import EnvClient
from ._clock import Clock
from ._codec import ClientCodec
from ._exceptions import ConnectionClosed, OpenEnvError, ProtocolError, TimeoutError, server_error_from_frame
from ._limits import USE_CLIENT_DEFAULT, UseClientDefault
from ._messages import StateReply
from ._request_lock import RequestLock
from ._requests import Encoder, RequestChannel, encode_reset, encode_state, encode_step
from ._results import StepResults
from ._transport import Transport
from ._types import ActT, ObsT, StateT

__all__ = [
    "LINK_BATCH",
    "STATE",
    "BatchExchange",
    "Outcome",
    "Pending",
    "PooledSession",
    "Request",
    "reset_request",
    "step_request",
    "step_requests",
]

LINK_BATCH = 128
"""The most steps a pool sends in one entry on a link; a bigger batch leaves in parts, one after the other."""

Kind = Literal["reset", "step", "state"]

Request = tuple[Kind, dict[str, Any], Encoder, Any]
"""What a request of a batch is: its kind and the reset's arguments (what `openenv.EnvPool`'s policies
read of it), its encoder, and what the encoder takes besides the codec and the request id (the step's
action, stepped with others of its host as one message: `openenv._batch`; the reset's arguments)."""

_NO_ARGUMENTS: dict[str, Any] = {}  # a step's reset arguments: shared, so never changed

STATE: Request = ("state", _NO_ARGUMENTS, encode_state, None)
"""The request for a session's state."""


def reset_request(arguments: dict[str, Any]) -> Request:
    """The request to reset a session with the environment's keyword ``arguments``."""
    return ("reset", arguments, encode_reset, arguments)


def step_request(action: Any) -> Request:
    """The request to step a session on ``action``."""
    return ("step", _NO_ARGUMENTS, encode_step, action)


def step_requests(actions: Sequence[Any]) -> dict[int, Request]:
    """A step request per action, by index: made without a call per session."""
    return dict(enumerate(zip(repeat("step"), repeat(_NO_ARGUMENTS), repeat(encode_step), actions)))


class PooledSession(Generic[ActT, ObsT, StateT]):
    """One of a pool's live sessions: its client (connected) and its requests, its server, where its episode stands.

    Args:
        url: Its server's URL.
        client: Its client, connected.
        requests: The client's request channel.

    Attributes:
        url: Its server's URL.
        client: Its client.
        requests: The client's request channel, which the pool drives.
        keeper: The cancel scope of its transport's idle work, run by the pool.
        fresh: No request has succeeded yet (a ``CAPACITY_REACHED`` refusal is still possible).
        done: The last result ended an episode.
        pending: A request sent by `openenv.EnvPool.send`, its reply not yet taken.
    """

    __slots__ = ("client", "done", "fresh", "keeper", "pending", "requests", "url")

    def __init__(
        self, url: str, client: EnvClient[ActT, ObsT, StateT], requests: RequestChannel[ActT, ObsT, StateT]
    ) -> None:
        self.url = url
        self.client = client
        self.requests = requests
        self.keeper = anyio.CancelScope()
        self.fresh = True
        self.done = False
        self.pending: Pending | None = None


class Pending:
    """A request sent and not yet answered: its kind, its id, and the reset's arguments.

    Attributes:
        kind: ``"reset"``, ``"step"`` or ``"state"``.
        request_id: Its id on its session's channel.
        reset_arguments: A reset's arguments (empty for the others).
    """

    __slots__ = ("kind", "request_id", "reset_arguments")

    def __init__(self, kind: Kind, request_id: int, reset_arguments: dict[str, Any]) -> None:
        self.kind = kind
        self.request_id = request_id
        self.reset_arguments = reset_arguments


class Outcome:
    """What came of a batch: each session's result, or its error.

    Attributes:
        ready: The results, by session index.
        errors: The errors, by session index.
    """

    __slots__ = ("errors", "ready")

    def __init__(self) -> None:
        self.ready: dict[int, Any] = {}
        self.errors: dict[int, Exception] = {}

    def __len__(self) -> int:
        return len(self.ready) + len(self.errors)

    def __contains__(self, index: object) -> bool:
        return index in self.ready or index in self.errors

    def update(self, other: Outcome) -> None:
        """Take in another outcome's results and errors."""
        self.ready.update(other.ready)
        self.errors.update(other.errors)


class _Batch:
    """The sessions of one host whose steps go together: their indices in the pool, and their channels (held)."""

    __slots__ = ("channels", "indices")

    def __init__(self) -> None:
        self.indices: list[int] = []
        self.channels: list[RequestChannel[Any, Any, Any]] = []


_PAYLOAD = itemgetter(3)  # a request's action (or reset arguments)
_TRANSPORT = attrgetter("transport")  # a channel's
_LOCK = attrgetter("lock")  # a channel's


class BatchExchange(Generic[ActT, ObsT, StateT]):
    """Exchanges batches of requests with a pool's sessions (see the module's docstring).

    Args:
        sessions: The pool's sessions, by index: the pool's own list, which it
            fills when it opens and changes in place when it replaces one.
        clock: Where the deadlines are measured.
    """

    def __init__(self, sessions: list[PooledSession[ActT, ObsT, StateT]], clock: Clock) -> None:
        self._sessions = sessions
        self._clock = clock

    def timeout_of(self, timeout: float | UseClientDefault | None) -> float | None:
        """The seconds a call's ``timeout`` stands for: the clients' own for `USE_CLIENT_DEFAULT`."""
        if timeout is USE_CLIENT_DEFAULT:
            return self._sessions[0].client.timeout if self._sessions else None
        return timeout

    def deadline(self, timeout: float | UseClientDefault | None) -> float:
        """A call's deadline on the clock, for its ``timeout``."""
        seconds = self.timeout_of(timeout)
        return math.inf if seconds is None else self._clock.now() + seconds

    async def exchange(self, requests: dict[int, Request], timeout: float | UseClientDefault | None) -> Outcome:
        """Send every request, then take the replies in order; one deadline for them all.

        Args:
            requests: Each session's request, by index.
            timeout: The call's timeout (`USE_CLIENT_DEFAULT`: the clients').

        Returns:
            Each session's result (a step's or reset's `openenv.StepResult`, a
            state) or error; a session whose reply did not come in time has a
            `TimeoutError`, and its reply is dropped when it comes.
        """
        outcome = Outcome()
        deadline = self.deadline(timeout)
        with self._clock.cancel_scope(deadline=deadline):
            alone = await self._step_together(requests, outcome)
            waiting = [index for index in alone if self._sessions[index].requests.transport.send_waits]
            if waiting:
                async with anyio.create_task_group() as apart:
                    for index in waiting:
                        apart.start_soon(self._exchange_one, index, alone[index], outcome)
                    await self._exchange_together(alone, outcome, set(waiting))
            else:
                await self._exchange_together(alone, outcome, set())
        if len(outcome) < len(requests):
            # Time ran out: the replies that came meanwhile still count; the others are late.
            sent = [index for index in requests if index not in outcome]
            await self.sweep(sent, outcome)
            for index in sent:
                if index not in outcome:
                    outcome.errors[index] = TimeoutError(f"no reply within {self.timeout_of(timeout)} s")
                    self.abandon(index)
        return outcome

    async def _step_together(self, requests: dict[int, Request], outcome: Outcome) -> dict[int, Request]:
        """Step the sessions that share a host as one message per host; the requests left to go on their own.

        A session joins its host's batch only while its client is free (the
        caller may use a pool's client directly): the pool takes the clients
        as it groups them, and holds them until every host's batch is over, as
        a request of their own would hold them.
        """
        hosts: dict[tuple[StepBatcher | LinkStepBatcher, ClientCodec[Any, Any, Any]], _Batch] = {}
        sessions = self._sessions
        batch = _Batch()  # the batch of the session before (mostly this one's): a first, empty one
        last_batcher: object = None
        last_codec: object = None
        try:
            for index, request in requests.items():
                if request[0] != "step":
                    continue
                channel = sessions[index].requests
                lock = channel.lock
                if lock.held:  # in use: the caller uses the client directly right now
                    continue
                batcher = channel.step_batcher()
                if batcher is None:
                    continue
                lock.held = True  # `RequestLock.acquire_nowait`, without its call: one per session
                codec = channel.codec
                if batcher is not last_batcher or codec is not last_codec:
                    found = hosts.get((batcher, codec))
                    batch = hosts[batcher, codec] = _Batch() if found is None else found
                    last_batcher, last_codec = batcher, codec
                batch.indices.append(index)
                batch.channels.append(channel)
            alone = requests
            for (batcher, codec), batch in hosts.items():
                if len(batch.indices) > 1:
                    if isinstance(batcher, LinkStepBatcher):
                        answered = await self._step_linked(batcher, codec, batch, requests, outcome)
                    else:
                        answered = await self._step_batch(batcher, codec, batch, requests, outcome)
                    if len(answered) == len(alone):  # no session is in two batches: these were all that were left
                        alone = {}
                    elif answered:
                        if alone is requests:
                            alone = dict(requests)
                        for index in answered:
                            del alone[index]
            return alone
        finally:
            for held in hosts.values():
                RequestLock.release_all(map(_LOCK, held.channels))  # taken above

    async def _step_batch(
        self,
        batcher: StepBatcher,
        codec: ClientCodec[Any, Any, Any],
        batch: _Batch,
        requests: dict[int, Request],
        outcome: Outcome,
    ) -> list[int]:
        """Step one host's sessions as one message; the sessions answered."""
        indices, channels = batch.indices, batch.channels
        try:
            message = codec.step_batch(list(map(_PAYLOAD, map(requests.__getitem__, indices))))
        except (TypeError, msgspec.EncodeError):
            return []  # each request, on its own, says whose action cannot be encoded
        reply = await batcher.step(list(map(_TRANSPORT, channels)), message)
        if reply is None:
            return []
        # The clients of a batch share their types (and so their codec): the first's results serve all.
        return _take_replies(codec, reply, indices, None, channels[0].results, outcome)

    async def _step_linked(
        self,
        batcher: LinkStepBatcher,
        codec: ClientCodec[Any, Any, Any],
        batch: _Batch,
        requests: dict[int, Request],
        outcome: Outcome,
    ) -> list[int]:
        """Step one link's sessions with one entry each way; the sessions answered.

        Each step is numbered as its session's own request would be: a reply
        that comes as a frame of its own (the server stepped it apart, or sent
        it again after a resumption) is taken as such, and a late one (of a
        call given up on) is dropped by its request id.
        """
        indices, channels = batch.indices, batch.channels
        request_ids = []
        for channel in channels:
            channel.next_id += 1
            request_ids.append(channel.next_id)
        transports: list[Transport] = list(map(_TRANSPORT, channels))
        sent = 0
        # In parts, each leaving at once: the server steps the first while the pool encodes the next.
        while sent < len(indices):
            part = slice(sent, sent + LINK_BATCH)
            try:
                message = codec.step_batch(list(map(_PAYLOAD, map(requests.__getitem__, indices[part]))))
            except (TypeError, msgspec.EncodeError):
                break  # each request, on its own, says whose action cannot be encoded
            if not batcher.post(transports[part], message, request_ids[part]):
                break
            for channel, request_id in zip(channels[part], request_ids[part], strict=True):
                channel.unanswered.append(request_id)
            sent += len(request_ids[part])
        answered = indices[:sent]  # the rest go on their own
        # The replies that came batched, by the message they came in: each message is decoded once.
        batched: dict[int, tuple[bytes | msgspec.Raw, list[int], list[int]]] = {}
        last_message: object = None  # the message of the reply before, mostly this one's too
        positions: list[int] = []  # their places in it
        places: list[int] = []  # and the sessions' indices
        ready, errors = outcome.ready, outcome.errors
        try:
            # Shortest first: the steps posted (``answered``) are the first of the others.
            for index, channel, request_id, transport in zip(answered, channels, request_ids, transports, strict=False):
                try:
                    while True:
                        try:
                            reply = batcher.receive_nowait(transport)
                        except anyio.WouldBlock:
                            reply = await batcher.receive(transport)
                        if type(reply) is BatchedReply:
                            reply_id, unanswered = reply.request_id, channel.unanswered
                            if unanswered and unanswered[0] == reply_id == request_id:
                                unanswered.popleft()  # `owner_of`'s usual case, without its call: one per session
                            elif channel.owner_of(reply_id) != request_id:
                                continue  # the reply of a batch given up on
                            if reply.message is not last_message:
                                last_message = reply.message
                                _, positions, places = batched.setdefault(id(last_message), (last_message, [], []))
                            positions.append(reply.position)
                            places.append(index)
                            break
                        answer = channel.reply_in(codec, reply, request_id)  # type: ignore[arg-type]
                        if answer is not None:
                            ready[index] = channel.results.of_reply(answer)
                            break
                except OpenEnvError as exc:
                    errors[index] = exc
        finally:  # even when time ran out: the replies taken already count
            results = channels[0].results  # the clients of a batch share their types
            for message, in_message, at in batched.values():
                _take_replies(codec, message, at, in_message, results, outcome)
        return answered

    async def _exchange_together(self, requests: dict[int, Request], outcome: Outcome, apart: set[int]) -> None:
        """Send the requests of the sessions not in ``apart`` one after the other, then take their replies."""
        for index, request in requests.items():
            if index in apart:
                continue
            try:
                await self.send(index, request)
            except OpenEnvError as exc:
                outcome.errors[index] = exc
        errors = outcome.errors  # nothing is ready yet: the replies are taken here, in order
        for index in requests:
            if index not in apart and index not in errors:
                self._take(index, await self._reply(index), outcome)

    async def _exchange_one(self, index: int, request: Request, outcome: Outcome) -> None:
        """One session's request and reply, in a task of its own."""
        try:
            await self.send(index, request)
        except OpenEnvError as exc:
            outcome.errors[index] = exc
            return
        self._take(index, await self._reply(index), outcome)

    async def send(self, index: int, request: Request) -> None:
        """Send one session's request (it leaves with the others to its server); note it as pending.

        Raises:
            ClientStateError: The session's client is closed.
            EncodingError: The request cannot be encoded.
            ConnectionClosed: The channel closed or broke (or the server's
                parting error, ``CAPACITY_REACHED`` say).
        """
        kind, reset_arguments, encode, payload = request
        session = self._sessions[index]
        channel = session.requests
        lock = channel.lock
        try:
            lock.acquire_nowait()  # free, unless the caller uses the client directly right now
        except anyio.WouldBlock:
            await lock.acquire()
        try:
            codec, frame, request_id = channel.prepare(encode, payload)
            try:
                channel.transport.send_nowait(frame)  # queued: it leaves with the others' frames
            except anyio.WouldBlock:
                await channel.send(codec, frame, request_id)
            except ConnectionClosed as exc:  # the server said why first, perhaps (CAPACITY_REACHED)
                await channel.raise_parting_error(codec, exc)
            else:
                channel.unanswered.append(request_id)
        except BaseException:
            lock.release()
            raise
        session.pending = Pending(kind, request_id, reset_arguments)

    async def _reply(self, index: int) -> Any:
        """Wait for one session's reply (taken at once if it came already); its error as a value."""
        session = self._sessions[index]
        pending = session.pending
        assert pending is not None
        channel = session.requests
        transport, codec, request_id = channel.transport, channel.codec, pending.request_id
        try:
            while True:
                try:
                    frame = transport.receive_nowait()
                except anyio.WouldBlock:
                    frame = await transport.receive()
                reply = channel.reply_in(codec, frame, request_id)
                if reply is not None:
                    return reply
        except OpenEnvError as exc:
            return exc

    def _take(self, index: int, reply: Any, outcome: Outcome) -> None:
        """Turn a session's reply into its result (or error), and let its client go."""
        session = self._sessions[index]
        pending = session.pending
        if pending is None:
            return
        self.abandon(index)
        if isinstance(reply, Exception):
            outcome.errors[index] = reply
            return
        try:
            if pending.kind == "state":
                if not isinstance(reply, StateReply):
                    raise ProtocolError(f"expected a state reply, got {type(reply).__name__}")
                outcome.ready[index] = reply.data
            else:
                outcome.ready[index] = session.requests.results.of_reply(reply)
        except OpenEnvError as exc:
            outcome.errors[index] = exc

    async def sweep(self, indices: Sequence[int], outcome: Outcome) -> None:
        """Take the replies of the sessions at ``indices`` already there, without waiting for any."""
        with anyio.CancelScope() as nothing_more:
            nothing_more.cancel()  # a transport without receive_nowait is asked once, and waits for nothing
            for index in indices:
                if index in outcome or self._sessions[index].pending is None:
                    continue
                try:
                    reply = await self._reply(index)
                except anyio.get_cancelled_exc_class():
                    continue
                self._take(index, reply, outcome)

    def abandon(self, index: int) -> None:
        """Stop waiting for a session's reply (a late one is dropped when it comes); let its client go."""
        session = self._sessions[index]
        if session.pending is not None:
            session.pending = None
            session.requests.lock.release()

    async def wait_for_some(self, indices: Sequence[int], wanted: int, outcome: Outcome, deadline: float) -> None:
        """Wait until ``wanted`` of the sessions at ``indices`` have answered (a task per session still thinking)."""
        enough = anyio.Event()
        with self._clock.cancel_scope(deadline=deadline):
            async with anyio.create_task_group() as waiting:

                async def wait_one(index: int) -> None:
                    reply = await self._reply(index)
                    self._take(index, reply, outcome)
                    if len(outcome) >= wanted:
                        enough.set()

                for index in indices:
                    if index not in outcome:
                        waiting.start_soon(wait_one, index)
                await enough.wait()
                waiting.cancel_scope.cancel()


def _take_replies(
    codec: ClientCodec[Any, Any, Any],
    message: bytes | msgspec.Raw,
    indices: list[int],
    positions: list[int] | None,
    results: StepResults[Any],
    outcome: Outcome,
) -> list[int]:
    """Turn the replies in one batch's message into the results of the sessions at ``indices``; those answered.

    ``positions`` are the sessions' places in the message; ``None``: the batch's
    order, from the first. There, a place with no reply was not stepped, and
    its request goes on its own; a place the server named must hold a reply.
    """
    try:
        replies, invalid = codec.decode_step_batch(message)
    except ProtocolError as exc:
        for index in indices:
            outcome.errors[index] = exc
        return indices
    observations, errors = replies.observations, replies.errors
    if not errors and not invalid:
        taken: list[Any] | None
        if positions is None:
            taken = observations if len(observations) == len(indices) else None
        else:
            try:
                taken = list(map(observations.__getitem__, positions))
            except IndexError:
                taken = None  # a place the message lacks: said below
        made = None if taken is None else results.of_batch(taken)
        if made is not None:
            outcome.ready.update(zip(indices, made, strict=True))
            return indices
    in_order = positions is None
    places: Sequence[int] = range(min(len(observations), len(indices))) if positions is None else positions
    ready = outcome.ready
    answered: list[int] = []
    for position, index in zip(places, indices, strict=False):
        observation = observations[position] if position < len(observations) else None
        if observation is not None:
            ready[index] = results.of_batched(observation)
        elif position in errors:
            outcome.errors[index] = server_error_from_frame(errors[position])
        elif position in invalid:
            outcome.errors[index] = invalid[position]
        elif in_order:
            continue  # not stepped: its request goes on its own
        else:
            outcome.errors[index] = ProtocolError("the server sent no reply in its place of a batch")
        answered.append(index)
    return answered

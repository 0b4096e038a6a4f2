"""Stepping many sessions of one host as one message: what an `EnvPool` asks of a transport that can.

A pool step over per-session frames costs several times the steps it carries:
each session's request and reply is encoded, queued, handed over and decoded
on its own. Sessions whose environments live behind one host (in-process, in
this event loop) can be stepped together instead: the pool encodes all their
actions as one message, the host decodes them in one call, steps each session
in the batch's order and answers with one message (`StepBatchReply`), which
the pool decodes in one call.

Sessions that share a link to a server that takes batches are stepped
together too (`LinkStepBatcher`): the pool encodes their actions as one array,
which travels in one entry (``steps`` in ``docs/protocol.md``), and the server
answers those it steps together in one entry; each step is still numbered on
its session's channel, so a resumed link sends it again on its own.

This is openenv's own protocol between its pool and its own transports, beside
the `openenv.Transport` contract and not part of it: a transport that batches
also implements `StepBatching`, whose one method offers its batcher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

if TYPE_CHECKING:
    from ._transport import Transport

__all__ = ["BatchedReply", "LinkStepBatcher", "StepBatcher", "StepBatching"]


class StepBatcher(ABC):
    """Steps the sessions of many transports of one host as one message.

    Transports whose `StepBatching.step_batcher` returns the same batcher can be
    stepped together. Each session's step is the request it would have sent on
    its own, in the same order with its other requests: a batcher is offered
    only while its session has none waiting or running.
    """

    @abstractmethod
    async def step(self, transports: Sequence[Transport], message: bytes) -> bytes | None:
        """Step each transport's session on its action, in order; answer with one message.

        Args:
            transports: The sessions' transports, each of which offered this batcher.
            message: Their actions, in the same order (`openenv._codec.ClientCodec.step_batch`).

        Returns:
            The replies (`openenv._messages.StepBatchReply`); a position with no
            reply was not stepped, and its request goes on its own. ``None``:
            nothing was stepped (the actions do not fit as they are), and every
            request goes on its own.
        """


class BatchedReply(msgspec.Struct, gc=False):
    """A step's reply that came with others' in one message (``stepped``): the message, and its place there.

    A Struct, made in one call (one per session per step), and not tracked by
    the garbage collector: it refers to nothing that could refer back to it.

    Attributes:
        message: The replies, as one message (`openenv._messages.StepBatchReply`).
        position: This reply's place in it.
        request_id: The request it answers.
    """

    message: bytes | msgspec.Raw
    position: int
    request_id: int


class LinkStepBatcher(ABC):
    """Sends one step in each of many sessions of one link as one entry; takes their replies, batched or not.

    Transports whose `StepBatching.step_batcher` returns the same batcher can be
    stepped together. A batcher is offered only while its session's channel is
    open; the client numbers each step as it numbers its other requests.
    """

    @abstractmethod
    def post(self, transports: Sequence[Transport], actions: bytes, request_ids: Sequence[int]) -> bool:
        """Post one step in each transport's session (it leaves with the link's next message).

        Args:
            transports: The sessions' transports, each of which offered this batcher.
            actions: Their actions, as one message (`openenv._codec.ClientCodec.step_batch`).
            request_ids: Each step's request id, in the same order.

        Returns:
            Whether the steps were posted; ``False``: none was (the entry would not
            fit, or the link is not open), and each request goes on its own.
        """

    @abstractmethod
    def receive_nowait(self, transport: Transport) -> bytes | BatchedReply:
        """The next reply of a session that came already: a frame of its own, or its place in a batch.

        Raises:
            anyio.WouldBlock: None came yet.
            ConnectionClosed: The session has ended.
            ProtocolError: The server broke the protocol.
        """

    @abstractmethod
    async def receive(self, transport: Transport) -> bytes | BatchedReply:
        """The next reply of a session, once it comes (see `receive_nowait`)."""


@runtime_checkable
class StepBatching(Protocol):
    """A transport that can step its session together with others of its host or link.

    Found once per connected client (`openenv._requests.RequestChannel`), by
    ``isinstance``; a transport without it has each request go on its own.
    """

    def step_batcher(self) -> StepBatcher | LinkStepBatcher | None:
        """What steps this session with others now, as one message; ``None``: nothing, for now.

        Asked before each step a pool would batch: a session offers its
        batcher only while it has no request waiting or running, or while its
        channel is open (see each batcher).
        """

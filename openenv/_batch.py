"""Stepping many sessions of one host as one message: what an `EnvPool` asks of a transport that can.

A pool step over per-session frames costs several times the steps it carries:
each session's request and reply is encoded, queued, handed over and decoded
on its own. Sessions whose environments live behind one host (in-process, in
this event loop) can be stepped together instead: the pool encodes all their
actions as one message, the host decodes them in one call, steps each session
in the batch's order and answers with one message (`StepBatchReply`), which
the pool decodes in one call.

This is openenv's own protocol between its pool and its own transports, not part
of the `openenv.Transport` contract: a transport offers it through
``Transport._step_batcher``, which by default offers nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._transport import Transport

__all__ = ["StepBatcher"]


class StepBatcher(ABC):
    """Steps the sessions of many transports of one host as one message.

    Transports whose `Transport._step_batcher` returns the same batcher can be
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

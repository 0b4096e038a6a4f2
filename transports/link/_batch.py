"""A pool's steps over a link, client side: one ``steps`` entry for many sessions, each step still its channel's.

`openenv.EnvPool` steps the sessions that share a link together when the
server's `Hello` says it ``batches`` (`transports.link._envelope.Steps`): their
actions, encoded as one array by the pool, travel in one entry, and the server
answers those it steps together in one entry (`transports.link._envelope.Stepped`),
which the pool decodes in one call. Each step is numbered on its session's
channel as a frame of its own would be, and kept until the server acknowledges
it, as what makes the frame (`HeldStep`): after a dropped connection it is sent
again as that frame, on its own, and its reply comes again as an ordinary frame.

The batcher takes what it needs of the link through `SteppingLink`, which the
WebSocket client's link (`transports.websocket._link.Link`) satisfies.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from openenv import Transport
from openenv._batch import BatchedReply, LinkStepBatcher
from transports.link._client import LinkChannel
from transports.link._envelope import ENTRY_OVERHEAD, EnvelopeCodec, StepItem, Steps, fits
from transports.link._state import ClientLinkState

__all__ = ["HeldStep", "LinkBatcher", "SteppingLink"]


class SteppingLink(Protocol):
    """What `LinkBatcher` needs of the link whose sessions it steps together."""

    @property
    def server_limit(self) -> int | None:
        """The largest message the server takes (its `Hello` says), or ``None``."""
        ...

    def steps_state(self) -> ClientLinkState | None:
        """The link's numbering, where a ``steps`` entry is posted; ``None`` while none may be (ended, broken)."""
        ...

    def write_without_waiting(self) -> None:
        """Send the posted entries, as much as the connection takes at once; the rest leaves with the next write."""
        ...

    def receive_step_nowait(self, channel: LinkChannel) -> bytes | BatchedReply:
        """A frame the session holds already, or a reply of its that came in a batch (`anyio.WouldBlock`: none)."""
        ...

    async def receive_step(self, channel: LinkChannel) -> bytes | BatchedReply:
        """The session's next frame, or its reply that came in a batch."""
        ...


class _SentSteps:
    """The actions of one ``steps`` entry, as sent: split into each step's only if a step is sent again."""

    __slots__ = ("_actions", "_envelope", "_split")

    def __init__(self, actions: bytes, envelope: EnvelopeCodec) -> None:
        self._actions = actions
        self._envelope = envelope
        self._split: list[msgspec.Raw] | None = None

    def frame(self, position: int, request_id: int) -> msgspec.Raw:
        """The step at ``position`` as a frame of its own."""
        split = self._split
        if split is None:
            split = self._split = self._envelope.split_actions(self._actions)
        return self._envelope.step_frame(split[position], request_id)


class HeldStep(msgspec.Struct, gc=False):
    """A step that went out in a ``steps`` entry, kept until acknowledged (`transports.link._state.Held`).

    A Struct, made in one call (one per session per step), and not tracked by
    the garbage collector: what it refers to never refers back to it.
    """

    _sent: _SentSteps
    _position: int
    _request_id: int

    def frame(self) -> msgspec.Raw:
        """The step as a frame of its own: what its session would have sent."""
        return self._sent.frame(self._position, self._request_id)


class LinkBatcher(LinkStepBatcher):
    """Steps the sessions of one WebSocket link as one entry (see the module's docstring).

    Its sessions' transports are WebSocket transports, or transports that carry
    their frames on one and show its ``link_channel`` (`transports.ray.RayTransport`).

    Args:
        link: The link.
    """

    __slots__ = ("_link",)

    def __init__(self, link: SteppingLink) -> None:
        self._link = link

    def post(self, transports: Sequence[Transport], actions: bytes, request_ids: Sequence[int]) -> bool:
        """Post one step in each session, as one ``steps`` entry; see `LinkStepBatcher.post`."""
        link = self._link
        state = link.steps_state()
        if state is None:
            return False
        # Each step's four numbers (up to 19 digits each) and their punctuation: two entries' overhead at most.
        if not fits(len(actions) + 2 * ENTRY_OVERHEAD * len(transports), link.server_limit):
            return False
        numbers = []
        channels = state.channels
        for transport in transports:
            channel = transport.link_channel  # type: ignore[attr-defined]
            channel_state = None if channel is None or channel.ended is not None else channels.get(channel.number)
            if channel_state is None:
                return False  # ended meanwhile: its own request says so
            numbers.append(channel_state)
        sent = _SentSteps(actions, state.codec)
        post_held = state.post_held
        items: list[StepItem] = [
            post_held(channel_state, HeldStep(sent, position, request_id), request_id)
            for position, (channel_state, request_id) in enumerate(zip(numbers, request_ids, strict=True))
        ]
        state.post_steps(Steps(channels=items, actions=msgspec.Raw(actions)))
        link.write_without_waiting()  # the server starts on them while the pool waits
        return True

    def receive_nowait(self, transport: Transport) -> bytes | BatchedReply:
        """A reply of the session that came already; see `LinkStepBatcher.receive_nowait`."""
        channel = transport.link_channel  # type: ignore[attr-defined]
        frames = channel.frames
        if frames:  # `ClientLink.receive_step_nowait`'s first case, inline: called once per session per step
            return frames.popleft()  # type: ignore[no-any-return]
        return self._link.receive_step_nowait(channel)

    async def receive(self, transport: Transport) -> bytes | BatchedReply:
        """The next reply of the session; see `LinkStepBatcher.receive`."""
        channel = transport.link_channel  # type: ignore[attr-defined]
        return await self._link.receive_step(channel)

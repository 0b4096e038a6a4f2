"""The benchmark environments: the small echo of ``tests.envs``, and one whose every observation is 1 MiB of bytes.

The echo environments (action ``{message}``, observation ``{echoed_message}``)
are those of the interop tests, re-exported so that the benchmarks name one
module. `BlobEnv` answers every step with `BLOB`: 1 MiB of incompressible
bytes, standing for a camera frame or a rendered screen (a 256x256x3 uint8
image is 192 KiB; this is five of them). In JSON, msgspec writes ``bytes`` as a
base64 string (4/3 of the size); msgpack carries them as they are.
"""

from __future__ import annotations

import random

from openenv import Observation, State
from openenv.server import Environment
from tests.envs import AsyncMessageEchoEnv, MessageAction, MessageEchoEnv, MessageObservation

__all__ = [
    "BLOB",
    "BLOB_SIZE",
    "AsyncMessageEchoEnv",
    "BlobEnv",
    "BlobObservation",
    "MessageAction",
    "MessageEchoEnv",
    "MessageObservation",
    "UnboundMessageEchoEnv",
]


class UnboundMessageEchoEnv(MessageEchoEnv):
    """The plain echo without thread affinity: a batch's steps may share a thread."""

    thread_affinity = False


BLOB_SIZE = 2**20
# Random, so that permessage-deflate (which both clients offer) cannot shrink it
# below what base64 itself costs; seeded, so that every run sends the same bytes.
BLOB = random.Random(0).randbytes(BLOB_SIZE)


class BlobObservation(Observation):
    """An observation carrying raw bytes: ``data`` is `BLOB`."""

    data: bytes = b""


class BlobEnv(Environment[MessageAction, BlobObservation, State]):
    """Answers every step, whatever the action, with `BLOB`; coroutines, so no worker thread."""

    def __init__(self) -> None:
        self._state = State()

    async def reset(self, seed: int | None = None, episode_id: str | None = None) -> BlobObservation:
        self._state = State(episode_id=episode_id or "generated", step_count=0)
        return BlobObservation(reward=0.0, done=False)

    async def step(self, action: MessageAction) -> BlobObservation:
        self._state.step_count += 1
        return BlobObservation(data=BLOB, reward=1.0, done=False)

    @property
    def state(self) -> State:
        return self._state

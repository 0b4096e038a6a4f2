"""`StepResults`: the `StepResult` of each step's reply, one by one or a batch's at once, for one observation type."""

from __future__ import annotations

import functools
from operator import attrgetter
from typing import Any, Generic, get_origin

import msgspec

from ._codec import lift_observation_fields
from ._exceptions import ProtocolError
from ._messages import ObservationData, ObservationReply
from ._types import ObsT, StepResult

__all__ = ["StepResults", "results_at_once"]

_REWARD, _DONE, _METADATA = attrgetter("reward"), attrgetter("done"), attrgetter("metadata")


def _own_metadata(observation: Any) -> dict[str, Any]:
    """The ``metadata`` an observation carries itself (a Struct's field, a dict's key), or an empty dict."""
    metadata = observation.get("metadata") if isinstance(observation, dict) else getattr(observation, "metadata", None)
    return metadata if isinstance(metadata, dict) else {}


@functools.lru_cache(maxsize=256)
def results_at_once(observation_type: Any) -> bool:
    """Whether each observation of this type makes its result in C (`StepResults.of_batch`).

    So it does for a Struct whose ``reward``, ``done`` and ``metadata`` are
    fields, ``metadata`` always a dict (as `openenv.Observation`'s): its result
    is then the one `StepResults.of_batched` makes.

    Args:
        observation_type: A type msgspec decodes into (so one it can hash).
    """
    try:
        fields = {field.name: field.type for field in msgspec.structs.fields(observation_type)}
    except TypeError:  # not a Struct (a dict, a union)
        return False
    metadata = fields.get("metadata")
    return "reward" in fields and "done" in fields and (metadata is dict or get_origin(metadata) is dict)


class StepResults(Generic[ObsT]):
    """Makes the results of the replies to a client's steps, for its observation type.

    Args:
        observation_type: The type its observations are decoded into; one msgspec takes.

    Attributes:
        at_once: Whether a batch's results are made in C (`results_at_once`).
    """

    __slots__ = ("_frozen", "_struct", "at_once")

    def __init__(self, observation_type: Any) -> None:
        config = getattr(observation_type, "__struct_config__", None)
        self._struct = config is not None
        self._frozen = bool(config and config.frozen)
        self.at_once = results_at_once(observation_type)

    def of_reply(self, reply: Any) -> StepResult[ObsT]:
        """The result of a step's (or a reset's) reply.

        Raises:
            ProtocolError: The reply is not an observation reply.
        """
        if not isinstance(reply, ObservationReply):
            raise ProtocolError(f"expected an observation reply, got {type(reply).__name__}")
        return self.of_data(reply.data)

    def of_batched(self, observation: Any) -> StepResult[ObsT]:
        """The result of a step of a batch, whose observation came whole (`openenv._messages.StepBatchReply`)."""
        if isinstance(observation, msgspec.Struct):  # a union's member too: reward and done came in it
            fields: Any = observation
            metadata = getattr(observation, "metadata", None)  # `_own_metadata`'s, without its call: one per step
            return StepResult(observation, fields.reward, fields.done, metadata if isinstance(metadata, dict) else {})  # type: ignore[arg-type]
        return self.of_data(ObservationData(*lift_observation_fields(observation)))

    def of_batch(self, observations: list[Any]) -> list[StepResult[ObsT]] | None:
        """The results of a batch's steps, made at once in C when every observation came whole; else ``None``.

        Each is the result `of_batched` makes, for an observation type that
        allows it (`at_once`).
        """
        if not self.at_once:
            return None
        try:
            rewards, dones = map(_REWARD, observations), map(_DONE, observations)
            return list(map(StepResult, observations, rewards, dones, map(_METADATA, observations)))
        except AttributeError:  # a step not taken (``None`` in its place): each is looked at alone
            return None

    def of_data(self, data: ObservationData[Any]) -> StepResult[ObsT]:
        """The result an observation reply's data makes: reward and done set on a Struct observation too."""
        observation = data.observation
        if self._struct:
            if self._frozen:
                observation = msgspec.structs.replace(observation, reward=data.reward, done=data.done)
            else:
                observation.reward = data.reward
                observation.done = data.done
        metadata = data.metadata
        if metadata is msgspec.UNSET:  # an older server, or none to send: the observation's own, if any
            metadata = _own_metadata(observation)
        return StepResult(observation, data.reward, data.done, metadata)

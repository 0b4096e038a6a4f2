"""The base types of an environment's actions, observations and states."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec

__all__ = ["Action", "ActT", "ObsT", "Observation", "State", "StateT", "StepResult"]


class Action(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base class of an environment's actions.

    Subclass it with the action's fields (a msgspec Struct: keyword-only, typed,
    validated on decoding). On the wire a step's ``data`` is the action's fields
    themselves; unknown fields are rejected, as OpenEnv does. Like OpenEnv's
    ``Action``, every action has a free-form ``metadata`` dict, so an OpenEnv
    client that sends its action whole (``metadata`` included) is understood.

    Examples:
        ```python
        import msgspec

        import openenv


        class MoveAction(openenv.Action):
            direction: str
            distance: int = 1


        action = MoveAction(direction="north")
        print(msgspec.json.encode(action))  # b'{"direction":"north","distance":1,"metadata":{}}'
        ```

    Attributes:
        metadata: Free-form data about the action, as in OpenEnv.
    """

    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class Observation(msgspec.Struct, kw_only=True):
    """Base class of an environment's observations.

    Subclass it with the observation's fields. On the wire ``done`` and
    ``reward`` travel at the top of the reply's ``data``, beside the other fields,
    which travel under ``observation``; the client sets them back on the
    observation it decodes, and also returns them in the `StepResult`.

    Examples:
        ```python
        import openenv


        class GridObservation(openenv.Observation):
            position: tuple[int, int] = (0, 0)


        observation = GridObservation(position=(2, 3), reward=1.0)
        print(observation.position, observation.reward, observation.done)  # (2, 3) 1.0 False
        ```

    Attributes:
        done: Whether the episode has ended.
        reward: The reward of the last step, if any: a number (kept as the
            server sent it, ``int`` or ``float``), a bool, or ``None``, as
            OpenEnv's ``Observation`` allows.
        metadata: Free-form data about the observation. It travels inside the
            observation and, when not empty, also beside it (as OpenEnv 0.10
            sends it); the client also gives it as `StepResult.metadata`.
    """

    done: bool = False
    reward: bool | int | float | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


class State(msgspec.Struct, kw_only=True):
    """Base class of an environment's state.

    Use it as it is, or subclass it with more fields; `EnvClient.state` returns it.

    Attributes:
        episode_id: The id of the current episode, if one was given or made.
        step_count: The number of steps taken in the current episode.
    """

    episode_id: str | None = None
    step_count: int = 0


ActT = TypeVar("ActT")
"""The action type of an `EnvClient` or an `Environment`."""
ObsT = TypeVar("ObsT")
"""The observation type of an `EnvClient` or an `Environment`."""
StateT = TypeVar("StateT")
"""The state type of an `EnvClient` or an `Environment`."""


class StepResult(msgspec.Struct, Generic[ObsT], frozen=True):
    """What `EnvClient.reset` and `EnvClient.step` return.

    It is frozen. ``reward``, ``done`` and ``metadata`` are the ones the server
    sent beside the observation; a typed observation carries them too.

    Attributes:
        observation: The observation, of the client's observation type (a dict for
            an untyped client).
        reward: The reward the server reported, of the type it had on the wire
            (``int``, ``float`` or ``bool``), or ``None``.
        done: Whether the episode has ended.
        metadata: The observation's metadata: what the server sent beside the
            observation, else the observation's own ``metadata``; empty when the
            server sent none (OpenEnv's client gives ``None`` then).
    """

    observation: ObsT
    reward: bool | int | float | None = None
    done: bool = False
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)

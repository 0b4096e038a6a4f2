"""The grid world's action, observation and state: upstream OpenEnv's pydantic types."""

from typing import Literal

from pydantic import Field

from openenv.core.env_server.types import Action, Observation, State


class GridAction(Action):
    """Move on the grid; ``"raise"`` makes the environment fail."""

    direction: Literal["up", "down", "left", "right", "raise"]
    steps: int = Field(default=1, ge=1, le=5)


class GridObservation(Observation):
    """Where the agent is, and what it was told."""

    position: list[int] = Field(default_factory=lambda: [0, 0])
    message: str = ""


class GridState(State):
    """The episode, and the goal the agent looks for."""

    goal: list[int] = Field(default_factory=lambda: [2, 2])
    position: list[int] = Field(default_factory=lambda: [0, 0])

"""Upstream OpenEnv's ``openenv.core.rubrics.trajectory``: rewards known only once the episode ends.

A trajectory rubric keeps each step's action and observation, gives an intermediate
reward until an observation says ``done``, then scores the whole episode; it can also
spread that score back over the steps (`TrajectoryRubric.compute_step_rewards`).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from openenv.core.rubrics.base import Rubric

__all__ = ["ExponentialDiscountingTrajectoryRubric", "TrajectoryRubric"]


class TrajectoryRubric(Rubric):
    """Scores an episode once it ends; `intermediate_reward` before that.

    Args:
        intermediate_reward: The reward of each step before the last.

    Attributes:
        intermediate_reward: The reward of each step before the last.
    """

    def __init__(self, intermediate_reward: float = 0.0) -> None:
        super().__init__()
        self.intermediate_reward = intermediate_reward
        self._trajectory: list[tuple[Any, Any]] = []

    def forward(self, action: Any, observation: Any) -> float:
        """Keep the step; the episode's score if it ended here, else the intermediate reward."""
        self._trajectory.append((action, observation))
        if getattr(observation, "done", False):
            return self.score_trajectory(self._trajectory)
        return self.intermediate_reward

    @abstractmethod
    def score_trajectory(self, trajectory: list[tuple[Any, Any]]) -> float:
        """The whole episode's score, from its ``(action, observation)`` pairs."""

    @abstractmethod
    def compute_step_rewards(self) -> list[float]:
        """Each step's share of the episode's score."""

    def reset(self) -> None:
        """Forget the episode."""
        self._trajectory = []

    @property
    def trajectory(self) -> list[tuple[Any, Any]]:
        """The episode's ``(action, observation)`` pairs so far (a copy)."""
        return list(self._trajectory)

    def state_dict(self) -> dict[str, Any]:
        """The settings: ``intermediate_reward``."""
        return {"intermediate_reward": self.intermediate_reward}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``intermediate_reward``, if given."""
        if "intermediate_reward" in state:
            self.intermediate_reward = state["intermediate_reward"]


class ExponentialDiscountingTrajectoryRubric(TrajectoryRubric):
    """A trajectory rubric whose step rewards discount the final score by ``gamma`` per step back.

    Args:
        gamma: The discount, between 0 and 1.
        intermediate_reward: The reward of each step before the last.

    Raises:
        ValueError: ``gamma`` outside ``[0, 1]``.
    """

    def __init__(self, gamma: float = 0.99, intermediate_reward: float = 0.0) -> None:
        super().__init__(intermediate_reward=intermediate_reward)
        if not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {gamma}")
        self.gamma = gamma

    def compute_step_rewards(self) -> list[float]:
        """Step ``t`` of ``T`` gets ``score * gamma ** (T - 1 - t)``; the last step the whole score."""
        if not self._trajectory:
            return []
        score = self.score_trajectory(self._trajectory)
        last = len(self._trajectory) - 1
        return [score * self.gamma ** (last - step) for step in range(last + 1)]

    def state_dict(self) -> dict[str, Any]:
        """The settings: ``intermediate_reward`` and ``gamma``."""
        return {**super().state_dict(), "gamma": self.gamma}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the settings given."""
        super().load_state_dict(state)
        if "gamma" in state:
            self.gamma = state["gamma"]

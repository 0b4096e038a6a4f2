"""Upstream OpenEnv's ``openenv.core.client_types``: what a client's ``step`` and ``reset`` give back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["StateT", "StepResult"]

ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")


@dataclass
class StepResult(Generic[ObsT]):
    """One reply to ``reset`` or ``step``, as an upstream client's ``_parse_result`` builds it.

    Attributes:
        observation: The observation, of the client's type.
        reward: The step's reward, if any.
        done: Whether the episode has ended.
        metadata: The observation's metadata, as the server sent it beside the observation.
    """

    observation: ObsT
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = None

"""Upstream OpenEnv's ``openenv.core.env_server.base_transforms``: transforms that combine or do nothing."""

from __future__ import annotations

from collections.abc import Iterable

from openenv.core.env_server.interfaces import Transform
from openenv.core.env_server.types import Observation

__all__ = ["CompositeTransform", "NullTransform"]


class CompositeTransform(Transform[Observation]):
    """Several transforms, applied in order.

    Args:
        transforms: The transforms, first applied first.
    """

    def __init__(self, transforms: Iterable[Transform[Observation]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, observation: Observation) -> Observation:
        """The observation through every transform in turn."""
        for transform in self.transforms:
            observation = transform(observation)
        return observation


class NullTransform(Transform[Observation]):
    """Leaves observations as they are."""

    def __call__(self, observation: Observation) -> Observation:
        """The observation itself."""
        return observation

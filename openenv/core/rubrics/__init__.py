"""Upstream OpenEnv's ``openenv.core.rubrics`` (its RFC 004): rewards computed by composable rubrics.

Offered: `Rubric` and the trajectory rubrics. Upstream's containers (``Sequential``,
``Gate``, ``WeightedSum``, ``RubricList``, ``RubricDict``) and ``LLMJudge`` are not
offered yet.
"""

from openenv.core.rubrics.base import Rubric
from openenv.core.rubrics.trajectory import ExponentialDiscountingTrajectoryRubric, TrajectoryRubric

__all__ = ["ExponentialDiscountingTrajectoryRubric", "Rubric", "TrajectoryRubric"]

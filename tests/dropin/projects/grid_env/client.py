"""The grid world's client, as an environment package's ``client.py`` writes one: upstream's three hooks."""

from typing import Any

from grid_env.models import GridAction, GridObservation, GridState
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient


class GridEnv(EnvClient[GridAction, GridObservation, GridState]):
    """Walks the grid world of a server."""

    def _step_payload(self, action: GridAction) -> dict[str, Any]:
        return action.model_dump()

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[GridObservation]:
        observation = GridObservation(
            **payload.get("observation", {}), done=payload.get("done", False), reward=payload.get("reward")
        )
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> GridState:
        return GridState(**payload)

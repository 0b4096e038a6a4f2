"""Upstream OpenEnv's ``openenv.core.generic_client``: a client of any environment, in plain dicts."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

__all__ = ["GenericAction", "GenericEnvClient"]


class GenericEnvClient(EnvClient[dict[str, Any], dict[str, Any], dict[str, Any]]):
    """A client that needs no environment package: actions, observations and states are dicts.

    Examples:
        ```python
        from openenv.core import GenericEnvClient

        with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
            result = env.reset()
            result = env.step({"direction": "up"})
            print(result.observation["position"])
        ```
    """

    def _step_payload(self, action: Any) -> dict[str, Any]:
        """The action as a dict: a dict as it is, a pydantic model dumped, another object's attributes."""
        if isinstance(action, dict):
            return action
        if hasattr(action, "model_dump"):
            return action.model_dump()  # type: ignore[no-any-return]
        if hasattr(action, "__dict__"):
            return dict(vars(action))
        return dict(action)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[dict[str, Any]]:
        """The reply's data as a result: its observation a dict."""
        return StepResult(
            observation=payload.get("observation", {}),
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The state's data, as it came."""
        return payload


class GenericAction(dict[str, Any]):
    """A dict that says it is an action for a `GenericEnvClient` (``GenericAction(direction="up")``)."""

"""Upstream OpenEnv's ``openenv.core.env_server.serialization``: actions in from JSON, observations out to it."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation

__all__ = ["deserialize_action", "serialize_observation"]


def deserialize_action(action_data: dict[str, Any], action_cls: type[Action]) -> Action:
    """Validate an action's JSON data into the environment's action class.

    A ``list_tools`` or ``call_tool`` action is read as the MCP action of that
    name when the environment declares the `Action` base class itself or an MCP
    action class, as upstream's server does.

    Args:
        action_data: The action, as it came in a step request.
        action_cls: The environment's declared action class.

    Returns:
        The action.

    Raises:
        pydantic.ValidationError: The data does not fit the class.
    """
    from openenv.core.env_server.mcp_types import MCP_ACTION_TYPES  # a cycle at import time otherwise

    mcp_cls = MCP_ACTION_TYPES.get(action_data.get("type"))  # type: ignore[arg-type]
    if mcp_cls is not None and (action_cls is Action or action_cls in MCP_ACTION_TYPES.values()):
        return mcp_cls.model_validate(action_data)
    return action_cls.model_validate(action_data)


def serialize_observation(observation: Observation) -> dict[str, Any]:
    """The reply data of an observation, as upstream 0.10's server sends it.

    Args:
        observation: The observation.

    Returns:
        ``observation`` (its fields but ``reward`` and ``done``, in JSON's types),
        ``reward``, ``done``, and ``metadata`` when the observation has any (it
        is inside ``observation`` too).
    """
    data: dict[str, Any] = {
        "observation": observation.model_dump(mode="json", exclude={"reward", "done"}),
        "reward": observation.reward,
        "done": observation.done,
    }
    if observation.metadata:
        data["metadata"] = observation.metadata
    return data

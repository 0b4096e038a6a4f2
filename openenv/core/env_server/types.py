"""The pydantic models of upstream OpenEnv's ``openenv.core.env_server.types``: actions, observations, states.

Environment packages written against upstream subclass `Action`, `Observation` and
`State`; the server validates actions into the declared `Action` subclass and
serializes observations as upstream 0.10 does (`serialization.serialize_observation`).
Field names, defaults, validation and JSON Schemas are upstream's, so ``GET /schema``
and every reply read the same on either server.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_DESCRIPTIONS: dict[type[BaseModel], str] = {}
"""The ``description`` each of upstream's base classes has in a JSON Schema, in upstream's words.

pydantic publishes a class's docstring there (``GET /schema``), and clients may compare
schemas; these classes' docstrings are written for this project, so their published
description is upstream's, set by `published_description`. A subclass keeps its own.
"""


def published_description(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Give one of upstream's base classes its upstream description in a JSON Schema (pydantic's hook)."""
    words = SCHEMA_DESCRIPTIONS.get(model)
    if words is not None:
        schema["description"] = words


__all__ = [
    "Action",
    "BaseMessage",
    "CodeExecResult",
    "ConcurrencyConfig",
    "EnvironmentMetadata",
    "SCHEMA_DESCRIPTIONS",
    "HealthStatus",
    "Observation",
    "ServerMode",
    "State",
    "WSErrorCode",
    "published_description",
]


class ServerMode(str, Enum):  # noqa: UP042 - upstream's: str() names the member, as a StrEnum's would not
    """Which routes a server offers: ``simulation`` adds the stateless ``/reset``, ``/step`` and ``/state``."""

    SIMULATION = "simulation"
    PRODUCTION = "production"


class HealthStatus(str, Enum):  # noqa: UP042 - upstream's: str() names the member, as a StrEnum's would not
    """What ``GET /health`` says of a server."""

    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DEGRADED = "degraded"


class WSErrorCode(str, Enum):  # noqa: UP042 - upstream's: str() names the member, as a StrEnum's would not
    """The codes of OpenEnv's error frames (``{"type": "error", "data": {"code": ...}}``)."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


class Action(BaseModel):
    """The base class of an environment's actions: unknown fields are refused, assignments validated.

    Attributes:
        metadata: Free-form data that travels with the action.
    """

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        arbitrary_types_allowed=True,
        json_schema_extra=published_description,
    )

    metadata: dict[str, Any] = Field(default_factory=dict, description="Additional metadata for the action")


class Observation(BaseModel):
    """The base class of an environment's observations.

    Attributes:
        done: Whether the episode has ended.
        reward: The reward of the step that led here, if any.
        metadata: Free-form data; it travels inside the observation and beside it.
    """

    model_config = ConfigDict(
        extra="forbid",
        validate_assignment=True,
        arbitrary_types_allowed=True,
        json_schema_extra=published_description,
    )

    done: bool = Field(default=False, description="Whether the episode has terminated")
    reward: bool | int | float | None = Field(default=None, description="Reward signal from the last action")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Additional metadata for the observation")


class BaseMessage(BaseModel):
    """The base class of upstream's small messages: unknown fields refused, assignments validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, json_schema_extra=published_description)


class State(BaseModel):
    """The base class of an environment's state; subclasses and instances may carry more fields.

    Attributes:
        episode_id: The current episode's id, if the environment names episodes.
        step_count: Steps taken in the current episode.
    """

    model_config = ConfigDict(
        extra="allow",
        validate_assignment=True,
        arbitrary_types_allowed=True,
        json_schema_extra=published_description,
    )

    episode_id: str | None = Field(default=None, description="Unique identifier for the current episode")
    step_count: int = Field(default=0, ge=0, description="Number of steps taken in the current episode")


class CodeExecResult(BaseMessage):
    """What running a piece of code gave: its output streams and exit code."""

    stdout: str = Field(description="Standard output from code execution")
    stderr: str = Field(description="Standard error from code execution")
    exit_code: int = Field(description="Exit code from code execution")


class EnvironmentMetadata(BaseMessage):
    """What ``GET /metadata`` tells about an environment (`interfaces.Environment.get_metadata`)."""

    name: str = Field(description="Name of the environment")
    description: str = Field(description="Description of what the environment does")
    readme_content: str | None = Field(default=None, description="Content of the README file for the environment")
    version: str | None = Field(default=None, description="Version of the environment")
    author: str | None = Field(default=None, description="Author of the environment")
    documentation_url: str | None = Field(default=None, description="URL to the environment's documentation")


class ConcurrencyConfig(BaseMessage):
    """How many sessions a server holds at once (`http_server.create_app`'s ``concurrency_config``).

    Attributes:
        max_concurrent_envs: The most sessions at once.
        session_timeout: Seconds a session may stay idle before it is ended (``None``: no limit).
    """

    max_concurrent_envs: int = Field(
        default=1, ge=1, description="Maximum number of concurrent WebSocket sessions allowed"
    )
    session_timeout: float | None = Field(
        default=None, gt=0, description="Timeout in seconds for inactive sessions. None means no timeout."
    )


SCHEMA_DESCRIPTIONS.update(
    {
        Action: "Base class for all environment actions.\n\nAll action subclasses should inherit from this base "
        "class.\nUses Pydantic for automatic validation and serialization.",
        Observation: "Base class for all environment observations.\n\nAll observation subclasses should inherit from "
        "this base class.\nUses Pydantic for automatic validation and serialization.",
        State: "Base class for environment state.\n\n"
        "Represents internal environment state, separate from observations.",
        BaseMessage: "Base class for WebSocket messages with shared configuration.",
        EnvironmentMetadata: "Metadata about an environment for documentation and UI purposes.",
        CodeExecResult: "Result of code execution containing stdout, stderr, and exit code.",
        ConcurrencyConfig: "Configuration for concurrent environment sessions.",
    }
)

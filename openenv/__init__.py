"""openenv: a typed, async client framework for agentic and RL environments.

One `EnvClient` talks to an environment server over any `Transport`
(WebSocket, HTTP long-polling or in-process) and behaves the same over each;
an `EnvPool` steps many sessions at once.
"""

import logging as _logging
from pathlib import Path as _Path

from . import _coexistence
from ._client import EnvClient, SyncEnvClient
from ._clock import EVENT_LOOP_CLOCK, Clock
from ._config import ServerConfig
from ._environment import Environment, EnvironmentMetadata
from ._exceptions import (
    AuthenticationError,
    CapacityReachedError,
    ClientStateError,
    ConnectError,
    ConnectionClosed,
    EncodingError,
    EnvPoolError,
    ExecutionError,
    FactoryError,
    InvalidJSONError,
    MCPError,
    OpenEnvError,
    ProtocolError,
    ReplyValidationError,
    ServerError,
    SessionError,
    TimeoutError,
    ToolCallError,
    TransportError,
    UnknownTypeError,
    UnsupportedSchemeError,
    ValidationError,
)
from ._limits import USE_CLIENT_DEFAULT
from ._mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
)
from ._messages import Dialect
from ._pool import AutoResetMode, EnvPool, FinalStepResult, ReplacedStepResult, SyncEnvPool
from ._registry import ENTRY_POINT_GROUP, create_transport, register_transport, registered_schemes
from ._serve import serve
from ._tools import MCPEnvironment, tool
from ._transport import Transport
from ._types import Action, Observation, State, StepResult

# A library logs, the application decides where to: with no handler, Python's last-resort
# one would print an in-process environment's traceback to stderr even when the caller
# catches the error. `openenv serve` sets up its own console handler.
_logging.getLogger("openenv").addHandler(_logging.NullHandler())

__version__ = "0.1.0"
"""The version of this openenv package."""

_DISTRIBUTION = _coexistence.DISTRIBUTION  # whose package this is: upstream OpenEnv's is imported as openenv too
_coexistence.warn_if_mixed(_Path(__file__).parent)

__all__ = [
    "ENTRY_POINT_GROUP",
    "EVENT_LOOP_CLOCK",
    "USE_CLIENT_DEFAULT",
    "Action",
    "AuthenticationError",
    "AutoResetMode",
    "CallToolAction",
    "CallToolObservation",
    "CapacityReachedError",
    "ClientStateError",
    "Clock",
    "ConnectError",
    "ConnectionClosed",
    "Dialect",
    "EncodingError",
    "EnvClient",
    "EnvPool",
    "EnvPoolError",
    "Environment",
    "EnvironmentMetadata",
    "ExecutionError",
    "FactoryError",
    "FinalStepResult",
    "InvalidJSONError",
    "ListToolsAction",
    "ListToolsObservation",
    "MCPEnvironment",
    "MCPError",
    "Observation",
    "OpenEnvError",
    "ProtocolError",
    "ReplacedStepResult",
    "ReplyValidationError",
    "ServerConfig",
    "ServerError",
    "SessionError",
    "State",
    "StepResult",
    "SyncEnvClient",
    "SyncEnvPool",
    "TimeoutError",
    "Tool",
    "ToolCallError",
    "ToolError",
    "Transport",
    "TransportError",
    "UnknownTypeError",
    "UnsupportedSchemeError",
    "ValidationError",
    "__version__",
    "create_transport",
    "register_transport",
    "registered_schemes",
    "serve",
    "tool",
]

_UPSTREAM_FACTORIES = {"AutoEnv", "AutoAction"}
"""Upstream's ``openenv.AutoEnv`` and ``openenv.AutoAction``: imported on first use (`openenv.auto`)."""


def __getattr__(name: str) -> object:
    if name in _UPSTREAM_FACTORIES:
        from openenv import auto

        return getattr(auto, name)
    raise AttributeError(f"module 'openenv' has no attribute {name!r}")

"""Upstream OpenEnv's ``openenv.core.env_server``: what an environment package's server imports.

Offered so far: the types, the `Environment` interface, ``MCPEnvironment`` (with the
``mcp`` extra: FastMCP), transforms, serialization, the MCP tool types, the server's
exceptions, and `create_app`. Upstream's web interface and its JSON-RPC models are not
offered yet (``docs/migrating.md`` lists what differs).
"""

from openenv.core.env_server.base_transforms import CompositeTransform, NullTransform
from openenv.core.env_server.exceptions import (
    ConcurrencyConfigurationError,
    EnvironmentFactoryError,
    OpenEnvError,
    SessionCapacityError,
    SessionCreationError,
    SessionNotFoundError,
)
from openenv.core.env_server.http_server import HTTPEnvServer, create_app, create_fastapi_app
from openenv.core.env_server.interfaces import Environment, Message, ModelTokenizer, TaskProvider, Transform

try:  # FastMCP is the mcp extra's: without it, MCPEnvironment is None, as upstream's is
    from openenv.core.env_server.mcp_environment import MCPEnvironment
except ModuleNotFoundError:
    MCPEnvironment = None  # type: ignore[assignment, misc]
from openenv.core.env_server.mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
    ToolErrorType,
)
from openenv.core.env_server.serialization import deserialize_action, serialize_observation
from openenv.core.env_server.types import (
    Action,
    BaseMessage,
    CodeExecResult,
    ConcurrencyConfig,
    EnvironmentMetadata,
    HealthStatus,
    Observation,
    ServerMode,
    State,
    WSErrorCode,
)

__all__ = [
    "RESERVED_TOOL_NAMES",
    "Action",
    "BaseMessage",
    "CallToolAction",
    "CallToolObservation",
    "CodeExecResult",
    "CompositeTransform",
    "ConcurrencyConfig",
    "ConcurrencyConfigurationError",
    "Environment",
    "EnvironmentFactoryError",
    "EnvironmentMetadata",
    "HTTPEnvServer",
    "HealthStatus",
    "ListToolsAction",
    "ListToolsObservation",
    "MCPEnvironment",
    "Message",
    "ModelTokenizer",
    "NullTransform",
    "Observation",
    "OpenEnvError",
    "ServerMode",
    "SessionCapacityError",
    "SessionCreationError",
    "SessionNotFoundError",
    "State",
    "TaskProvider",
    "Tool",
    "ToolError",
    "ToolErrorType",
    "Transform",
    "WSErrorCode",
    "create_app",
    "create_fastapi_app",
    "deserialize_action",
    "serialize_observation",
]

"""The I/O-free server side, for the authors of transports and servers.

A transport's server endpoint accepts a connection, then runs `host_session`
with two callables (receive a frame, send a frame); everything OpenEnv-specific
happens in `ServerSession`.
"""

from ._codec import RequestError
from ._config import SERVER_DEFAULTS, LogLevel, ServerConfig, ServerName, ServerOptions, server_config
from ._environment import Environment, EnvironmentMetadata
from ._loading import check_factory, load_factory, served_factory
from ._schemas import environment_metadata, environment_schemas
from ._serve import SERVER_ENTRY_POINT_GROUP, AppFunction, RunningServer, ServeFunction, build_app
from ._session import (
    ServerSession,
    SessionMetrics,
    encode_fatal_error,
    factory_error_message,
    factory_failed_frame,
    factory_name,
    host_session,
    serve_frames,
)
from ._tools import MCPEnvironment, jsonrpc_error, mcp_unsupported, tool
from ._unions import StructUnionDecoder, struct_union_members
from ._worker import abandoned_calls

__all__ = [
    "SERVER_DEFAULTS",
    "SERVER_ENTRY_POINT_GROUP",
    "AppFunction",
    "Environment",
    "EnvironmentMetadata",
    "LogLevel",
    "MCPEnvironment",
    "RequestError",
    "RunningServer",
    "ServeFunction",
    "ServerConfig",
    "ServerName",
    "ServerOptions",
    "ServerSession",
    "SessionMetrics",
    "StructUnionDecoder",
    "abandoned_calls",
    "build_app",
    "check_factory",
    "encode_fatal_error",
    "environment_metadata",
    "environment_schemas",
    "factory_error_message",
    "factory_failed_frame",
    "factory_name",
    "host_session",
    "jsonrpc_error",
    "load_factory",
    "mcp_unsupported",
    "serve_frames",
    "served_factory",
    "server_config",
    "struct_union_members",
    "tool",
]

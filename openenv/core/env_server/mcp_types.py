"""Upstream OpenEnv's ``openenv.core.env_server.mcp_types``: the actions and observations of MCP tool environments.

Upstream's JSON-RPC models of this module (``JsonRpcRequest`` and its kin) are not
offered yet: environment packages do not import them.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openenv.core.env_server.types import SCHEMA_DESCRIPTIONS, Action, Observation, published_description

__all__ = [
    "MCP_ACTION_TYPES",
    "RESERVED_TOOL_NAMES",
    "CallToolAction",
    "CallToolObservation",
    "ListToolsAction",
    "ListToolsObservation",
    "Tool",
    "ToolError",
    "ToolErrorType",
]

RESERVED_TOOL_NAMES = frozenset(["reset", "step", "state", "close"])
"""Names no tool may take: they are the environment's own calls."""


class Tool(BaseModel):
    """A tool an MCP environment offers, as ``tools/list`` describes it."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=published_description)

    name: str = Field(description="Unique identifier for the tool")
    description: str = Field(description="Human-readable description of what the tool does")
    input_schema: dict[str, Any] = Field(description="JSON Schema for the tool's input parameters")


class ToolErrorType(str, Enum):  # noqa: UP042 - upstream's: str() names the member, as a StrEnum's would not
    """Types of errors that can occur during tool execution."""  # upstream's words: /schema publishes them

    EXECUTION_ERROR = "execution_error"
    INVALID_ARGS = "invalid_args"
    TRANSPORT_ERROR = "transport_error"
    TOOL_NOT_FOUND = "tool_not_found"
    TIMEOUT = "timeout"


class ToolError(BaseModel):
    """A tool call's failure outside the tool (an error the tool returns is its result)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=published_description)

    error_type: ToolErrorType = Field(description="Category of the error")
    message: str = Field(description="Human-readable error message")


class ListToolsAction(Action):
    """Ask for the tools the environment offers."""

    type: Literal["list_tools"] = Field(default="list_tools", description="Action type discriminator")


class CallToolAction(Action):
    """Call one tool with arguments."""

    type: Literal["call_tool"] = Field(default="call_tool", description="Action type discriminator")
    tool_name: str = Field(description="Name of the tool to call")
    arguments: dict[str, Any] = Field(default_factory=dict, description="Arguments to pass to the tool")


class ListToolsObservation(Observation):
    """The tools the environment offers."""

    tools: list[Tool] = Field(description="List of available tools with their schemas")


class CallToolObservation(Observation):
    """What a tool call gave: its result, or the error that stopped it."""

    tool_name: str = Field(description="Name of the tool that was called")
    result: Any = Field(default=None, description="Tool-specific result (may include tool errors)")
    error: ToolError | None = Field(default=None, description="Transport/framework error if call failed")


MCP_ACTION_TYPES: dict[str, type[Action]] = {"list_tools": ListToolsAction, "call_tool": CallToolAction}
"""The MCP actions by their ``type``: a step's data with one of these is read as that action."""

SCHEMA_DESCRIPTIONS.update(
    {
        Tool: "Strongly typed MCP tool specification.\n\nFollows the MCP ToolSpec format for tool discovery.\n"
        "See: https://modelcontextprotocol.io/specification/2025-06-18/server/tools",
        ToolError: "Structured error for tool execution failures.\n\nThis is used for transport/framework errors, NOT "
        "for errors returned\nby the tool itself (those go in the result field).",
        ListToolsAction: "Request list of available tools from the environment.\n\nThis action triggers MCP's "
        "tools/list operation and returns\nall available tools with their schemas. Does NOT require reset()\nto be "
        "called first.",
        CallToolAction: "Call a specific tool via MCP.\n\nThis action triggers MCP's tools/call operation with the\n"
        "specified tool name and arguments.",
        ListToolsObservation: "Response containing available tools.\n\nReturned when processing a ListToolsAction.",
        CallToolObservation: "Response from tool execution.\n\nContains the tool's result or an error if the call "
        "failed.\nTool-specific errors (from the tool itself) are included in the result.\nTransport/framework errors "
        "use the error field.",
    }
)

"""The actions and observations of MCP tool environments, as OpenEnv defines them.

A tool environment takes two actions beside its own: `ListToolsAction` (which
tools are there) and `CallToolAction` (run one). They travel as ordinary step
frames, told apart by their ``type`` field, and are answered by a
`ListToolsObservation` or a `CallToolObservation`:

```text
{"type": "step", "data": {"type": "list_tools"}}
{"type": "step", "data": {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hi"}}}
```
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ._types import Action, Observation

__all__ = [
    "RESERVED_TOOL_NAMES",
    "CallToolAction",
    "CallToolObservation",
    "ListToolsAction",
    "ListToolsObservation",
    "Tool",
    "ToolError",
]

RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})
"""Names no tool may take: they are the environment's own requests."""


class Tool(msgspec.Struct, kw_only=True):
    """One tool an environment offers, as `EnvClient.list_tools` returns it.

    Attributes:
        name: What to call it by.
        description: What it does.
        input_schema: The JSON Schema of its arguments (an object schema).
    """

    name: str
    description: str = ""
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolError(msgspec.Struct, kw_only=True):
    """Why a tool call failed, as a `CallToolObservation` carries it.

    Attributes:
        error_type: ``"tool_not_found"``, ``"invalid_args"``, ``"execution_error"``,
            ``"timeout"`` or ``"transport_error"``, as OpenEnv names them.
        message: What went wrong, for a person.
    """

    error_type: str
    message: str


class ListToolsAction(Action, kw_only=True):
    """Ask a tool environment which tools it has; no `reset` needed first.

    Attributes:
        type: Always ``"list_tools"``: tells this action from the others.
    """

    type: Literal["list_tools"] = "list_tools"


class CallToolAction(Action, kw_only=True):
    """Call one tool of a tool environment.

    Attributes:
        type: Always ``"call_tool"``: tells this action from the others.
        tool_name: The tool to call.
        arguments: Its arguments, by name.
    """

    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class ListToolsObservation(Observation, kw_only=True):
    """The answer to a `ListToolsAction`.

    Attributes:
        tools: Every tool, with its description and argument schema.
    """

    tools: list[Tool]


class CallToolObservation(Observation, kw_only=True):
    """The answer to a `CallToolAction`: the tool's result, or why it failed.

    Attributes:
        tool_name: The tool that was called.
        result: What it returned (``None`` if it failed).
        error: Why it failed, or ``None``.
    """

    tool_name: str
    result: Any = None
    error: ToolError | None = None

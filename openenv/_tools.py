"""MCP tool environments: an `Environment` whose tools are typed methods.

A method marked with `tool` becomes a tool: its name is the method's, its
description and its arguments' descriptions come from its docstring (as FastMCP
reads it), and its argument schema from the type hints (through msgspec).
Clients reach the tools three ways, as OpenEnv's do: step actions
(`ListToolsAction`, `CallToolAction`), ``mcp`` frames on the session's channel,
and ``POST /mcp`` (JSON-RPC 2.0: a fresh environment per request, or the
session a ``session_id`` names).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import operator
import typing
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

import msgspec

from ._docstrings import parse_docstring
from ._environment import Environment
from ._error_details import HIDDEN_TOOL_ERROR, error_details_shown
from ._generics import bind_type_attributes
from ._lax import lax_convert
from ._mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
)
from ._types import ActT, Observation, ObsT, StateT
from ._unions import struct_union_members
from ._worker import run_on_session_thread

__all__ = [
    "MCPEnvironment",
    "ToolSpec",
    "jsonrpc_error",
    "mcp_through_step",
    "mcp_unsupported",
    "runs_plain_steps",
    "takes_tool_actions",
    "tool",
]

logger = logging.getLogger("openenv.server")

# JSON-RPC 2.0 error codes.
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

_TOOL_MARK = "__openenv_tool__"
_FunctionT = TypeVar("_FunctionT", bound=Callable[..., Any])


def tool(function: _FunctionT) -> _FunctionT:
    """Mark a method of an `MCPEnvironment` as a tool.

    The tool takes the method's name, and its parameters (after ``self``) as
    arguments, validated against their type hints before the method runs. Its
    docstring describes it as FastMCP describes OpenEnv's tools: the prose
    before the first section (``Args:``, ``Returns:``, ...) is the tool's
    description, and each entry under ``Args:`` the description of its
    argument in the input schema (Sphinx's ``:param x:`` and NumPy's
    ``Parameters`` are read too). The method may be plain or ``async``: served,
    a plain one runs on its session's own thread, with the session's other
    plain methods (outside a server, in one of anyio's worker threads), and an
    ``async`` one is awaited on the event loop. What it returns is the tool's
    result, and must be something msgspec can encode.

    Args:
        function: The method.

    Returns:
        The same method, marked.
    """
    setattr(function, _TOOL_MARK, True)
    return function


class ToolSpec:
    """One tool of an `MCPEnvironment` class, read from its method once.

    Args:
        function: The method marked with `tool`.

    Attributes:
        name: The tool's name.
        description: Its description (the method's docstring, before its sections).
        input_schema: The JSON Schema of its arguments, each with the description its docstring gives it.
        arguments_type: The Struct its arguments are validated into.

    Raises:
        TypeError: The method takes ``*args`` or ``**kwargs``, or a hint msgspec
            cannot handle.
        ValueError: Its name is reserved (``reset``, ``step``, ``state``, ``close``).
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        self.name: str = function.__name__
        if self.name in RESERVED_TOOL_NAMES:
            raise ValueError(f"a tool may not be named {self.name!r}: {sorted(RESERVED_TOOL_NAMES)} are reserved")
        # What FastMCP tells an agent: the prose before the docstring's sections, and each argument's entry.
        self.description, argument_docs = parse_docstring(inspect.getdoc(function) or "")
        self._function = function
        self._is_async = inspect.iscoroutinefunction(function)
        hints = typing.get_type_hints(function, include_extras=True)
        fields: list[Any] = []
        parameters = list(inspect.signature(function).parameters.values())[1:]  # after self
        for parameter in parameters:
            if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise TypeError(f"tool {self.name!r}: name every argument (no *args or **kwargs)")
            hint = hints.get(parameter.name, Any)
            if parameter.default is inspect.Parameter.empty:
                fields.append((parameter.name, hint))
            else:
                fields.append((parameter.name, hint, parameter.default))
        self.arguments_type: Any = msgspec.defstruct(
            f"{self.name}_arguments", fields, kw_only=True, forbid_unknown_fields=True
        )
        self.input_schema = _object_schema(self.arguments_type)
        properties = self.input_schema.get("properties", {})
        for name, text in argument_docs.items():
            if name in properties and text:
                properties[name].setdefault("description", text)

    def describe(self) -> Tool:
        """Return the tool as `EnvClient.list_tools` shows it."""
        return Tool(name=self.name, description=self.description, input_schema=self.input_schema)

    async def call(self, env: Any, arguments: dict[str, Any]) -> Any:
        """Validate ``arguments`` and run the tool on ``env``.

        Args:
            env: The environment instance.
            arguments: The arguments, by name.

        Returns:
            What the method returned.

        Raises:
            msgspec.ValidationError: The arguments do not fit the method's hints.
            Exception: Whatever the method raises.
        """
        try:
            parsed = msgspec.convert(arguments, self.arguments_type)
        except msgspec.ValidationError:  # as FastMCP validates them: pydantic's lax conversions
            parsed = lax_convert(arguments, self.arguments_type)
        values = msgspec.structs.asdict(parsed)
        if self._is_async:
            return await self._function(env, **values)
        return await run_on_session_thread(self._function, env, **values)

    @property
    def is_async(self) -> bool:
        """Whether the method is ``async`` (awaited on the event loop) rather than plain."""
        return self._is_async


def runs_plain_steps(env: Any) -> bool:
    """Whether a step of ``env`` may run plain code of its own: a plain tool or a plain `step_other`.

    Such a tool environment, though its ``step`` is ``async``, keeps its state
    on the session's thread: the session reads ``state`` there too.

    Args:
        env: An environment.

    Returns:
        ``True`` for an `MCPEnvironment` with a plain tool or a plain
        `step_other`; ``False`` for any other environment.
    """
    if not isinstance(env, MCPEnvironment):
        return False
    plain_tools = any(not spec.is_async for spec in env.tools.values())
    step_other = type(env).step_other
    plain_step_other = step_other is not MCPEnvironment.step_other and not inspect.iscoroutinefunction(step_other)
    return plain_tools or plain_step_other


def _with_tool_actions(action_type: Any) -> Any:
    """The union of `CallToolAction`, `ListToolsAction` and any other Struct actions in ``action_type``."""
    members = struct_union_members(action_type)
    if members is None:
        is_struct = isinstance(action_type, type) and issubclass(action_type, msgspec.Struct)
        members = (action_type,) if is_struct else ()
    others = [member for member in members if member not in (CallToolAction, ListToolsAction)]
    return functools.reduce(operator.or_, others, CallToolAction | ListToolsAction)


def _object_schema(struct_type: Any) -> dict[str, Any]:
    """The JSON Schema of a Struct, inlined (its own definition at the top, others under ``$defs``)."""
    (ref,), components = msgspec.json.schema_components([struct_type], ref_template="#/$defs/{name}")
    name = ref["$ref"].rsplit("/", 1)[-1]
    schema: dict[str, Any] = components.pop(name)
    schema.pop("title", None)
    schema.setdefault("required", [])
    if components:
        schema["$defs"] = components
    return schema


def jsonrpc_error(code: int, message: str, request_id: Any = None, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC 2.0 error response, as OpenEnv's server writes one.

    Args:
        code: The JSON-RPC error code.
        message: What went wrong.
        request_id: The request's ``id``.
        data: More about the error.

    Returns:
        The response.
    """
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message, "data": data}}


def mcp_unsupported(request: Any) -> dict[str, Any]:
    """The answer to an MCP request sent to an environment without tools.

    Args:
        request: The JSON-RPC request.

    Returns:
        The error response OpenEnv's server gives: ``-32603`` for ``tools/list``
        and ``tools/call``, after checking (``-32602``) that the params are an
        object and that a call names its tool; ``-32601`` for any other method.
    """
    if not isinstance(request, dict):
        return jsonrpc_error(INVALID_REQUEST, "Invalid Request")
    request_id = request.get("id")
    problem = _check_params(request)
    if problem is not None:
        return problem
    method = request.get("method")
    if method in ("tools/list", "tools/call"):
        return jsonrpc_error(INTERNAL_ERROR, "Environment does not support MCP", request_id)
    return jsonrpc_error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)


def _check_params(request: dict[str, Any]) -> dict[str, Any] | None:
    """The ``-32602`` error of a request whose params are not an object, or of a call naming no tool."""
    request_id = request.get("id")
    params = request.get("params", {})
    if not isinstance(params, dict):
        return jsonrpc_error(INVALID_PARAMS, "Params must be an object", request_id)
    if request.get("method") == "tools/call" and not params.get("name"):
        return jsonrpc_error(INVALID_PARAMS, "Missing 'name' in params", request_id)
    return None


def takes_tool_actions(action_type: Any) -> bool:
    """Whether an environment's action type takes `CallToolAction` or `ListToolsAction` (without being a tool env).

    Args:
        action_type: The environment's ``action_type``.

    Returns:
        ``True`` if either is the type, or a member of its union.
    """
    members = struct_union_members(action_type) or (action_type,)
    return any(member in (CallToolAction, ListToolsAction) for member in members)


async def mcp_through_step(step: Callable[[Any], Awaitable[Any]], request: dict[str, Any]) -> dict[str, Any]:
    """Answer ``tools/list`` and ``tools/call`` with a step, for an environment whose actions are tool actions.

    OpenEnv's server does so for an environment whose action class is
    `CallToolAction` or `ListToolsAction` but that has no MCP server of its own.

    Args:
        step: Runs one step of the environment (as its session runs it).
        request: The JSON-RPC request.

    Returns:
        The tools the step listed, or the whole observation of the call; an
        error as `mcp_unsupported` gives one for any other method.
    """
    problem = _check_params(request)
    method = request.get("method")
    if problem is not None or method not in ("tools/list", "tools/call"):
        return problem or mcp_unsupported(request)
    request_id = request.get("id")
    params = request.get("params", {})
    if method == "tools/list":
        observation = await step(ListToolsAction())
        if isinstance(observation, ListToolsObservation):
            tools = [msgspec.to_builtins(tool) for tool in observation.tools]
            return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}
        expected = "ListToolsObservation"
    else:
        arguments = params.get("arguments") or {}
        observation = await step(CallToolAction(tool_name=params["name"], arguments=arguments))
        if isinstance(observation, CallToolObservation):
            return {"jsonrpc": "2.0", "id": request_id, "result": msgspec.to_builtins(observation)}
        expected = "CallToolObservation"
    message = f"MCP-style {method} step returned {type(observation).__name__}, expected {expected}"
    return jsonrpc_error(INTERNAL_ERROR, message, request_id)


def _tool_result(result: Any) -> dict[str, Any]:
    """A tool's result as ``tools/call`` answers it: text content, structured content and the data."""
    text = result if isinstance(result, str) else json.dumps(result)
    structured = result if isinstance(result, dict) else {"result": result}
    return {
        "content": [{"type": "text", "text": text}],
        "structured_content": structured,
        "meta": None,
        "data": result,
        "is_error": False,
    }


class MCPEnvironment(Environment[ActT, ObsT, StateT]):
    """Base class of an environment whose tools are typed methods (an MCP tool environment).

    Mark methods with `openenv.tool`; the class serves them to clients as
    OpenEnv's ``MCPEnvironment`` does: a `ListToolsAction` step answers with a
    `ListToolsObservation`, a `CallToolAction` step with a `CallToolObservation`
    (the tool's ``result``, or an ``error``), and ``mcp`` frames and ``POST /mcp``
    speak JSON-RPC 2.0 (``tools/list``, ``tools/call``). Write ``reset`` and
    ``state`` as for any `Environment`; to take actions of your own as well,
    name them in the first type parameter (``MyAction``, or ``A | B``) and
    override `step_other`; override `tool_observation` to say more after a call.

    Examples:
        ```python
        import openenv


        class Calculator(openenv.MCPEnvironment[openenv.CallToolAction, openenv.CallToolObservation, openenv.State]):
            def __init__(self) -> None:
                self._state = openenv.State()

            def reset(self) -> openenv.Observation:
                self._state = openenv.State()
                return openenv.Observation()

            @property
            def state(self) -> openenv.State:
                return self._state

            @openenv.tool
            async def add(self, a: int, b: int) -> int:
                \"\"\"Add two integers.\"\"\"
                return a + b


        async with openenv.EnvClient("inproc://", factory=Calculator) as env:
            print([t.name for t in await env.list_tools()])  # ['add']
            print(await env.call_tool("add", a=2, b=3))  # 5
        ```

    Attributes:
        tools: The class's tools, by name (read once, when the class is made).

    Raises:
        ValueError: (when the class is made) A tool with a reserved name.
        TypeError: (when the class is made) A tool taking ``*args``/``**kwargs``.
    """

    # CallToolAction first: /schema's first choice, and what most steps are.
    action_type: Any = CallToolAction | ListToolsAction
    observation_type: Any = CallToolObservation
    tools: ClassVar[dict[str, ToolSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        bind_type_attributes(cls, MCPEnvironment)
        # The MCP actions are always accepted, beside any the type parameter names.
        cls.action_type = _with_tool_actions(cls.action_type)
        tools: dict[str, ToolSpec] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if getattr(value, _TOOL_MARK, False):
                    tools[name] = ToolSpec(value)
                elif name in tools:
                    del tools[name]  # overridden without the mark
        cls.tools = tools

    def list_tools(self) -> list[Tool]:
        """Describe the tools.

        Returns:
            One `Tool` per tool, in the order they were declared.
        """
        return [spec.describe() for spec in self.tools.values()]

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> CallToolObservation:
        """Run a tool and report its result, or why it failed (never raises for the tool).

        Args:
            name: The tool's name.
            arguments: Its arguments.

        Returns:
            What `tool_observation` makes of the outcome.
        """
        spec = self.tools.get(name)
        if spec is None:
            message = f"Tool '{name}' not found; available: {', '.join(self.tools) or 'none'}"
            return self.tool_observation(name, arguments, None, ToolError(error_type="tool_not_found", message=message))
        try:
            result = await spec.call(self, arguments)
        except msgspec.ValidationError as exc:
            error = ToolError(error_type="invalid_args", message=f"Invalid arguments for '{name}': {exc}")
            return self.tool_observation(name, arguments, None, error)
        except Exception as exc:
            logger.info("tool %r raised", name, exc_info=True)
            message = f"{type(exc).__name__}: {exc}" if error_details_shown() else HIDDEN_TOOL_ERROR
            error = ToolError(error_type="execution_error", message=message)
            return self.tool_observation(name, arguments, None, error)
        return self.tool_observation(name, arguments, msgspec.to_builtins(result), None)

    def tool_observation(
        self, tool_name: str, arguments: dict[str, Any], result: Any, error: ToolError | None
    ) -> CallToolObservation:
        """Build the observation of one tool call; override it to add fields or a reward.

        Args:
            tool_name: The tool called.
            arguments: The arguments it was given.
            result: What it returned (as plain data), or ``None`` if it failed.
            error: Why it failed, or ``None``.

        Returns:
            By default a `CallToolObservation`.
        """
        return CallToolObservation(tool_name=tool_name, result=result, error=error)

    async def step(self, action: Any) -> Any:
        """Route a tool action to its tool, and any other action to `step_other`.

        Args:
            action: The action.

        Returns:
            A `ListToolsObservation`, the call's observation, or what
            `step_other` returns.
        """
        if isinstance(action, CallToolAction):
            return await self.call_tool(action.tool_name, action.arguments)
        if isinstance(action, ListToolsAction):
            return ListToolsObservation(tools=self.list_tools())
        if inspect.iscoroutinefunction(self.step_other):
            return await self.step_other(action)
        # A plain override may be slow: keep it off the event loop, as plain steps are.
        result = await run_on_session_thread(self.step_other, action)
        return (await result) if inspect.isawaitable(result) else result

    def step_other(self, action: Any) -> Observation | Awaitable[Observation]:
        """Handle an action that is neither a `ListToolsAction` nor a `CallToolAction`.

        A plain override runs on the session's own thread, as plain tools do;
        an ``async`` one on the event loop.

        Args:
            action: The action.

        Returns:
            Its observation (or an awaitable of it).

        Raises:
            ValueError: By default: the environment takes tool actions only.
        """
        raise ValueError(f"unknown action {type(action).__name__}: use ListToolsAction or CallToolAction")

    async def handle_mcp(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer one JSON-RPC 2.0 request: ``tools/list`` or ``tools/call``.

        Args:
            request: The request (``jsonrpc``, ``method``, ``params``, ``id``).

        Returns:
            The JSON-RPC response: a ``result``, or an ``error`` (``-32602`` for
            an unknown tool or bad arguments, ``-32603`` when the tool raised).
        """
        request_id = request.get("id")
        method = request.get("method")
        if request.get("jsonrpc") != "2.0" or not isinstance(method, str):
            return jsonrpc_error(
                INVALID_REQUEST, "Invalid Request: 'jsonrpc' must be '2.0' and 'method' a string", request_id
            )
        params = request.get("params", {})
        if not isinstance(params, dict):
            return jsonrpc_error(INVALID_PARAMS, "Params must be an object", request_id)
        if method == "tools/list":
            tools = [
                {"name": spec.name, "description": spec.description, "inputSchema": spec.input_schema}
                for spec in self.tools.values()
            ]
            return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}
        if method == "tools/call":
            name = params.get("name")
            arguments = params.get("arguments") or {}
            if not isinstance(name, str) or not name:
                return jsonrpc_error(INVALID_PARAMS, "Missing 'name' in params", request_id)
            if not isinstance(arguments, dict):
                return jsonrpc_error(INVALID_PARAMS, "'arguments' must be an object", request_id)
            observation = await self.call_tool(name, arguments)
            error = observation.error
            if error is not None:
                code = INVALID_PARAMS if error.error_type in ("tool_not_found", "invalid_args") else INTERNAL_ERROR
                return jsonrpc_error(code, error.message, request_id, {"error_type": error.error_type})
            return {"jsonrpc": "2.0", "id": request_id, "result": _tool_result(observation.result)}
        return jsonrpc_error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)

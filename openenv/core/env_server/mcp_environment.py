"""Upstream OpenEnv's ``openenv.core.env_server.mcp_environment``: an environment whose tools a FastMCP server holds.

A subclass builds a ``FastMCP`` server with its tools and hands it to `MCPEnvironment`;
a step with a `ListToolsAction` or `CallToolAction` is answered through an in-memory
FastMCP client, any other action by the subclass's ``_step_impl``. Needs FastMCP (the
``core`` extra does not bring it: every MCP environment package requires it).

Served by openenv on asyncio, the environment's in-memory client connects at its
first tool call and stays connected until the session ends
(`MCPEnvironment.keep_mcp_session`, `MCPEnvironment.release_mcp_session`), as
upstream's server holds one MCP session open per WebSocket session: FastMCP's
per-session state lasts from one call to the next. Otherwise each tool call opens a
client of its own and closes it: in plain code (each call runs on an event loop of its
own), and on trio, where FastMCP's client, which runs on asyncio only, runs on an
asyncio loop in a worker thread.
"""

from __future__ import annotations

import contextvars
import inspect
import threading
from abc import abstractmethod
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
from fastmcp import Client
from fastmcp.client.client import CallToolResult
from mcp.types import TextContent

from openenv._blocking import in_event_loop
from openenv.core.env_server.interfaces import Environment
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
from openenv.core.env_server.types import Action, Observation

__all__ = ["MCP_TOOL_CALL_TIMEOUT", "VALID_MODES", "MCPEnvironment", "get_server_tools"]

MCP_TOOL_CALL_TIMEOUT = 30.0
"""Seconds a tool call may take when the step gives no ``timeout_s``."""

VALID_MODES = frozenset({"production", "simulation"})
"""The modes a tool may be registered for (`MCPEnvironment.tool`)."""

T = TypeVar("T")


def _run(work: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to its end from plain code: here, or in a thread of its own if an event loop runs here."""
    if not in_event_loop():
        return anyio.run(work)
    outcome: list[T] = []
    failure: list[BaseException] = []

    def in_thread() -> None:
        try:
            outcome.append(anyio.run(work))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=in_thread, name="openenv-mcp-call")
    thread.start()
    thread.join()  # a plain call made on an event loop's thread blocks it, as upstream's does
    if failure:
        raise failure[0]
    return outcome[0]


def get_server_tools(mcp_server: Any) -> dict[str, Any]:
    """The tools a FastMCP server holds, by name."""
    if hasattr(mcp_server, "get_tools"):
        found = _run(mcp_server.get_tools)
        if isinstance(found, dict):
            return found
    if hasattr(mcp_server, "list_tools"):
        return {tool.name: tool for tool in _run(mcp_server.list_tools)}
    return {}


def _tool_of(tool: Any) -> Tool:
    return Tool(name=tool.name, description=tool.description or "", input_schema=getattr(tool, "inputSchema", {}) or {})


def _json_type(annotation: Any) -> str:
    for kind, name in ((int, "integer"), (float, "number"), (bool, "boolean")):
        if annotation in (kind, kind.__name__):
            return name
    return "string"


def _error_type(message: str) -> ToolErrorType:
    """What kind of failure a tool call's error message tells of, as upstream reads it."""
    lowered = message.lower()
    if "not found" in lowered or "unknown tool" in lowered:
        return ToolErrorType.TOOL_NOT_FOUND
    if "invalid" in lowered or "argument" in lowered:
        return ToolErrorType.INVALID_ARGS
    return ToolErrorType.EXECUTION_ERROR


class MCPEnvironment(Environment[Any, Any, Any]):
    """An environment whose tools a FastMCP server holds (upstream's RFC 003).

    Args:
        mcp_server: The ``FastMCP`` server with the environment's tools.
        transform: Applied to observations (see `Environment`).

    Attributes:
        mcp_server: The server.
        mcp_client: The in-memory client the environment calls its tools through.

    Raises:
        ValueError: A tool named ``reset``, ``step``, ``state`` or ``close``.
    """

    keep_mcp_session: bool = False
    """Hold the client's MCP session open from the first tool call to `release_mcp_session`, on asyncio
    (openenv's: its server sets it for the environments it serves, and releases the session at the end)."""

    def __init__(self, mcp_server: Any, transform: Any = None) -> None:
        super().__init__(transform=transform)
        conflicts = set(get_server_tools(mcp_server)) & RESERVED_TOOL_NAMES
        if conflicts:
            raise ValueError(
                f"MCP tools cannot use reserved names: {sorted(conflicts)}. "
                f"Reserved names are: {sorted(RESERVED_TOOL_NAMES)}"
            )
        self.mcp_server: Any = mcp_server
        self.mcp_client: Any = Client(mcp_server)
        self._connected = False  # whether `_with_client` holds the client's MCP session open now
        self._mode_tools: dict[str, dict[str | None, Callable[..., Any]]] = defaultdict(dict)
        self._mode_tool_schemas: dict[str, dict[str | None, dict[str, Any]]] = defaultdict(dict)

    @asynccontextmanager
    async def mcp_session(self) -> AsyncIterator[Any]:
        """The in-memory client, connected for the block.

        Raises:
            RuntimeError: The environment is closed.
        """
        if self.mcp_client is None:
            raise RuntimeError("MCP client is not available; environment is closed")
        async with self.mcp_client as client:
            yield client

    def tool(self, mode: str | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a tool: on the FastMCP server for every mode, or only for ``"production"`` or ``"simulation"``.

        Raises:
            ValueError: Another mode, or a reserved name.
        """
        if mode is not None and mode not in VALID_MODES:
            raise ValueError(f"Invalid mode '{mode}'. Mode must be 'production', 'simulation', or None.")

        def register(function: Callable[..., Any]) -> Callable[..., Any]:
            name = function.__name__
            if name in RESERVED_TOOL_NAMES:
                raise ValueError(
                    f"Tool name '{name}' is reserved and cannot be used. "
                    f"Reserved names are: {sorted(RESERVED_TOOL_NAMES)}"
                )
            self._mode_tools[name][mode] = function
            if mode is None:
                if self.mcp_server is None:
                    raise RuntimeError("MCP server is not available; environment is closed")
                return self.mcp_server.tool()(function)  # type: ignore[no-any-return]
            parameters = inspect.signature(function).parameters.items()
            self._mode_tool_schemas[name][mode] = {
                "name": name,
                "description": function.__doc__ or "",
                "input_schema": {
                    "type": "object",
                    "properties": {key: {"type": _json_type(value.annotation)} for key, value in parameters},
                    "required": [key for key, value in parameters if value.default is inspect.Parameter.empty],
                },
            }
            return function

        return register

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """A tool listing or a tool call through the MCP client; any other action through ``_step_impl``."""
        if isinstance(action, ListToolsAction):
            return self._handle_list_tools()
        if isinstance(action, CallToolAction):
            return self._handle_call_tool(action, timeout_s=timeout_s)
        return self._step_impl(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """`step` on the event loop; ``_step_impl`` still runs on a thread."""
        if isinstance(action, ListToolsAction):
            return await self._async_handle_list_tools()
        if isinstance(action, CallToolAction):
            return await self._async_handle_call_tool(action, timeout_s=timeout_s)
        return await anyio.to_thread.run_sync(lambda: self._step_impl(action, timeout_s=timeout_s, **kwargs))

    @abstractmethod
    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """Answer an action that is neither a tool listing nor a tool call."""

    async def list_tools_observation(self) -> ListToolsObservation:
        """The tools, as a step with a `ListToolsAction` answers (the server's ``tools/list`` reads it)."""
        return await self._async_handle_list_tools()

    async def call_tool_observation(self, action: CallToolAction) -> CallToolObservation:
        """One tool call, as a step with a `CallToolAction` answers (the server's ``tools/call`` reads it)."""
        return await self._async_handle_call_tool(action)

    def _handle_list_tools(self) -> ListToolsObservation:
        return _run(self._async_handle_list_tools)

    def _handle_call_tool(self, action: CallToolAction, timeout_s: float | None = None) -> CallToolObservation:
        return _run(lambda: self._async_handle_call_tool(action, timeout_s=timeout_s))

    async def _async_handle_list_tools(self) -> ListToolsObservation:
        mode = getattr(self, "_mode", None)
        try:
            listed = await self._list_server_tools()
        except Exception as exc:
            return ListToolsObservation(tools=[], metadata={"error": str(exc), "error_type": "list_tools_failed"})
        tools = [_tool_of(tool) for tool in listed if tool.name not in self._mode_tool_schemas]
        for schemas in self._mode_tool_schemas.values():
            schema = schemas.get(None, schemas.get(mode))
            if schema is not None:
                tools.append(Tool(**schema))
        return ListToolsObservation(tools=tools)

    async def _async_handle_call_tool(
        self, action: CallToolAction, timeout_s: float | None = None
    ) -> CallToolObservation:
        name = action.tool_name
        own = self._mode_tools.get(name)
        if own is not None:
            return await self._call_mode_tool(name, own, action.arguments)
        timeout = MCP_TOOL_CALL_TIMEOUT if timeout_s is None else timeout_s
        try:
            with anyio.fail_after(timeout):
                result = await self._call_server_tool(name, action.arguments)
        except TimeoutError:
            message = f"Tool '{name}' timed out after {timeout} seconds"
            return CallToolObservation(
                tool_name=name, error=ToolError(error_type=ToolErrorType.TIMEOUT, message=message)
            )
        except Exception as exc:
            error = ToolError(error_type=_error_type(str(exc)), message=str(exc))
            return CallToolObservation(tool_name=name, error=error)
        return CallToolObservation(tool_name=name, result=result)

    async def _with_client(self, use: Callable[[Any], Awaitable[T]]) -> T:
        """``use(client)`` with an in-memory FastMCP client of the server, connected, on asyncio.

        With `keep_mcp_session`, the environment's own client, connected once and kept so.
        Otherwise a client of its own each time: FastMCP's binds its locks to the event
        loop it was first used on (plain code runs each call on a loop of its own), and
        runs on asyncio only, so on trio the call runs on an asyncio loop in a worker
        thread, in a context of its own (a copy of this one would say trio runs there).
        """
        server = self.mcp_server
        if server is None or self.mcp_client is None:
            raise RuntimeError("MCP server is not available; environment is closed")

        async def connected() -> T:
            async with Client(server) as client:
                return await use(client)

        # anyio runs on asyncio or trio: trio's native token is trio's own, asyncio's is its loop.
        if type(anyio.lowlevel.current_token().native_token).__module__.startswith("trio"):
            return await anyio.to_thread.run_sync(lambda: contextvars.Context().run(anyio.run, connected))
        if not self.keep_mcp_session:
            return await connected()
        if not self._connected:
            # FastMCP's client runs its session in a task of its own: it may be left open here and
            # closed from another task (`release_mcp_session`).
            await self.mcp_client.__aenter__()
            self._connected = True
        return await use(self.mcp_client)

    async def release_mcp_session(self) -> None:
        """Close the MCP session the tool calls held open, if they did (openenv's: its server calls it at the end).

        Idempotent; the environment may call its tools again afterwards (a new session opens).
        """
        if self._connected:
            self._connected = False
            await self.mcp_client.__aexit__(None, None, None)

    async def _list_server_tools(self) -> list[Any]:
        async def listed(client: Any) -> list[Any]:
            return list(await client.list_tools())

        return await self._with_client(listed)

    async def _call_server_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self._with_client(lambda client: client.call_tool(name, arguments))

    async def _call_mode_tool(
        self, name: str, modes: dict[str | None, Callable[..., Any]], arguments: dict[str, Any]
    ) -> CallToolObservation:
        """A tool registered with `tool`: the one of every mode, else this mode's."""
        mode = getattr(self, "_mode", None)
        function = modes.get(None, modes.get(mode))
        if function is None:
            message = f"Tool '{name}' not available in {mode} mode"
            return CallToolObservation(
                tool_name=name, error=ToolError(error_type=ToolErrorType.TOOL_NOT_FOUND, message=message)
            )
        try:
            value = function(**arguments)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            error = ToolError(error_type=ToolErrorType.EXECUTION_ERROR, message=str(exc))
            return CallToolObservation(tool_name=name, error=error)
        result = CallToolResult(
            content=[TextContent(type="text", text=str(value))],
            structured_content={"result": value},
            meta=None,
            data=value,
            is_error=False,
        )
        return CallToolObservation(tool_name=name, result=result)

    def close(self) -> None:
        """Let go of the MCP server and client."""
        self.mcp_client = None
        self.mcp_server = None

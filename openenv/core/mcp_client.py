"""Upstream OpenEnv's ``openenv.core.mcp_client``: the client of an MCP tool environment (`MCPToolClient`).

Its tool calls go through openenv's own client (`openenv.EnvClient.list_tools` and
`openenv.EnvClient.call_tool`, in its ``production`` mode: JSON-RPC ``tools/list`` and
``tools/call``, bypassing ``step``), so they ride openenv's transports; a step with a
`CallToolAction` or `ListToolsAction` still goes through the environment's ``step``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

import openenv
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.mcp_types import (
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
    ListToolsObservation,
    Tool,
    ToolError,
)
from openenv.core.env_server.types import Observation, State

__all__ = ["GenericMCPObservation", "MCPClientBase", "MCPToolClient"]


def _tool(payload: dict[str, Any]) -> Tool:
    """A tool as upstream's client reads one: ``input_schema`` or MCP's ``inputSchema``."""
    schema = payload.get("input_schema", payload.get("inputSchema", {}))
    return Tool(name=payload.get("name", ""), description=payload.get("description", ""), input_schema=schema)


class GenericMCPObservation(Observation):
    """An observation of an MCP environment that is neither a tool listing nor a tool call's: any fields."""

    model_config = ConfigDict(extra="allow", validate_assignment=True, arbitrary_types_allowed=True)


class MCPClientBase(EnvClient[Any, Observation, State]):
    """The client of an MCP tool environment: its tools listed (and kept), steps parsed into MCP observations.

    Args:
        base_url: The server's URL.
        connect_timeout_s: Seconds allowed to connect.
        message_timeout_s: Seconds to wait for each reply.
        websocket_ping_interval_s: Seconds between keepalive pings (``None``: none).
        websocket_ping_timeout_s: Seconds to wait for a ping's answer.
        provider: Not offered yet (see `EnvClient`).
        mode: ``"production"``, the only one (the default).
        max_message_size_mb: The largest reply taken, in MiB.
        headers: More HTTP headers for the connection.

    Raises:
        ValueError: Another mode.
    """

    def __init__(
        self,
        base_url: str,
        connect_timeout_s: float = 10.0,
        message_timeout_s: float = 60.0,
        websocket_ping_interval_s: float | None = 20.0,
        websocket_ping_timeout_s: float | None = 20.0,
        provider: Any = None,
        mode: str | None = None,
        max_message_size_mb: float = 100.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        mode = "production" if mode is None else mode
        if mode.lower() != "production":
            raise ValueError(
                f"MCPToolClient only supports 'production' mode, got '{mode}'. "
                "Use GenericEnvClient for simulation mode."
            )
        super().__init__(
            base_url=base_url,
            connect_timeout_s=connect_timeout_s,
            message_timeout_s=message_timeout_s,
            max_message_size_mb=max_message_size_mb,
            websocket_ping_interval_s=websocket_ping_interval_s,
            websocket_ping_timeout_s=websocket_ping_timeout_s,
            provider=provider,
            mode=mode,
            headers=headers,
        )
        self.use_production_mode = True
        self._tools_cache: list[Tool] | None = None

    async def list_tools(self, use_cache: bool = True) -> list[Tool]:
        """The environment's tools; kept after the first call unless ``use_cache`` is false.

        A server that cannot list them gives ``[]``, as upstream's client does.
        """
        if use_cache and self._tools_cache is not None:
            return self._tools_cache
        native = await self._connected()
        try:
            listed = await native.list_tools()
        except openenv.OpenEnvError:
            return []
        self._tools_cache = [
            Tool(name=tool.name, description=tool.description or "", input_schema=dict(tool.input_schema))
            for tool in listed
        ]
        return self._tools_cache

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, ListToolsAction):
            return {"type": "list_tools"}
        if isinstance(action, CallToolAction):
            return {"type": "call_tool", "tool_name": action.tool_name, "arguments": action.arguments}
        if hasattr(action, "model_dump"):
            return action.model_dump()  # type: ignore[no-any-return]
        return {"action": str(action)}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[Observation]:
        fields = payload.get("observation", {})
        common = {
            "done": payload.get("done", False),
            "reward": payload.get("reward"),
            "metadata": payload.get("metadata", fields.get("metadata", {})),
        }
        observation: Observation
        if "tools" in fields:
            observation = ListToolsObservation(tools=[_tool(tool) for tool in fields["tools"]], **common)
        elif "tool_name" in fields:
            error = ToolError(**fields["error"]) if fields.get("error") else None
            observation = CallToolObservation(
                tool_name=fields["tool_name"], result=fields.get("result"), error=error, **common
            )
        else:
            rest = {key: value for key, value in fields.items() if key not in ("done", "reward", "metadata")}
            observation = GenericMCPObservation(**common, **rest)
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State(episode_id=payload.get("episode_id"), step_count=payload.get("step_count", 0))


class MCPToolClient(MCPClientBase):
    """Calls an MCP tool environment's tools by name.

    Examples:
        ```python
        from openenv.core.mcp_client import MCPToolClient

        async with MCPToolClient(base_url="http://127.0.0.1:8000") as env:
            print([tool.name for tool in await env.list_tools()])
            print(await env.call_tool("echo_message", message="Hello!"))
        ```
    """

    async def call_tool(self, name: str, **kwargs: Any) -> Any:
        """Call one tool; what it returned.

        Args:
            name: The tool's name.
            **kwargs: Its arguments.

        Raises:
            RuntimeError: The tool failed (``Tool 'name' failed: ...``).
        """
        native = await self._connected()
        try:
            return await native.call_tool(name, **kwargs)
        except openenv.ToolCallError as exc:
            raise RuntimeError(f"Tool '{name}' failed: {exc.message}") from exc

    async def get_tool(self, name: str) -> Tool | None:
        """The tool of that name, if the environment has one."""
        for tool in await self.list_tools():
            if tool.name == name:
                return tool
        return None

    async def has_tool(self, name: str) -> bool:
        """Whether the environment has a tool of that name."""
        return await self.get_tool(name) is not None

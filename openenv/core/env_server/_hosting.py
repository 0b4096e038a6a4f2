"""An upstream-style environment served by openenv's server: each session's `HostedEnvironment`.

openenv's server serves `openenv.Environment` subclasses whose calls take and give
plain data. A `HostedEnvironment` is one, around one instance of an upstream-style
environment: it validates each action into the declared pydantic class, calls the
environment as upstream's server would (``reset_async``/``step_async`` on the event
loop when the class overrides them, else ``reset``/``step`` on the session's own
thread, with the reset keywords its signature takes), and hands back observations
and states as upstream 0.10 serializes them (`serialization.serialize_observation`:
the server's codec lifts ``reward`` and ``done`` out of the fields the same way). Everything else (sessions, links,
limits, every transport) is the server's own.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import anyio.to_thread
from pydantic import BaseModel, ValidationError

from openenv import Environment as NativeEnvironment
from openenv import EnvironmentMetadata as NativeMetadata
from openenv._tools import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.env_server.serialization import deserialize_action
from openenv.core.env_server.types import Action, Observation, State
from openenv.server import RequestError, jsonrpc_error

__all__ = ["TASK_METHODS", "HostedEnvironment", "Hosting", "hosted_class", "overrides"]


TASK_METHODS = ("list_splits", "list_tasks", "num_tasks", "get_task", "get_task_range")
"""Upstream's ``TaskProvider`` methods, which an environment may define."""


def overrides(env: object, name: str) -> bool:
    """Whether the environment's class replaces the base class's ``name`` (``reset_async``, ``step_async``)."""
    return getattr(type(env), name, None) is not getattr(Environment, name)


def _keyword_filter(method: Callable[..., Any]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The reset keywords ``method`` takes, as upstream's server picks them: all of them with ``**kwargs``."""
    parameters = inspect.signature(method).parameters
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return dict
    names = frozenset(parameters)
    return lambda data: {key: value for key, value in data.items() if key in names}


def _observation_fields(observation: Observation) -> dict[str, Any]:
    """An observation's fields in JSON's types (the server lifts ``reward`` and ``done`` beside them, as upstream)."""
    return observation.model_dump(mode="json")


def _state_data(state: Any) -> dict[str, Any]:
    """A state's reply data: its fields, as upstream's WebSocket handler dumps them."""
    if isinstance(state, BaseModel):
        return state.model_dump(mode="json")
    return dict(state) if state else {}


@dataclass(frozen=True)
class Hosting:
    """What `http_server.create_app` was given, for the sessions it serves.

    Attributes:
        factory: Builds one upstream-style environment per session.
        action_cls: The actions' pydantic class.
        observation_cls: The observations' class (for ``/schema``).
        state_cls: The state's class (for ``/schema``).
        reset_observation_cls: What ``reset`` returns (for ``/schema``).
        env_name: The environment's public name.
    """

    factory: Callable[[], Environment[Any, Any, Any]]
    action_cls: type[Action]
    observation_cls: type[Observation]
    state_cls: type[State]
    reset_observation_cls: type[Observation]
    env_name: str


class HostedEnvironment(NativeEnvironment[dict[str, Any], dict[str, Any], dict[str, Any]]):
    """One session of an upstream-style environment, as openenv's server serves it.

    Made per `Hosting` by `hosted_class`; the server builds one per session.

    Attributes:
        env: The upstream-style environment of this session.
    """

    hosting: ClassVar[Hosting]
    task_api_name: ClassVar[str]
    """The environment's name in the Task API's routes (``/{env_name}/splits``): ``create_app``'s ``env_name``."""

    def __init__(self) -> None:
        env = self.hosting.factory()
        self.env = env
        # The server reads each call from the instance: plain ones run on the session's thread.
        if overrides(env, "reset_async"):
            self._reset_keywords = _keyword_filter(env.reset_async)
            self.reset = self._reset_on_loop  # type: ignore[method-assign, assignment]
        else:
            self._reset_keywords = _keyword_filter(env.reset)
        if overrides(env, "step_async"):
            self.step = self._step_on_loop  # type: ignore[method-assign, assignment]
        for name in TASK_METHODS:  # upstream's TaskProvider methods, where it has them: the Task API asks these
            method = getattr(env, name, None)
            if callable(method):
                setattr(self, name, method)
        if hasattr(env, "list_tools_observation") and hasattr(env, "call_tool_observation"):  # an MCPEnvironment
            tools: Any = env
            self._tools = tools
            self.handle_mcp = self._handle_mcp
            if hasattr(env, "release_mcp_session"):  # one MCP session for the whole session, as upstream's
                tools.keep_mcp_session = True
                self.close = self._close_with_tools  # type: ignore[method-assign, assignment]

    @classmethod
    def json_schemas(cls) -> dict[str, dict[str, Any]]:
        """What ``GET /schema`` answers: the pydantic classes' JSON Schemas."""
        hosting = cls.hosting
        return {
            "action": hosting.action_cls.model_json_schema(),
            "observation": hosting.observation_cls.model_json_schema(),
            "state": hosting.state_cls.model_json_schema(),
            "reset_observation": hosting.reset_observation_cls.model_json_schema(),
        }

    @classmethod
    def metadata(cls) -> NativeMetadata:
        """What ``GET /metadata`` answers: an environment's ``get_metadata()``, read once.

        A class that keeps upstream's own ``get_metadata`` is described by its name
        without building one; any other factory builds one environment for it.
        """
        factory = cls.hosting.factory
        if isinstance(factory, type) and getattr(factory, "get_metadata", None) is Environment.get_metadata:
            name = factory.__name__
            return NativeMetadata(name=name, description=f"{name} environment", version="1.0.0")
        env = factory()
        try:
            found = env.get_metadata()
        finally:
            env.close()
        return NativeMetadata(**found.model_dump())

    def _action(self, data: dict[str, Any]) -> Action:
        try:
            return deserialize_action(data, self.hosting.action_cls)
        except ValidationError as exc:
            errors = json.loads(exc.json())
            raise RequestError("VALIDATION_ERROR", "Invalid message", extra={"errors": errors}) from None

    async def _handle_mcp(self, request: dict[str, Any]) -> dict[str, Any]:
        """Answer ``tools/list`` or ``tools/call`` from the environment's FastMCP server, bypassing its ``step``."""
        request_id = request.get("id")
        method = request.get("method")
        params = request.get("params") or {}
        if request.get("jsonrpc") != "2.0" or not isinstance(method, str) or not isinstance(params, dict):
            return jsonrpc_error(INVALID_REQUEST, "Invalid Request", request_id)
        if method == "tools/list":
            listed = await self._tools.list_tools_observation()
            tools = [
                {"name": t.name, "description": t.description, "inputSchema": t.input_schema} for t in listed.tools
            ]
            return {"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}}
        if method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            if not isinstance(name, str) or not isinstance(arguments, dict):
                message = "Invalid params: 'name' must be a string, 'arguments' an object"
                return jsonrpc_error(INVALID_PARAMS, message, request_id)
            called = await self._tools.call_tool_observation(CallToolAction(tool_name=name, arguments=arguments))
            if called.error is not None:
                failed_call = called.error.error_type in ("tool_not_found", "invalid_args")
                code = INVALID_PARAMS if failed_call else INTERNAL_ERROR
                data = {"error_type": called.error.error_type.value}
                return jsonrpc_error(code, called.error.message, request_id, data)
            result = called.model_dump(mode="json")["result"]
            return {"jsonrpc": "2.0", "id": request_id, "result": result}
        return jsonrpc_error(METHOD_NOT_FOUND, f"Method not found: {method}", request_id)

    def reset(self, **data: Any) -> dict[str, Any]:
        """Reset the environment with the keywords its ``reset`` takes; the observation's reply data."""
        return _observation_fields(self.env.reset(**self._reset_keywords(data)))

    async def _reset_on_loop(self, **data: Any) -> dict[str, Any]:
        return _observation_fields(await self.env.reset_async(**self._reset_keywords(data)))

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        """Validate the action, step the environment; the observation's reply data."""
        return _observation_fields(self.env.step(self._action(action)))

    async def _step_on_loop(self, action: dict[str, Any]) -> dict[str, Any]:
        return _observation_fields(await self.env.step_async(self._action(action)))

    @property
    def state(self) -> dict[str, Any]:
        """The environment's state, as reply data."""
        return _state_data(self.env.state)

    def close(self) -> None:
        """Close the environment."""
        self.env.close()

    async def _close_with_tools(self) -> None:
        """Close an MCP environment: its MCP session on the event loop, then its own ``close`` on a worker thread."""
        try:
            await self._tools.release_mcp_session()
        finally:
            await anyio.to_thread.run_sync(self.env.close)


def hosted_class(hosting: Hosting) -> type[HostedEnvironment]:
    """The `HostedEnvironment` class of one app: what it gives the server as its factory."""
    attributes = {"hosting": hosting, "task_api_name": hosting.env_name, "__module__": __name__}
    return type(hosting.env_name, (HostedEnvironment,), attributes)

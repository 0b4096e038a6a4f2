"""The echo environment, as OpenEnv's MCP ``echo_env`` is, and its client.

A tool environment (`openenv.MCPEnvironment`) with two tools: ``echo_message``
echoes ``message``; ``echo_with_length`` also reports its length. As in
OpenEnv's echo_env, a reset answers with an empty observation, a
`ListToolsAction` step with the tools, and a `CallToolAction` step with the
tool's ``result`` (or an ``error``). Each call's observation also carries the
``echoed_message``, and its reward is a tenth of the message's length. Serve
it with ``openenv serve openenv.examples.echo:EchoEnvironment`` or use it
in-process as ``inproc://openenv.examples.echo:EchoEnvironment``.

Examples:
    ```python
    from openenv.examples.echo import CallToolAction, EchoEnv

    async with EchoEnv("inproc://openenv.examples.echo:EchoEnvironment") as env:
        await env.reset()
        result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hi"}))
        assert result.observation.echoed_message == "Hi"
        assert result.observation.result == "Hi"
        assert await env.call_tool("echo_with_length", message="Hi") == {"message": "Hi", "length": 2}
    ```
"""

from __future__ import annotations

import uuid
from typing import Any

from .. import (
    CallToolAction,
    CallToolObservation,
    EnvClient,
    ListToolsAction,
    ListToolsObservation,
    Observation,
    State,
    ToolError,
    tool,
)
from ..server import MCPEnvironment

__all__ = [
    "CallToolAction",
    "EchoEnv",
    "EchoEnvironment",
    "EchoObservation",
    "EchoState",
    "ListToolsAction",
    "ListToolsObservation",
]


class EchoObservation(CallToolObservation, kw_only=True):
    """What a tool call of the echo environment shows (and, all empty, a reset).

    Attributes:
        tool_name: The tool called (empty after a reset).
        result: What the tool returned: the message, or ``{"message", "length"}``.
        error: Why the call failed, or ``None``.
        echoed_message: The message echoed back (empty after a reset, or a failed call).
    """

    tool_name: str = ""
    echoed_message: str = ""


class EchoState(State):
    """The echo environment's state: the episode and its step count."""


class EchoEnvironment(MCPEnvironment[CallToolAction, Observation, EchoState]):
    """Echoes messages back, through two MCP tools; the reward is a tenth of the message's length.

    Its tools are coroutines: the work is trivial, so it runs on the event loop
    rather than on the session's thread. Episodes never end by themselves (``done``
    is always false).
    """

    # A reset gives a bare Observation, a call an EchoObservation: /schema shows the richer one.
    observation_type = EchoObservation

    def __init__(self) -> None:
        self._state = EchoState(episode_id=str(uuid.uuid4()))

    async def reset(self, seed: int | None = None, episode_id: str | None = None) -> Observation:
        """Start a new episode.

        Args:
            seed: Accepted and unused (echoing is deterministic).
            episode_id: The new episode's id; a fresh UUID when not given.

        Returns:
            An empty observation, with reward 0 (as OpenEnv's echo_env gives).
        """
        self._state = EchoState(episode_id=episode_id or str(uuid.uuid4()))
        return Observation(reward=0.0, done=False)

    async def step(self, action: Any) -> Any:
        """Count the step, then run the tool the action names (or list the tools).

        Args:
            action: A `CallToolAction` or a `ListToolsAction`.

        Returns:
            An `EchoObservation` for a call, a `ListToolsObservation` for a listing.
        """
        self._state.step_count += 1
        return await super().step(action)

    @tool
    async def echo_message(self, message: str) -> str:
        """Echo back the provided message."""
        return message

    @tool
    async def echo_with_length(self, message: str) -> dict[str, Any]:
        """Echo back the message with its length."""
        return {"message": message, "length": len(message)}

    def tool_observation(
        self, tool_name: str, arguments: dict[str, Any], result: Any, error: ToolError | None
    ) -> EchoObservation:
        """Add the echoed message, and a reward of a tenth of its length, to a call's observation.

        Args:
            tool_name: The tool called.
            arguments: Its arguments.
            result: What it returned, or ``None``.
            error: Why it failed, or ``None``.

        Returns:
            The observation.
        """
        message = arguments.get("message", "") if error is None else ""
        message = message if isinstance(message, str) else ""
        return EchoObservation(
            tool_name=tool_name, result=result, error=error, echoed_message=message, reward=len(message) * 0.1
        )

    @property
    def state(self) -> EchoState:
        """The current episode's id and step count."""
        return self._state


class EchoEnv(EnvClient[CallToolAction | ListToolsAction, EchoObservation | ListToolsObservation, EchoState]):
    """The typed client of the echo environment: no parsing code needed.

    Its observation type is a union: each reply is decoded into the type it
    fits (an `EchoObservation` after a reset or a call, a `ListToolsObservation`
    after a `ListToolsAction`).

    Examples:
        ```python
        from openenv.examples.echo import CallToolAction, EchoEnv, ListToolsAction

        async with EchoEnv("ws://127.0.0.1:8000") as env:
            await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "Hello!"}))
            print(result.observation.result)  # {'message': 'Hello!', 'length': 6}
            listing = await env.step(ListToolsAction())
            print([tool.name for tool in listing.observation.tools])  # ['echo_message', 'echo_with_length']
            print((await env.state()).step_count)  # 2
        ```
    """

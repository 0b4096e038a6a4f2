"""The echo environment, shaped like the one in OpenEnv's documentation, and its client.

The action calls one of two tools: ``echo_message`` echoes ``arguments["message"]``;
``echo_with_length`` also reports its length. The reward is a tenth of the
message's length. Serve it with ``openenv serve openenv.examples.echo:EchoEnvironment``
or use it in-process as ``inproc://openenv.examples.echo:EchoEnvironment``.

Examples:
    ```python
    from openenv.examples.echo import CallToolAction, EchoEnv

    async with EchoEnv("inproc://openenv.examples.echo:EchoEnvironment") as env:
        await env.reset()
        result = await env.step(CallToolAction(tool_name="echo_message", arguments={"message": "Hi"}))
        assert result.observation.echoed_message == "Hi"
    ```
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

import msgspec

from .. import Action, EnvClient, Observation, State
from ..server import Environment

__all__ = ["CallToolAction", "EchoEnv", "EchoEnvironment", "EchoObservation", "EchoState"]

TOOLS = ("echo_message", "echo_with_length")


class CallToolAction(Action):
    """Call one of the environment's tools.

    Attributes:
        tool_name: ``"echo_message"`` or ``"echo_with_length"``.
        arguments: The tool's arguments; both tools take ``message``.
    """

    # The examples reach the JSON Schema at /schema, from which tools such as
    # `openenv bench` build a valid action.
    tool_name: Annotated[str, msgspec.Meta(examples=list(TOOLS))]
    arguments: Annotated[dict[str, Any], msgspec.Meta(examples=[{"message": "hello"}])] = msgspec.field(
        default_factory=dict
    )


class EchoObservation(Observation):
    """What the echo environment shows after a reset or a step.

    Attributes:
        echoed_message: The message echoed back (empty after a reset).
        result: What the tool returned: the message, or ``{"message", "length"}``.
    """

    echoed_message: str = ""
    result: Any = None


class EchoState(State):
    """The echo environment's state: the episode and its step count."""


class EchoEnvironment(Environment[CallToolAction, EchoObservation, EchoState]):
    """Echoes messages back; the reward is a tenth of the message's length.

    Its methods are coroutines: the work is trivial, so it runs on the event loop
    rather than in a worker thread. Episodes never end by themselves (``done`` is
    always false).
    """

    def __init__(self) -> None:
        self._state = EchoState(episode_id=str(uuid.uuid4()))

    async def reset(self, seed: int | None = None, episode_id: str | None = None) -> EchoObservation:
        """Start a new episode.

        Args:
            seed: Accepted and unused (echoing is deterministic).
            episode_id: The new episode's id; a fresh UUID when not given.

        Returns:
            An empty observation, with reward 0.
        """
        self._state = EchoState(episode_id=episode_id or str(uuid.uuid4()))
        return EchoObservation(echoed_message="", result=None, reward=0.0, done=False)

    async def step(self, action: CallToolAction) -> EchoObservation:
        """Run the tool the action names.

        Args:
            action: The tool to call, and its ``message`` argument.

        Returns:
            The echoed message and the tool's result, with a reward of a tenth
            of the message's length.

        Raises:
            ValueError: An unknown tool, or a ``message`` that is not a string; the
                client gets an ``EXECUTION_ERROR``.
        """
        message = action.arguments.get("message", "")
        if not isinstance(message, str):
            raise ValueError(f"message must be a string, not {type(message).__name__}")
        if action.tool_name == "echo_message":
            result: Any = message
        elif action.tool_name == "echo_with_length":
            result = {"message": message, "length": len(message)}
        else:
            raise ValueError(f"unknown tool {action.tool_name!r}; available: {', '.join(TOOLS)}")
        self._state.step_count += 1
        return EchoObservation(echoed_message=message, result=result, reward=len(message) * 0.1)

    @property
    def state(self) -> EchoState:
        """The current episode's id and step count."""
        return self._state


class EchoEnv(EnvClient[CallToolAction, EchoObservation, EchoState]):
    """The typed client of the echo environment: no parsing code needed.

    Examples:
        ```python
        from openenv.examples.echo import CallToolAction, EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000") as env:
            await env.reset()
            result = await env.step(CallToolAction(tool_name="echo_with_length", arguments={"message": "Hello!"}))
            print(result.observation.result)  # {'message': 'Hello!', 'length': 6}
            print((await env.state()).step_count)  # 1
        ```
    """

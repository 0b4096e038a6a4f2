"""The wire messages, as msgspec Structs.

Every frame is a tagged union on ``type``, exactly as OpenEnv speaks it:

```text
client -> server   {"type": "reset", "data": {...reset kwargs}}
                   {"type": "step",  "data": {...action fields}}
                   {"type": "state"}
                   {"type": "close"}
                   {"type": "mcp",   "data": {...JSON-RPC 2.0 request}}
server -> client   {"type": "observation", "data": {"observation": {...}, "reward": r, "done": d, "metadata": {...}}}
                   {"type": "state", "data": {...state fields}}
                   {"type": "error", "data": {"message": "...", "code": "...", ...}}
                   {"type": "mcp",   "data": {...JSON-RPC 2.0 response}}
```

A dialect that negotiated request ids adds ``"id": n`` to each request and
echoes it in the reply; plain OpenEnv frames never carry it.
"""

from __future__ import annotations

from typing import Any, Generic, Literal

import msgspec

from ._types import ObsT, StateT

__all__ = [
    "CloseRequest",
    "Dialect",
    "ErrorReply",
    "IncomingRequest",
    "MCPMessage",
    "ObservationData",
    "ObservationReply",
    "ResetRequest",
    "StateReply",
    "StateRequest",
    "StepBatchReply",
    "StepRequest",
]


class Dialect(msgspec.Struct, frozen=True):
    """How the frames of one session are written, as negotiated by its transport.

    The default, ``Dialect()``, is plain OpenEnv: JSON and no request ids. A
    transport sets its `Transport.dialect` on connect (the WebSocket transport
    from the subprotocol the server selected); the client reads it there.

    Examples:
        ```python
        import openenv
        from openenv.examples.echo import EchoEnv

        async with EchoEnv("ws://127.0.0.1:8000") as env:
            print(env.transport.dialect)  # Dialect(encoding='json', request_ids=True)
        ```

    Attributes:
        encoding: ``"json"`` (text frames, OpenEnv's) or ``"msgpack"`` (binary frames).
        request_ids: Whether each request carries an ``id`` that its reply echoes.
    """

    encoding: Literal["json", "msgpack"] = "json"
    request_ids: bool = False


class _Frame(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    """Common base: the tag lives in ``type``; ``id`` is written only when set."""

    id: int | None = None


class ResetRequest(_Frame, tag="reset"):
    """Start a new episode; ``data`` holds the keyword arguments of ``reset``."""

    data: dict[str, Any] = msgspec.field(default_factory=dict)


class StepRequest(_Frame, tag="step"):
    """Take one step; ``data`` is the action (its fields, on the wire)."""

    data: Any


class StateRequest(_Frame, tag="state"):
    """Ask for the environment's state."""


class CloseRequest(_Frame, tag="close"):
    """End the session; the server sends no reply."""


class MCPMessage(_Frame, tag="mcp"):
    """An MCP message, either way: ``data`` is a JSON-RPC 2.0 request, or its response."""

    data: dict[str, Any]


class ObservationData(msgspec.Struct, Generic[ObsT]):
    """The ``data`` of an observation reply: done and reward sit beside the observation.

    So does the observation's ``metadata`` when it is not empty, as OpenEnv 0.10
    sends it (also inside the observation itself); replies of older servers have
    none (an unset field is not written).
    """

    observation: ObsT
    # Kept as sent: OpenEnv allows bool, int and float rewards.
    reward: bool | int | float | None = None
    done: bool = False
    metadata: dict[str, Any] | msgspec.UnsetType = msgspec.UNSET


class ObservationReply(_Frame, Generic[ObsT], tag="observation"):
    """The reply to a reset or a step."""

    data: ObservationData[ObsT]


class StateReply(_Frame, Generic[StateT], tag="state"):
    """The reply to a state request."""

    data: StateT


class ErrorReply(_Frame, tag="error"):
    """An error reply: ``data`` has ``message`` and ``code``, and may have more."""

    data: dict[str, Any]


class IncomingRequest(msgspec.Struct):
    """A request as the server first reads it: the ``data`` is decoded later, by type."""

    type: str
    data: msgspec.Raw = msgspec.Raw(b"")
    id: int | None = None


class StepBatchReply(msgspec.Struct, Generic[ObsT]):
    """The replies to a batch of steps, as one message, in the batch's order (in-process only, never on a wire).

    Each step is answered with its observation as the environment returned it
    (``reward``, ``done`` and ``metadata`` inside it, where a reply frame lifts
    them beside it), or with its error reply's ``data`` (by position, in
    ``errors``). A position with neither was not stepped: its session could not
    take part (a call before it waited), and its request goes on its own.
    """

    observations: list[ObsT | None]
    errors: dict[int, dict[str, Any]] = msgspec.field(default_factory=dict)

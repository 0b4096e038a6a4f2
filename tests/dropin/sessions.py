"""Sessions these tests run more than once: a plain WebSocket session's replies, and a walk on the grid package."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

import openenv
from transports.websocket import WebSocketTransport


async def plain_session_replies(url: str, requests: Sequence[dict[str, Any] | bytes]) -> list[dict[str, Any]]:
    """Each reply to ``requests`` on one plain WebSocket session (no subprotocol, no shared link), decoded.

    A request given as bytes is sent as it is (a malformed frame, say); any other is sent as JSON.
    """
    replies = []
    async with WebSocketTransport(url, subprotocols=[], share=False) as transport:
        for request in requests:
            await transport.send(request if isinstance(request, bytes) else json.dumps(request).encode())
            replies.append(json.loads(await transport.receive()))
    return replies


async def walk_the_grid(env: openenv.EnvClient[Any, Any, Any]) -> None:
    """Reset the grid package's environment, step it with an invalid action and a valid one: upstream's replies."""
    first = await env.reset(seed=5, episode_id="e-1")
    assert first.observation == {"metadata": {"seed": 5}, "position": [0, 0], "message": "find [1, 1]"}
    with pytest.raises(openenv.ValidationError) as caught:
        await env.step({"direction": "north"})
    assert caught.value.code == "VALIDATION_ERROR"
    moved = await env.step({"direction": "up"})
    assert (moved.observation["position"], moved.reward) == ([0, 1], -0.1)

"""Serving a test environment over each transport, for the contract tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import openenv

# Each transport the contract tests run over; the WebSocket and HTTP transports
# add themselves here.
TRANSPORTS = ["inproc", "ws", "http+poll"]


def factory_path(factory: Callable[[], Any]) -> str:
    return f"{factory.__module__}:{factory.__qualname__}"


@asynccontextmanager
async def serving(kind: str, factory: Callable[[], Any], **server_options: Any) -> AsyncIterator[str]:
    """Yield a URL at which ``factory``'s environments are served over transport ``kind``."""
    if kind == "inproc":
        if server_options:
            raise NotImplementedError(f"in-process serving takes no server options: {server_options}")
        yield f"inproc://{factory_path(factory)}"
        return
    async with openenv.serve(factory, port=0, **server_options) as server:
        if kind == "ws":
            yield server.url.replace("http://", "ws://")
        elif kind == "http+poll":
            yield server.url.replace("http://", "http+poll://")
        else:
            raise ValueError(kind)

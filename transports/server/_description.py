"""An environment's metadata, read at its first use rather than when the app is built.

Reading it may build an environment: an upstream package's factory (``openenv.core``'s
``create_app``) is asked by building one, as upstream's server does per ``GET /metadata``.
Building one at import would run the package's set-up (a dataset's download, say) before
anything is served, so `Description` reads it once, on a worker thread, when a route first
needs it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio.to_thread

from openenv import EnvironmentMetadata
from openenv.server import environment_metadata

__all__ = ["Description"]


class Description:
    """What ``GET /metadata`` answers for a factory: given, or read from the factory once, at first use.

    Args:
        factory: The environment factory.
        given: The metadata to answer instead (``create_app(metadata=...)``), or ``None``.
    """

    def __init__(self, factory: Callable[..., Any], given: EnvironmentMetadata | None = None) -> None:
        self._factory = factory
        self._found = given
        self._lock = threading.Lock()

    def __call__(self) -> EnvironmentMetadata:
        """The metadata (read from the factory the first time: this may build an environment, and block)."""
        if self._found is None:
            with self._lock:
                if self._found is None:
                    self._found = environment_metadata(self._factory)
        return self._found

    async def read(self) -> EnvironmentMetadata:
        """The metadata, from the event loop: the first read runs on a worker thread."""
        if self._found is not None:
            return self._found
        return await anyio.to_thread.run_sync(self)

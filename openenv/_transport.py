"""The `Transport` contract: an ordered, bidirectional channel of frames for one session."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any

from ._messages import Dialect

__all__ = ["Transport"]


class Transport(ABC):
    """An ordered, bidirectional channel of frames to one server session.

    This docstring is the whole contract; a third-party transport implements the
    four methods below and nothing else. A transport knows nothing of resets or
    steps: it moves opaque frames (``bytes``, already encoded), in order, in both
    directions. Request ids, timeouts, late replies and error frames are the
    client's business, above it.

    - ``async with transport:`` connects (`__aenter__`) and closes (`__aexit__`,
      which calls `aclose`). Entering and leaving happen in the same task, so a
      transport may run background tasks (a reader that answers pings, say) in a
      task group it opens on entry. Failing to connect raises `ConnectError`.
    - `send` hands one whole frame to the channel. It either sends it whole or
      fails; if it is interrupted part-way, the channel is broken and later calls
      raise `ConnectionClosed`.
    - `receive` returns the next frame from the server. When the peer closes the
      channel, or the network breaks it, it raises `ConnectionClosed`.
    - `aclose` closes the channel; it is idempotent and never raises for an
      already-broken channel. After it, `send` and `receive` raise `ConnectionClosed`.

    Failures of the transport's own I/O library are translated at this boundary
    into openenv's exceptions (`ConnectError`, `ConnectionClosed`,
    `ProtocolError`); none escapes. Cancellation always passes through untouched.

    Attributes:
        dialect: How frames are written on this channel, as negotiated on connect.
            Plain OpenEnv (``Dialect()``) unless the transport negotiated more;
            read it only after entering.
    """

    dialect: Dialect = Dialect()

    @abstractmethod
    async def __aenter__(self) -> Any:
        """Open the channel; return the transport itself.

        Raises:
            ConnectError: The channel could not be opened.
        """

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the channel (see `aclose`)."""
        await self.aclose()

    @abstractmethod
    async def send(self, frame: bytes) -> None:
        """Send one frame.

        Raises:
            ConnectionClosed: The channel is closed or broken.
        """

    @abstractmethod
    async def receive(self) -> bytes:
        """Receive the next frame.

        Raises:
            ConnectionClosed: The peer closed the channel, or it broke.
            ProtocolError: The peer sent something that is not a frame.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Close the channel; idempotent, and safe on a broken channel."""

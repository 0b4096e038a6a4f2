"""A transport that carries its frames on another one it opens: `http+mcp://` and `project://`."""

from __future__ import annotations

from openenv import ConnectionClosed, Transport

__all__ = ["WrappingTransport"]


class WrappingTransport(Transport):
    """Sends, receives and does its idle work on ``_inner``, the transport it opened.

    A subclass opens ``_inner`` in ``__aenter__`` and says in `_is_open`
    whether it may still be used.
    """

    _inner: Transport | None = None

    def _is_open(self) -> bool:
        """Whether frames may go through ``_inner`` (it is set, and the subclass has not closed)."""
        return self._inner is not None

    def _channel(self) -> Transport:
        if self._inner is None or not self._is_open():
            raise ConnectionClosed("the transport is not connected")
        return self._inner

    async def send(self, frame: bytes) -> None:
        """Send one frame on the inner transport.

        Args:
            frame: The encoded frame.

        Raises:
            ConnectionClosed: The channel is closed or broken.
        """
        await self._channel().send(frame)

    async def receive(self) -> bytes:
        """Receive the next frame from the inner transport.

        Returns:
            The frame.

        Raises:
            ConnectionClosed: The channel is closed or broken.
        """
        return await self._channel().receive()

    async def keep(self) -> None:
        """The inner transport's idle work (answering pings, resuming), run by the client's owner."""
        if self._inner is not None:
            await self._inner.keep()

"""A transport that carries its frames on another one it opens: `http+mcp://` and `project://`."""

from __future__ import annotations

from openenv import ConnectionClosed, Transport
from openenv._lane import BlockingLane, BlockingLanes

__all__ = ["WrappingTransport"]


class WrappingTransport(Transport):
    """Sends, receives and does its idle work on ``_inner``, the transport it opened.

    A subclass opens its inner transport in ``__aenter__``, hands it to
    `_wrap`, and says in `_is_open` whether it may still be used. What the
    inner transport can do without waiting (`send_nowait`, `receive_nowait`,
    ``send_waits``) the wrapper can too, so an `openenv.EnvPool` batches its
    sessions as it would on the inner transport's own.
    """

    _inner: Transport | None = None

    def _wrap(self, inner: Transport) -> None:
        """Carry the frames on ``inner``, an open transport; take on its dialect and whether its sends wait."""
        self._inner = inner
        self.dialect = inner.dialect
        self.send_waits = inner.send_waits

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

    def send_nowait(self, frame: bytes) -> None:
        """Hand one frame to the inner transport at once, if it can without waiting.

        Raises:
            anyio.WouldBlock: It cannot: await `send` instead.
            ConnectionClosed: The channel is closed or broken.
        """
        self._channel().send_nowait(frame)

    def receive_nowait(self) -> bytes:
        """A frame the inner transport holds already, without waiting.

        Raises:
            anyio.WouldBlock: It holds none: await `receive` instead.
            ConnectionClosed: The channel has ended and every frame was returned.
        """
        return self._channel().receive_nowait()

    @property
    def lent(self) -> bool:
        """Whether the inner transport's connection is lent to a blocking client's threads now."""
        return bool(getattr(self._inner, "lent", False))

    def blocking_lane(self) -> BlockingLane | None:
        """The inner transport's lane for a blocking client's threads, if it has one (see `openenv._lane`)."""
        inner = self._inner
        if not isinstance(inner, BlockingLanes) or not self._is_open():
            return None
        return inner.blocking_lane()

    async def keep(self) -> None:
        """The inner transport's idle work (answering pings, resuming), run by the client's owner."""
        if self._inner is not None:
            await self._inner.keep()

"""The `Transport` contract: an ordered, bidirectional channel of frames for one session."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Any

import anyio

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
      which calls `aclose`). Failing to connect raises `ConnectError`. Entering
      and leaving may happen in different tasks and under different cancel scopes
      (a client connected in one task is closed from another).
    - **A transport starts no task of its own.** Its I/O is done by the calls
      made on it: `receive` reads (the first of several callers waiting may read
      for all of them), `send` and `aclose` write. Work that must go on while
      nobody calls (answering a server's pings, pinging a quiet server, noticing
      a dropped connection) is `keep`, which the transport's *owner* runs in a
      task of its own, in a task group the owner holds: the client entered with
      ``async with``, an `EnvPool`, the blocking facades. A transport works
      without it: a client opened with ``await client.connect()`` has no owner,
      and its idle work waits for its next call.
    - `send` hands one whole frame to the channel. It either sends it whole or
      fails; if it is interrupted part-way, the channel is broken and later calls
      raise `ConnectionClosed` (unless the transport resumes the channel: then
      the frame is sent again). A transport that carries many sessions may hold
      a frame until the next `receive` or `aclose` of any of them, so that the
      frames of one turn of the event loop travel together.
    - `receive` returns the next frame from the server. When the peer closes the
      channel, or the network breaks it, it raises `ConnectionClosed`.
    - `send_nowait` and `receive_nowait` are optional: a transport that can
      hand a frame over, or take one it already holds, without waiting does so
      there and then; the others raise `anyio.WouldBlock` (the default), and the
      caller awaits `send` or `receive`. An `EnvPool` steps many sessions with them.
    - `keep` does the transport's idle work until the channel is closed (or
      returns at once if it has none; the default). Its owner cancels it before
      leaving the task group it runs in.
    - `aclose` closes the channel; it is idempotent and never raises for an
      already-broken channel. After it, `send` and `receive` raise `ConnectionClosed`.

    Failures of the transport's own I/O library are translated at this boundary
    into openenv's exceptions (`ConnectError`, `ConnectionClosed`,
    `ProtocolError`); none escapes. Cancellation always passes through untouched.

    A transport is registered for a URL scheme with `register_transport` (or the
    ``openenv.transports`` entry-point group), or handed to a client directly as
    ``EnvClient(transport=...)``; the client enters it, and closes it.

    Examples:
        A transport that wraps another and counts the frames it carries:

        ```python
        import openenv
        from openenv.examples.echo import EchoEnv


        class CountingTransport(openenv.Transport):
            def __init__(self, inner: openenv.Transport) -> None:
                self.inner = inner
                self.frames = 0

            async def __aenter__(self) -> "CountingTransport":
                await self.inner.__aenter__()
                self.dialect = self.inner.dialect  # speak what the inner one negotiated
                return self

            async def __aexit__(self, *exc_info: object) -> None:
                await self.inner.__aexit__(None, None, None)

            async def send(self, frame: bytes) -> None:
                await self.inner.send(frame)
                self.frames += 1

            async def receive(self) -> bytes:
                frame = await self.inner.receive()
                self.frames += 1
                return frame

            async def keep(self) -> None:
                await self.inner.keep()  # the inner one's idle work, run by the client's owner

            async def aclose(self) -> None:
                await self.inner.aclose()


        transport = CountingTransport(openenv.create_transport("ws://127.0.0.1:8000"))
        async with EchoEnv(transport=transport) as env:
            await env.reset()
            await env.state()
        print(transport.frames)  # 5: two requests, two replies, and the close request
        ```

    Attributes:
        dialect: How frames are written on this channel, as negotiated on connect.
            Plain OpenEnv (``Dialect()``) unless the transport negotiated more;
            read it only after entering.
        send_waits: Whether `send` may wait on the server (its answer to an HTTP
            request, say) rather than only on the network taking the bytes. An
            `EnvPool` sends a batch's requests one after the other from one task
            over transports that do not (the default, ``True``, is the safe
            assumption: each such session's request is then made in a task of
            its own).
    """

    dialect: Dialect = Dialect()
    send_waits: bool = True

    @abstractmethod
    async def __aenter__(self) -> Any:
        """Open the channel, and set `dialect` to what was negotiated.

        Returns:
            The transport itself.

        Raises:
            ConnectError: The channel could not be opened.
        """

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the channel (see `aclose`).

        Args:
            exc_type: The type of the exception that ended the block, if any.
            exc_value: That exception, if any.
            traceback: Its traceback, if any.
        """
        await self.aclose()

    @abstractmethod
    async def send(self, frame: bytes) -> None:
        """Send one frame, whole.

        Args:
            frame: The encoded frame, in the `dialect`'s encoding.

        Raises:
            ConnectionClosed: The channel is closed or broken (or was never opened).
        """

    @abstractmethod
    async def receive(self) -> bytes:
        """Receive the next frame from the server, waiting for it.

        Frames that arrived before the channel closed are returned first.

        Returns:
            The frame, as the server encoded it.

        Raises:
            ConnectionClosed: The peer closed the channel, or it broke, or
                `aclose` was called.
            ProtocolError: The peer sent something that is not a frame.
        """

    def send_nowait(self, frame: bytes) -> None:
        """Hand one frame over at once, if the transport can without waiting (it queues frames, say).

        Args:
            frame: The encoded frame.

        Raises:
            anyio.WouldBlock: It cannot (the default): await `send` instead.
            ConnectionClosed: The channel is closed or broken.
        """
        raise anyio.WouldBlock

    def receive_nowait(self) -> bytes:
        """A frame from the server that the transport holds already, without waiting.

        Returns:
            The frame.

        Raises:
            anyio.WouldBlock: It holds none (or cannot tell: the default): await `receive` instead.
            ConnectionClosed: The channel has ended and every frame was returned.
        """
        raise anyio.WouldBlock

    async def keep(self) -> None:  # noqa: B027 - optional: most transports have no idle work
        """Do the channel's idle work until it is closed; the default has none and returns at once.

        The transport's owner runs it in a task of its own from connect to
        close and cancels it when done. It must never raise: what goes wrong
        is reported to the next `send` or `receive`. A transport's idle work is
        what must happen while nobody calls: answering the server's pings,
        pinging a quiet server, noticing and resuming a dropped connection.
        """

    @abstractmethod
    async def aclose(self) -> None:
        """Close the channel; idempotent, and never raises for a broken channel.

        Afterwards `send` and `receive` raise `ConnectionClosed`.
        """

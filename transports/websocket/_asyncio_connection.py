"""One open WebSocket connection on asyncio: websockets' own asyncio client, behind `Connection`'s interface.

On asyncio, websockets' `ClientConnection` is an asyncio `Protocol`: the event
loop hands it each read as it comes, it parses the frames there and wakes the
task waiting in ``recv`` (a read of nothing but whole data frames, the usual
reply, is read past websockets' parser: see `_ClientConnection.data_received`).
Driving the sans-I/O protocol over an anyio stream from a reader task of ours
costs a task switch per message more, and anyio's stream stops and restarts
the socket's polling (two ``epoll_ctl`` calls) around every read that waits.
So on asyncio the transport connects with websockets' ``connect``, and on
trio it keeps `transports.websocket._connection.Connection`.

Both are used the same way (`transports.websocket._connection.OpenConnection`)
and behave the same: the transport's headers replace defaults of the same
name, a redirect is not followed, the errors say the same things (see
`transports.websocket._connection.closed_error`), and a server that does not
answer a keepalive ping has its socket closed at once (websockets' own
keepalive would wait for a closing handshake first).
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import Callable
from typing import NoReturn, cast

import anyio
from websockets.asyncio.client import ClientConnection, connect
from websockets.client import ClientProtocol
from websockets.datastructures import Headers, HeadersLike
from websockets.exceptions import ConnectionClosed as WebSocketClosed
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.typing import Subprotocol

from openenv import Clock, ConnectionClosed
from openenv.channel import start_background

from .._network_client import ConnectionEnd
from ._connection import PEER_PROTOCOL_ERRORS, RECEIVE_BUFFER, closed_error
from ._quick_frames import whole_data_frames

__all__ = ["AsyncioConnection", "HandshakeFailed"]


class HandshakeFailed(Exception):
    """The server's response failed the handshake: websockets' reason, and the response if one came.

    A class of its own so that websockets' ``connect`` does not follow a redirect.
    """

    def __init__(self, reason: Exception, response: Response | None) -> None:
        super().__init__(str(reason))
        self.reason = reason
        self.response = response


class _ClientConnection(ClientConnection):
    """websockets' client connection, with the request's headers set by the transport, reading whole frames quickly.

    A read that holds nothing but whole data frames, as the server's replies
    usually are, goes to the receiving side without websockets' parser (see
    `data_received`).
    """

    def __init__(
        self,
        protocol: ClientProtocol,
        *,
        set_headers: Callable[[Headers], None],
        max_message_size: int | None,
        **options: object,
    ):
        super().__init__(protocol, **options)  # type: ignore[arg-type]
        self._set_headers = set_headers
        self._max_message_size = max_message_size

    async def handshake(
        self, additional_headers: HeadersLike | None = None, user_agent_header: str | None = None
    ) -> None:
        request = self.request = self.protocol.connect()
        self._set_headers(request.headers)
        async with self.send_context(expected_state=State.CONNECTING):
            self.protocol.send_request(request)
        # The response, or the connection's end (which leaves none).
        response_rcvd = self.response_rcvd

        def connection_lost(_: object) -> None:
            if not response_rcvd.done():
                response_rcvd.set_result(None)

        self.connection_lost_waiter.add_done_callback(connection_lost)
        await response_rcvd
        reason = self.protocol.handshake_exc
        if reason is not None:
            raise HandshakeFailed(reason, self.response)

    def data_received(self, data: bytes) -> None:
        """Queue the messages of a read of whole data frames for ``recv``; hand any other read to websockets.

        The parser, a chain of generators reading byte ranges into `Frame`
        objects and events, costs far more than such a frame needs. It is
        skipped only between frames (nothing buffered, no fragmented message
        begun) on an open connection without extensions and without debug
        logging, where it would only have made these frames into messages; it
        reads anything else (see `whole_data_frames`). The messages go to the
        same queue as the parser's, with its flow control, in order.
        """
        protocol = self.protocol
        if (
            protocol.state is State.OPEN
            and protocol.current_size is None
            and not protocol.reader.buffer
            and not protocol.extensions
            and not protocol.debug
        ):
            messages = whole_data_frames(data, self._max_message_size, masked=False)
            if messages is not None:
                put = self.recv_messages.put
                for is_text, payload in messages:
                    put(Frame(Opcode.TEXT if is_text else Opcode.BINARY, payload))
                return
        super().data_received(data)


class AsyncioConnection:
    """An open WebSocket connection on asyncio: send and receive messages, close it; built by `open`.

    Attributes:
        url: The WebSocket URL, for error messages.
    """

    def __init__(self, websocket: ClientConnection, *, url: str) -> None:
        self.url = url
        self._websocket = websocket
        self._text = True
        self._receive_turn = anyio.Lock(fast_acquire=True)  # websockets lets one task at a time receive
        self._end = ConnectionEnd(url, "WebSocket connection")  # the client's close, or a failure of ours

    @classmethod
    async def open(
        cls,
        url: str,
        offer: list[Subprotocol],
        *,
        set_headers: Callable[[Headers], None],
        compression: bool,
        max_message_size: int | None,
        ping_interval: float | None,
        ping_timeout: float | None,
        close_timeout: float,
        ssl_context: ssl.SSLContext | None,
        clock: Clock,
    ) -> AsyncioConnection:
        """Connect and perform the handshake (the caller bounds how long it may take).

        Args:
            url: The WebSocket URL.
            offer: The subprotocols to offer, most preferred first.
            set_headers: Sets the transport's headers on the upgrade request's.
            compression: Offer permessage-deflate.
            max_message_size: The largest message accepted, in bytes (``None``: no limit).
            ping_interval: Seconds between keepalive pings (``None``: no pings).
            ping_timeout: Seconds a pong may take before the connection is declared dead.
            close_timeout: Seconds the server gets to end the TCP connection after a close frame.
            ssl_context: The TLS settings of a ``wss://`` URL.
            clock: Where the keepalive's interval and timeout are measured.

        Returns:
            The connection, sending text frames until `use_binary` says otherwise.

        Raises:
            HandshakeFailed: The server's response failed the handshake.
            OSError: The socket failed (DNS, TCP, TLS).
            websockets.exceptions.WebSocketException: The response was not one.
        """
        factory = functools.partial(_ClientConnection, set_headers=set_headers, max_message_size=max_message_size)
        websocket = await connect(
            url,
            create_connection=cast(type[ClientConnection], factory),  # called as the class would be
            subprotocols=offer or None,
            compression="deflate" if compression else None,
            max_size=max_message_size,
            max_queue=RECEIVE_BUFFER,
            ping_interval=None,  # ours: a dead server's connection is dropped at once (see `_keepalive`)
            close_timeout=close_timeout,
            open_timeout=None,
            proxy=None,
            user_agent_header=None,
            ssl=ssl_context,
        )
        connection = cls(websocket, url=url)
        if ping_interval is not None:
            try:
                keepalive = await start_background(lambda: connection._keepalive(ping_interval, ping_timeout, clock))
            except BaseException:
                websocket.transport.abort()
                raise
            websocket.connection_lost_waiter.add_done_callback(lambda _: keepalive.cancel())
        return connection

    @property
    def subprotocol(self) -> str | None:
        """The subprotocol the server selected, if any."""
        return self._websocket.subprotocol

    def use_binary(self) -> None:
        """Send binary frames (msgpack) instead of text frames, once the dialect is known."""
        self._text = False

    async def send(self, message: bytes) -> None:
        """Send one message. Raises `ConnectionClosed` if the connection is not open."""
        if self._end.by_client:
            self._raise_closed(receiving=False)
        websocket = self._websocket
        protocol = websocket.protocol
        if protocol.state is not State.OPEN or websocket.send_in_progress is not None:
            # Closing, closed, or a fragmented message going out: websockets' own send
            # waits its turn or says how the connection ended.
            try:
                await websocket.send(message, text=self._text)
            except WebSocketClosed:
                self._raise_closed(receiving=False)
            return
        # What websockets' send does for an open connection, without its context
        # manager (an async generator per message): frame the message, write it
        # out, wait while the socket's buffer is full.
        if self._text:
            protocol.send_text(message)
        else:
            protocol.send_binary(message)
        try:
            websocket.send_data()
            await websocket.drain()
        except Exception as exc:  # the socket failed: end the connection as websockets' send would
            websocket.set_connection_exc(exc)
            websocket.transport.abort()
            await websocket.wait_closed()
            self._raise_closed(receiving=False)

    async def receive(self) -> bytes:
        """The next message; raises once the connection ended and every earlier message was taken."""
        turn = self._receive_turn
        try:
            turn.acquire_nowait()  # the usual case, nobody else receiving: no checkpoint (recv has its own)
        except anyio.WouldBlock:
            await turn.acquire()
        try:
            if self._end.by_client:
                self._raise_closed(receiving=True)
            return await self._websocket.recv(decode=False)
        except WebSocketClosed:
            self._raise_closed(receiving=True)
        finally:
            turn.release()

    async def aclose(self) -> None:
        """The closing handshake (code 1000), then the socket; bounded by the close timeout, idempotent.

        Shielded: it completes under any cancel scope of the caller's.
        """
        if self._end.by_client:
            return
        self._end.close_by_client()
        with anyio.CancelScope(shield=True):
            await self._websocket.close(CloseCode.NORMAL_CLOSURE)
            await self._websocket.wait_closed()

    async def wait_ended(self) -> None:
        """Return once the connection has ended and its socket is closed, however it ended."""
        await self._websocket.wait_closed()

    @property
    def dropped(self) -> bool:
        """Whether the connection ended with neither side closing it on purpose (see `Connection.dropped`)."""
        protocol = self._websocket.protocol
        if protocol.state is not State.CLOSED or self._end.by_client or protocol.close_rcvd is not None:
            return False
        return not isinstance(protocol.parser_exc, PEER_PROTOCOL_ERRORS)

    def closed_error(self) -> ConnectionClosed:
        """The error that says why the connection is not usable (for a connection that ended)."""
        try:
            self._raise_closed(receiving=False)
        except ConnectionClosed as exc:
            return exc

    async def _keepalive(self, interval: float, timeout: float | None, clock: Clock) -> None:
        """Ping every ``interval`` seconds; drop the connection if a pong is ``timeout`` late.

        A server that does not answer is not waited on for a closing handshake
        either (websockets' own keepalive would): the socket is closed at once.
        """
        websocket = self._websocket
        while True:
            await clock.sleep(interval)
            try:
                pong = await websocket.ping()
            except WebSocketClosed:
                return
            if timeout is None:
                continue
            with clock.move_on_after(timeout) as scope, contextlib.suppress(WebSocketClosed):
                await pong
            if scope.cancelled_caught:
                self._end.note(
                    ConnectionClosed(f"the server at {self.url} did not answer a keepalive ping within {timeout} s")
                )
                websocket.transport.abort()
                return

    def _raise_closed(self, *, receiving: bool) -> NoReturn:
        raise closed_error(self.url, self._websocket.protocol, self._end, receiving=receiving)

"""Resumable WebSocket sessions: a session that outlives a dropped connection.

A client that offers a resumable subprotocol (``openenv.v1.json.resumable``,
``openenv.v1.msgpack.resumable``) gets, as the first frame after the handshake,
a ``session`` frame::

    {"type": "session", "data": {"resume_token": "...", "resume_timeout": 30.0, "last_request_id": 0}}

If its connection drops (without a closing handshake: a connection closed
on purpose ends the session, as on the other subprotocols), the session (and
its environment) waits ``resume_timeout`` seconds for it: a new connection offering the same
subprotocol with the handshake header ``OpenEnv-Resume: <resume_token>`` takes
the session over. It gets the ``session`` frame again, whose
``last_request_id`` is the highest request id the server has received, then the
last reply the server sent (it may have been lost with the connection; a client
drops a reply it already has, by its id). The client then sends again only the
requests with a higher id: a request the server has received is never run twice
(one sent again anyway is answered with the last reply if it is that reply's
request, ignored if it is the request still being handled, whose reply is to
come, and otherwise answered with a ``VALIDATION_ERROR``). Request ids are
positive and below 2**63 (`MAX_REQUEST_ID`): another id gets a
``VALIDATION_ERROR`` too, and is not noted, so a huge one cannot leave the
session no id above it. A token that is unknown or expired gets a
``SESSION_ERROR`` frame and the connection closes.

Plain OpenEnv clients, and ours offering the other subprotocols, never see any
of this: their session ends with their connection, as OpenEnv's does.
"""

from __future__ import annotations

import secrets
from typing import Any, Final

import anyio
import msgspec

from openenv import ConnectionClosed, Dialect

from .._asgi import Receive, Send
from ._socket_loan import LendSocket, SocketLoan
from ._subprotocols import RESUME_HEADER, SessionData, SessionFrame

__all__ = ["DEFAULT_RESUME_TIMEOUT", "MAX_REQUEST_ID", "RESUME_HEADER", "Connection", "ResumableLink"]

DEFAULT_RESUME_TIMEOUT: Final = 30.0
"""Seconds a resumable session waits for its client to come back after its connection drops."""

MAX_REQUEST_ID: Final = 2**63 - 1
"""The highest request id a resumable session takes (a signed 64-bit integer, as MessagePack and most clients hold)."""


# The close codes ASGI servers report for a connection that dropped without a
# closing handshake (uvicorn says 1005, hypercorn 1006): the client may come
# back. Any other code is a close on purpose (1000 from a client; 1009 from the
# server's message limit, say), which ends the session.
_DROPPED = frozenset({1005, 1006})


class _RequestId(msgspec.Struct):
    id: int | None = None


class Connection:
    """One WebSocket connection of a resumable session: its ASGI callables, until it is let go.

    Args:
        receive: The connection's ASGI ``receive``.
        send: The connection's ASGI ``send``.
        lend: The server's `LendSocket`, if it can lend the socket to the session's thread.
    """

    def __init__(self, receive: Receive, send: Send, lend: LendSocket | None = None) -> None:
        self.receive = receive
        self.send = send
        self.lend = lend
        self.released = anyio.Event()
        self.disconnected = False


class ResumableLink:
    """The session's side of a resumable WebSocket session: frames to and from whichever connection it has now.

    Args:
        first: The connection the session started on.
        dialect: The session's dialect.
        resume_timeout: Seconds to wait for a new connection after one drops.
    """

    def __init__(self, first: Connection, dialect: Dialect, resume_timeout: float) -> None:
        self.current: Connection | None = first
        self.dialect = dialect
        self.resume_timeout = resume_timeout
        self.token = secrets.token_urlsafe(32)
        self.last_request_id = 0
        self.last_reply: bytes | None = None
        self._last_reply_id = 0
        self._binary = dialect.encoding == "msgpack"
        self._decode_id = (msgspec.msgpack if self._binary else msgspec.json).Decoder(_RequestId).decode
        self._encode = (msgspec.msgpack if self._binary else msgspec.json).Encoder().encode
        self._attached = anyio.Event()
        self._receiving: anyio.CancelScope | None = None
        self.lent: SocketLoan | None = None  # the current connection's socket, while the session's thread has it

    def session_frame(self) -> bytes:
        """The ``session`` frame: the token, the timeout, and the highest request id received."""
        data = SessionData(self.token, self.resume_timeout, self.last_request_id)
        frame: bytes = self._encode(SessionFrame("session", data))
        return frame

    async def send_raw(self, connection: Connection, frame: bytes) -> None:
        """Send one frame on ``connection``; a failure is left for its `receive` to act on.

        The connection is let go only once its ``receive`` reports the
        disconnect: what the client sent before it went comes first, and may
        be a ``close`` request (sent while a step ran), which ends the session
        at once instead of after the resume timeout.
        """
        try:
            if self._binary:
                await connection.send({"type": "websocket.send", "bytes": frame})
            else:
                await connection.send({"type": "websocket.send", "text": frame.decode()})
        except OSError:
            connection.disconnected = True

    def detach(self, connection: Connection) -> None:
        """Let a connection go: the session now waits for the client to come back."""
        if self.current is connection:
            self.current = None
        connection.released.set()

    async def attach(self, connection: Connection) -> Connection | None:
        """Take the session over on a new connection; returns the one it replaces, if any.

        The new connection gets the ``session`` frame and the last reply.
        """
        if self.lent is not None:  # the thread writes no more replies on the previous connection
            self.lent.stop()
        previous, self.current = self.current, connection
        if previous is not None:
            previous.released.set()
        if self._receiving is not None:  # stop waiting on the previous connection
            self._receiving.cancel()
        self._attached.set()
        self._attached = anyio.Event()
        await self.send_raw(connection, self.session_frame())
        if self.last_reply is not None and self.current is connection:
            await self.send_raw(connection, self.last_reply)
        return previous

    async def _connection(self) -> Connection:
        """The current connection, waiting up to the resume timeout for one."""
        if self.current is not None:  # every request but the first after a drop: no timer to set
            return self.current
        with anyio.move_on_after(self.resume_timeout):
            while self.current is None:
                await self._attached.wait()
        if self.current is None:
            raise ConnectionClosed(f"the client did not come back within {self.resume_timeout:g} s")
        return self.current

    async def receive(self) -> dict[str, Any] | None:
        """The next ASGI message of the current connection, or ``None`` if that connection was replaced.

        Raises:
            ConnectionClosed: The client closed the connection on purpose (a
                closing handshake), or did not come back in time.
        """
        connection = await self._connection()
        with anyio.CancelScope() as scope:
            self._receiving = scope
            try:
                message: dict[str, Any] = await connection.receive()
            finally:
                self._receiving = None
        if scope.cancelled_caught:
            return None
        if message["type"] == "websocket.disconnect":
            connection.disconnected = True
            self.detach(connection)
            code = message.get("code", 1005)
            if code not in _DROPPED:
                raise ConnectionClosed(f"the client closed the connection ({code}): it will not come back")
        return message

    async def take(self, frame: bytes) -> bool:
        """Note a request's id; whether the session should handle it.

        A request received before is not handled again: if the last reply
        answers it, that reply is sent again; otherwise it is dropped.
        """
        try:
            request_id = self._decode_id(frame).id
        except msgspec.DecodeError:
            return True  # the session answers it with the error it deserves
        if self.is_new(request_id):
            self.note(request_id)
            return True
        assert request_id is not None
        connection = self.current
        if connection is None:
            return False
        if request_id == self._last_reply_id and self.last_reply is not None:
            await self.send_raw(connection, self.last_reply)
        elif not 0 < request_id <= MAX_REQUEST_ID:
            await self.send_raw(connection, self._id_error(request_id, f"a request id is from 1 to {MAX_REQUEST_ID}"))
        elif request_id != self.last_request_id:  # else it is being handled: its reply is to come
            reason = (
                f"request {request_id} was received before (the last received is {self.last_request_id}), "
                "and its reply is no longer kept"
            )
            await self.send_raw(connection, self._id_error(request_id, reason))
        return False

    def _id_error(self, request_id: int, reason: str) -> bytes:
        """The ``VALIDATION_ERROR`` reply to a request whose id the session cannot take (with that id, if it fits)."""
        error = {"type": "value_error", "loc": ["id"], "msg": reason}
        reply: dict[str, Any] = {
            "type": "error",
            "data": {"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": [error]},
        }
        if -MAX_REQUEST_ID - 1 <= request_id <= MAX_REQUEST_ID:
            reply["id"] = request_id
        frame: bytes = self._encode(reply)
        return frame

    def is_new(self, request_id: int | None) -> bool:
        """Whether the session should take this request: not received before, its id in range (or no id)."""
        return request_id is None or self.last_request_id < request_id <= MAX_REQUEST_ID

    def note(self, request_id: int | None) -> None:
        """Note that the session handles this request: it is never handled again."""
        if request_id is not None:
            self.last_request_id = request_id

    def replied(self, frame: bytes) -> None:
        """Keep a reply sent to the latest request, so a client that comes back gets it."""
        self.last_reply = frame
        self._last_reply_id = self.last_request_id  # requests are answered in order

    async def send(self, frame: bytes) -> None:
        """Send a reply on the current connection; kept, so a client that comes back gets it."""
        self.replied(frame)
        connection = self.current
        if connection is not None:
            await self.send_raw(connection, frame)

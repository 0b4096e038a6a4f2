"""Resumable sessions, client side: a session that outlives its TCP connection.

Over a resumable subprotocol the server's first frame is a ``session`` frame
with a resume token (the server's side: `transports.websocket._resume`).
`ResumableConnection` keeps the token and stands for the session's current
connection. When that connection drops (EOF or a reset without a closing
handshake, a failed write, a keepalive timeout), a background task reconnects
at once with the token, retrying until the session's grace period runs out,
whether or not the caller is waiting: an agent thinking for a minute loses
nothing to a blip in the middle of it. A connection that the server closed (a
close frame: the session ended, idled out, or the server is stopping), that the
client closed, or on which the server broke the protocol is never resumed.

On the new connection the server says which request it received last; the
requests sent after it are sent again, in order, before any new one. The
server then sends its last reply again, in case it was lost; a reply whose id
is not above the last one received is dropped. So a request is never run
twice and none is lost, and the caller (`openenv.EnvClient`) sees one ordered
channel: a ``send`` or ``receive`` that meets the drop waits for the new
connection. If the session cannot be resumed (the grace period ran out, the
server refused the token, say because it restarted), they raise
`ConnectionClosed` saying so and why.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import msgspec

from openenv import AuthenticationError, Clock, ConnectError, ConnectionClosed, OpenEnvError
from openenv.channel import BackgroundTask, start_background

from .._network_client import ConnectionEnd
from ._connection import OpenConnection
from ._subprotocols import QueuedData, SessionData

__all__ = ["FirstFrameThen", "ResumableConnection", "SessionRefused", "read_session"]

# Seconds between attempts to reconnect: the first comes at once, then they
# back off to at most a second apart, so a server that is back gets found soon.
_FIRST_RETRY_DELAY = 0.05
_MAX_RETRY_DELAY = 1.0

Reconnect = Callable[[str], Awaitable[OpenConnection]]
"""Opens a new connection to the server, presenting the given resume token (raises `ConnectError`)."""


class _RequestId(msgspec.Struct):
    id: int | None = None


class _Frame(msgspec.Struct):
    type: str
    data: msgspec.Raw = msgspec.Raw(b"null")


class _ErrorData(msgspec.Struct):
    message: str = ""
    code: str = ""


def _refused(exc: BaseException) -> bool:
    """Whether a failure to connect was a refusal (nothing listens on the port) at every address tried."""
    cause = exc.__cause__
    while cause is not None and not isinstance(cause, ConnectionRefusedError):
        inner = getattr(cause, "exceptions", None)
        if inner:
            return all(_refused_itself(e) for e in inner)
        cause = cause.__cause__
    return cause is not None


def _refused_itself(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionRefusedError) or _refused(exc)


class SessionRefused(ConnectionClosed):
    """The server answered the handshake with something other than a ``session`` frame."""

    def __init__(self, message: str, frame: bytes) -> None:
        super().__init__(message)
        self.frame = frame


async def read_session(connection: OpenConnection, *, binary: bool) -> SessionData | QueuedData:
    """Read the server's first frame on a resumable subprotocol: the ``session`` frame (or ``queued``).

    Args:
        connection: A connection that selected a resumable subprotocol.
        binary: The dialect is msgpack.

    Returns:
        The session's token, timeout and last request id; or, from a server
        at capacity that queues the session, its place in the queue (the
        ``session`` frame comes next, once a slot frees: read again).

    Raises:
        SessionRefused: The first frame is another one (an error: no such
            session, ``CAPACITY_REACHED``); it is in the exception's ``frame``.
        ConnectionClosed: The connection ended first.
    """
    module: Any = msgspec.msgpack if binary else msgspec.json
    frame = await connection.receive()
    try:
        envelope = module.decode(frame, type=_Frame)
        if envelope.type == "session":
            data: SessionData = module.decode(envelope.data, type=SessionData)
            return data
        if envelope.type == "queued":
            place: QueuedData = module.decode(envelope.data, type=QueuedData)
            return place
        if envelope.type == "error":
            error = module.decode(envelope.data, type=_ErrorData)
            raise SessionRefused(f"{error.code}: {error.message}" if error.code else error.message, frame)
    except msgspec.DecodeError:
        pass
    raise SessionRefused("the server's first frame is not a session frame", frame)


class FirstFrameThen:
    """A connection whose first frame was read ahead, and is handed out first.

    Args:
        connection: The connection.
        frame: The frame read from it ahead of the caller.
    """

    def __init__(self, connection: OpenConnection, frame: bytes) -> None:
        self._connection = connection
        self._first: bytes | None = frame

    async def send(self, message: bytes) -> None:
        """Send one message (see `Connection.send`)."""
        await self._connection.send(message)

    async def receive(self) -> bytes:
        """The frame read ahead, then the connection's next ones (see `Connection.receive`)."""
        first, self._first = self._first, None
        if first is not None:
            return first
        return await self._connection.receive()

    async def aclose(self) -> None:
        """Close the connection (see `Connection.aclose`)."""
        await self._connection.aclose()


class ResumableConnection:
    """A resumable session's connection: the current one, replaced by a new one if it drops.

    Built by `start`.

    Attributes:
        resumes: How many times the session was resumed on a new connection.
    """

    def __init__(
        self,
        first: OpenConnection,
        session: SessionData,
        *,
        url: str,
        binary: bool,
        reconnect: Reconnect,
        resume_timeout: float | None,
        clock: Clock,
    ) -> None:
        self.resumes = 0
        self._connection = first
        self._token = session.resume_token
        self._server_timeout = session.resume_timeout
        self._url = url
        self._binary = binary
        self._decode_id: Callable[[bytes], _RequestId] = (
            (msgspec.msgpack if binary else msgspec.json).Decoder(_RequestId).decode
        )
        self._reconnect = reconnect
        self._resume_timeout = resume_timeout
        self._clock = clock
        # Requests sent whose replies have not come, oldest first: sent again on a
        # new connection if the server did not receive them.
        self._unanswered: deque[tuple[int, bytes]] = deque()
        self._last_reply_id = 0
        self._changed = anyio.Event()  # set when the connection is replaced, or will never be
        self._settled = False  # the current connection ended, and nothing will replace it
        self._end = ConnectionEnd(url, "WebSocket connection")  # the client's close, or why resuming failed
        self._watcher: BackgroundTask | None = None

    @classmethod
    async def start(
        cls,
        first: OpenConnection,
        session: SessionData,
        *,
        url: str,
        binary: bool,
        reconnect: Reconnect,
        resume_timeout: float | None,
        clock: Clock,
    ) -> ResumableConnection:
        """Stand for ``first``, and start watching it.

        Args:
            first: The session's first connection, past its ``session`` frame.
            session: What that frame said.
            url: The WebSocket URL, for error messages.
            binary: The dialect is msgpack.
            reconnect: Opens a new connection presenting a resume token.
            resume_timeout: Seconds to keep trying to resume after a drop;
                ``None``: as long as the server keeps the session (its
                ``session`` frame says).
            clock: Where that time is measured.

        Returns:
            The connection, its watcher running.
        """
        connection = cls(
            first, session, url=url, binary=binary, reconnect=reconnect, resume_timeout=resume_timeout, clock=clock
        )
        connection._watcher = await start_background(connection._watch)
        return connection

    # -- the caller's side -------------------------------------------------------

    async def send(self, message: bytes) -> None:
        """Send one message; over a drop, on the new connection.

        Raises:
            ConnectionClosed: The connection ended and the session was not resumed.
        """
        request_id = self._id_of(message)
        while True:
            connection = self._connection
            entry = None
            if request_id is not None:
                # Noted before it goes out: the watcher sends it again if a drop
                # loses it. No await comes between reading the connection and this.
                entry = (request_id, message)
                self._unanswered.append(entry)
            try:
                await connection.send(message)
            except ConnectionClosed:
                await connection.wait_ended()
                if entry is not None and connection.dropped and not self._settled and not self._end.by_client:
                    return  # noted: the watcher sends it again on the new connection if the server lacks it
                if await self._next_after(connection):
                    continue
                raise
            except BaseException:
                # Cancelled: the request did not (wholly) go out; never send it later.
                if entry is not None:
                    with contextlib.suppress(ValueError):
                        self._unanswered.remove(entry)
                raise
            return

    async def receive(self) -> bytes:
        """The next message; over a drop, from the new connection, without the replies received before.

        Raises:
            ConnectionClosed: The connection ended and the session was not resumed.
            ProtocolError: The server broke the WebSocket protocol.
        """
        while True:
            connection = self._connection
            try:
                frame = await connection.receive()
            except ConnectionClosed:
                if await self._next_after(connection):
                    continue
                raise
            request_id = self._id_of(frame)
            if request_id is not None:
                if request_id <= self._last_reply_id:
                    continue  # the server's last reply, sent again on resuming: received already
                self._last_reply_id = request_id
                unanswered = self._unanswered
                while unanswered and unanswered[0][0] <= request_id:  # replies come in order
                    unanswered.popleft()
            return frame

    async def aclose(self) -> None:
        """Close: stop resuming, close the connection; idempotent, under any cancel scope."""
        if self._end.by_client:
            return
        self._end.close_by_client()
        self._notify()
        with anyio.CancelScope(shield=True):
            if self._watcher is not None:
                await self._watcher.stop()
            await self._connection.aclose()

    def _id_of(self, frame: bytes) -> int | None:
        try:
            return self._decode_id(frame).id
        except msgspec.DecodeError:
            return None

    async def _next_after(self, connection: OpenConnection) -> bool:
        """Wait until an ended ``connection`` is replaced (True) or will never be (False).

        Raises:
            ConnectionClosed: The session could not be resumed, or the client closed it.
        """
        while self._connection is connection and not self._settled and not self._end.by_client:
            changed = self._changed
            await changed.wait()
        if self._end.by_client:
            raise self._end.closed_by_client_error()
        if self._connection is not connection:
            return True
        if self._end.error is not None:
            self._end.raise_ended()
        return False

    def _notify(self) -> None:
        changed, self._changed = self._changed, anyio.Event()
        changed.set()

    # -- the watcher ---------------------------------------------------------------

    async def _watch(self) -> None:
        """Wait for the current connection to end; replace it if it dropped, until one is not resumed."""
        try:
            while True:
                connection = self._connection
                await connection.wait_ended()
                if self._end.by_client or not connection.dropped:
                    break
                self._connection = await self._resume(connection)
                self.resumes += 1
                self._notify()
        except ConnectionClosed as exc:
            self._end.note(ConnectionClosed(str(exc)), exc.__cause__)
        except Exception as exc:  # a safety net: a bug must end the session, not hang its callers
            self._end.note(ConnectionClosed(f"internal error resuming the session with {self._url}: {exc!r}"), exc)
        finally:
            self._settled = True
            self._notify()

    async def _resume(self, dropped: OpenConnection) -> OpenConnection:
        """Reconnect with the token and bring the new connection up to date.

        Raises:
            ConnectionClosed: The session could not be resumed (the message says why).
        """
        why = str(dropped.closed_error())
        budget = self._server_timeout if self._resume_timeout is None else self._resume_timeout
        clock = self._clock
        deadline = clock.now() + budget
        delay = _FIRST_RETRY_DELAY
        last_error: OpenEnvError | None = None
        while True:
            with clock.cancel_scope(deadline=deadline):
                try:
                    return await self._attempt()
                except SessionRefused as exc:
                    raise ConnectionClosed(
                        f"{why}; the session could not be resumed: the server refused it ({exc})"
                    ) from exc
                except AuthenticationError as exc:
                    raise ConnectionClosed(f"{why}; the session could not be resumed: {exc}") from exc
                except (ConnectError, ConnectionClosed) as exc:
                    if isinstance(exc, ConnectError) and _refused(exc):
                        # Nothing listens on the port: the server's process, and the
                        # session with it, is gone (a restarted one would not know it).
                        raise ConnectionClosed(
                            f"{why}; the session could not be resumed: the server is gone (connection refused)"
                        ) from exc
                    last_error = exc  # unreachable for now, or cut off again: try again
                await clock.sleep(min(delay, max(0.0, deadline - clock.now())))
                delay = min(delay * 2, _MAX_RETRY_DELAY)
            if clock.now() >= deadline:
                detail = f" (the last attempt: {last_error})" if last_error is not None else ""
                raise ConnectionClosed(
                    f"{why}; the session could not be resumed within {budget:g} s{detail}"
                ) from last_error

    async def _attempt(self) -> OpenConnection:
        """One reconnection: the handshake, the ``session`` frame, the requests the server lacks."""
        connection = await self._reconnect(self._token)
        try:
            session = await read_session(connection, binary=self._binary)
            if not isinstance(session, SessionData):  # a resumed session takes no new slot: never queued
                raise SessionRefused("the server queued a session it was asked to resume", b"")
            # Sent again in order; a request noted meanwhile (the caller's send met the
            # drop) is taken too: the loop ends only when none is left to send, and no
            # await comes between that check and the new connection taking over.
            last_sent = session.last_request_id
            while True:
                pending = [(rid, frame) for rid, frame in self._unanswered if rid > last_sent]
                if not pending:
                    break
                for request_id, frame in pending:
                    await connection.send(frame)
                    last_sent = request_id
        except BaseException:
            await connection.aclose()
            raise
        # Received by the server: never sent again.
        while self._unanswered and self._unanswered[0][0] <= session.last_request_id:
            self._unanswered.popleft()
        return connection

"""A WebSocket link's write path, client side: posted entries and frames to the socket, through one lock.

`LinkWriter` is the part of `transports.websocket._link.Link` that writes: the
frames its sessions post leave as envelopes (`transports.link._envelope`) no
larger than the server takes, through one write lock, straight to the plain
TCP socket (anyio's stream for TLS); `write_without_waiting` sends what the
socket takes at once, without the lock's wait, when a big turn of posts or a
pool's ``steps`` entry should leave before the turn ends. A failed write breaks
the connection; what that means (resume, or end every session) is the link's.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from typing import NoReturn

import anyio
import msgspec
from anyio.abc import ByteStream, SocketAttribute
from websockets.client import ClientProtocol
from websockets.frames import CloseCode
from websockets.protocol import State

from openenv import ConnectionClosed, ProtocolError
from transports.link._client import ClientLink
from transports.link._client import for_send as _for_send
from transports.link._envelope import Entry, EnvelopeCodec
from transports.link._state import ChannelState
from transports.shared._locks import acquire_promptly
from transports.shared._network_client import STREAM_ERRORS, describe
from transports.websocket._handshake import Handshaken

__all__ = ["PEER_PROTOCOL_ERRORS", "SEND_EVERY", "LinkWriter"]

SEND_EVERY = 128
"""Frames posted in one turn of the event loop after which they leave at once, without waiting for the turn's end.

So the server steps a big batch's first sessions while the client still
encodes the last ones, and the client decodes the first replies while the
server steps the rest.
"""

# The close codes websockets' protocol fails a connection with when the peer broke the protocol:
# a malformed frame, invalid UTF-8 in a text message, a message over the size limit.
PEER_PROTOCOL_ERRORS = frozenset({CloseCode.PROTOCOL_ERROR, CloseCode.INVALID_DATA, CloseCode.MESSAGE_TOO_BIG})


def _send_now(fd: int, data: bytes | memoryview) -> int:
    """Write what a non-blocking socket takes at once; the number of bytes written."""
    try:
        return os.write(fd, data)
    except (BlockingIOError, InterruptedError):
        return 0  # full: nothing written


class LinkWriter(ClientLink):
    """The write path of a WebSocket link, client side; see the module's docstring.

    Its connection's attributes are the link's, set when it takes a connection
    over (`transports.websocket._link.Link`); so are `_break` and
    `_read_what_is_left`, which a failed write calls.

    Attributes:
        server_limit: The largest message the server takes (its `Hello` says), or ``None``.
    """

    # The connection in use, and how a data message is queued on it.
    _stream: ByteStream
    _protocol: ClientProtocol
    _socket: socket.socket | None  # the plain TCP socket, written directly; None for TLS
    _send_data: Callable[[bytes], None]
    _unsent: list[bytes]  # bytes the protocol queued, taken from it and not yet written
    _write_lock: anyio.Lock
    _envelope: EnvelopeCodec | None
    _binary: bool
    _reading: bool  # a session (or the keeper) reads the socket
    _reconnect: Callable[[str], Awaitable[Handshaken]] | None  # opens a connection that takes the link over
    _token: str | None  # the link's resume token, from the server's Hello
    _broken: ConnectionClosed | ProtocolError | None  # the connection dropped; not yet replaced
    server_limit: int | None

    def _break(self, error: ConnectionClosed | ProtocolError, cause: BaseException | None = None) -> None:
        """The connection is lost (the link's: it resumes the link later, or ends every session)."""
        raise NotImplementedError

    def _read_what_is_left(self) -> None:
        """Feed the protocol what the socket still holds, without waiting (the link's read path)."""
        raise NotImplementedError

    def _post(self, channel_state: ChannelState, frame: bytes) -> None:
        """Post a frame on a shared link; every `SEND_EVERY` frames of a turn, write what is posted."""
        state = self._state
        assert state is not None
        state.post(channel_state, msgspec.Raw(frame))
        if state.outgoing_count >= SEND_EVERY:
            self.write_without_waiting()

    def write_without_waiting(self) -> None:
        """Send the posted entries, as much as the socket takes at once; the rest leaves with the next write.

        Nothing is written when a writer holds the lock (it may be part-way
        through a message), the connection is not open, or the socket is not
        ours (TLS): the entries then leave with the next flush, as any others.
        A failure to write is left for that next write to find.
        """
        state, sock = self._state, self._socket
        if (
            state is None
            or sock is None
            or self._write_lock.locked()
            or self._broken is not None
            or self._ended is not None
            or self._protocol.state is not State.OPEN
        ):
            return
        self._queue(state.outgoing())
        unsent = self._unsent
        unsent += self._protocol.data_to_send()
        data = b"".join(unsent)
        unsent.clear()
        try:
            written = _send_now(sock.fileno(), data)
        except OSError:
            written = 0
        if written < len(data):
            # Written before anything queued later: by the next flush, or by the next read (`_read_some`).
            unsent.append(data[written:])

    def _has_output(self) -> bool:
        """Whether posted entries, or bytes a write left (`write_without_waiting`), wait to be written."""
        state = self._state
        return state is not None and (state.has_outgoing or bool(self._unsent))

    async def _flush(self) -> None:
        """Send every posted entry, as one message (after what an earlier write left)."""
        state = self._state
        if state is None or not self._has_output():
            return
        lock = self._write_lock
        await acquire_promptly(lock)
        try:
            if self._broken is not None:
                if self._reconnect is None:
                    self._raise_broken()
                return  # kept: sent again once the link is resumed
            entries = state.outgoing()
            if not entries and not self._unsent:
                return
            self._check_writable()
            self._queue(entries)
            await self._write_pending()
        finally:
            lock.release()

    def _queue(self, entries: list[Entry]) -> None:
        """Hand posted entries to the protocol, in envelopes no larger than the server takes."""
        if not entries:
            return  # only what an earlier write left is to go
        assert self._envelope is not None
        for message in self._envelope.encode_within(entries, self.server_limit):
            self._send_data(message)

    def _check_writable(self) -> None:
        if self._ended is not None:
            raise _for_send(self._ended)
        if self._broken is not None or self._protocol.state is not State.OPEN:
            self._raise_broken()

    async def _write_pending(self) -> None:
        """Write every byte the protocol has queued; call with the write lock held.

        A failure breaks the connection (noted); it raises `ConnectionClosed`
        unless the link will be resumed (then what was posted is sent again).
        """
        protocol = self._protocol
        unsent = self._unsent
        try:
            while True:  # a loop: a reader may queue a pong while we wait on the socket
                unsent += protocol.data_to_send()
                if not unsent:
                    break
                # b"" is the protocol asking for EOF: the socket is closed later.
                data = unsent[0] if len(unsent) == 1 else b"".join(unsent)
                unsent.clear()
                if not data:
                    continue
                sock = self._socket
                if sock is None:
                    await self._stream.send(data)
                    continue
                # The socket is ours while the protocol is not CLOSED (after it, it may be closed,
                # and its number reused by another socket).
                view = memoryview(data)
                while view and protocol.state is not State.CLOSED:
                    sent = _send_now(sock.fileno(), view)
                    view = view[sent:]
                    if view:
                        await anyio.wait_writable(sock)  # full: wait for room, then write the rest
        except (*STREAM_ERRORS, anyio.BrokenResourceError) as exc:
            # A server that hangs up on us often said why first (a close frame with 1009,
            # message too big): read what it sent, unless a session reads already.
            if not self._reading:
                self._read_what_is_left()
            self._break(self._closed_error(f"the connection broke while sending: {describe(exc)}"), exc)
            if self._reconnect is None or self._token is None:
                self._raise_broken()
        except BaseException:
            # Interrupted (cancelled) part-way: what reached the wire is unknown.
            self._break(ConnectionClosed(f"a write to {self.url} was interrupted; the connection was abandoned"))
            raise

    def _shut_down(self) -> None:
        """End the socket's traffic now, waking whoever waits on it (its read then ends at once)."""
        with contextlib.suppress(OSError):
            (self._socket or self._stream.extra(SocketAttribute.raw_socket)).shutdown(socket.SHUT_RDWR)

    def _broken_protocol(self) -> ProtocolError | None:
        """The error to tell when the client failed the connection because the server broke the protocol."""
        protocol = self._protocol
        sent = protocol.close_sent
        if sent is None or protocol.close_rcvd is not None or sent.code not in PEER_PROTOCOL_ERRORS:
            return None
        return ProtocolError(f"the server at {self.url} broke the WebSocket protocol: {sent.reason} ({sent.code})")

    def _closed_error(self, default: str) -> ConnectionClosed | ProtocolError:
        protocol = self._protocol
        broke = self._broken_protocol()
        if broke is not None:
            return broke
        if protocol.close_rcvd is not None:
            return ConnectionClosed(f"the server at {self.url} closed the WebSocket connection: {protocol.close_rcvd}")
        return ConnectionClosed(f"{default} ({self.url})")

    def _raise_broken(self) -> NoReturn:
        error = self._ended or self._broken
        if error is None:
            error = self._closed_error("the connection was lost")
        raise _for_send(error)

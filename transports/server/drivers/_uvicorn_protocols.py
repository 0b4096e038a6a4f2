"""Uvicorn's HTTP and WebSocket protocols as `openenv serve` runs them: bounded, and cheaper per message.

The HTTP protocol closes a connection whose request headers are late. The
WebSocket protocol (websockets' sans-I/O one) reads and writes a session's
whole small data frames itself, stops reading only once a few messages wait
for the app, and lends its socket to a plain session's thread while the
connection has nothing else to do (`transports.websocket._socket_loan`).
Both read at most `_READ_SIZE` bytes at once.
"""

from __future__ import annotations

import select
from typing import Any

__all__ = ["uvicorn_http_protocol", "uvicorn_websocket_protocol"]

# The most asyncio reads from a socket at once. Its default, 256 KiB, is past
# malloc's mmap threshold: every read then maps, remaps and unmaps a buffer.
_READ_SIZE = 64 * 1024

# Messages a connection may queue for the app before uvicorn stops reading from its socket.
_WS_QUEUED_MESSAGES = 2

# Seconds a request may keep the thread a connection's socket is lent to before
# the event loop takes the connection back, to answer its pings meanwhile.
_LONG_CALL = 1.0


def _limit_read_size(transport: Any) -> None:
    if getattr(transport, "max_size", 0) > _READ_SIZE:
        transport.max_size = _READ_SIZE


def uvicorn_http_protocol(header_timeout: float, *, limit_reads: bool = True) -> Any:
    """Uvicorn's HTTP protocol (httptools or h11, as it picks), reading at most `_READ_SIZE` (if ``limit_reads``).

    It also closes a connection whose request headers are not complete within
    ``header_timeout`` seconds of their first byte (or of the connection), which
    uvicorn does not: a slow or silent client cannot hold a connection open.
    """
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HTTPProtocol(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        header_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if limit_reads:
                _limit_read_size(transport)
            self._watch_headers()

        watched_cycle: Any = None

        def data_received(self, data: bytes) -> None:
            cycle = self.cycle
            if (cycle is None or cycle.response_complete) and (
                self.header_timer is None or self.watched_cycle is not cycle
            ):
                self._watch_headers()  # the first bytes of a new request: its headers' clock starts
            super().data_received(data)

        def _watch_headers(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
            self.watched_cycle = self.cycle
            self.header_timer = self.loop.call_later(header_timeout, self._headers_late, self.cycle)

        def _headers_late(self, cycle_before: Any) -> None:
            self.header_timer = None
            transport = self.transport
            # Not once a request began since (a new cycle), nor after a WebSocket upgrade.
            if self.cycle is cycle_before and transport.get_protocol() is self and not transport.is_closing():
                transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None
            super().connection_lost(exc)

    return HTTPProtocol


def uvicorn_websocket_protocol() -> Any:
    """Uvicorn's websockets sans-I/O protocol, without a pause and a resume per message, reading small frames quickly.

    The stock class stops reading the socket after every message and resumes
    when the app takes it: two extra system calls per frame, a third of the
    server's time on a small round trip. This one stops reading only once
    `_WS_QUEUED_MESSAGES` wait unread, which still bounds what a flooding
    client can queue. It offers the app its socket, under the ASGI scope
    extension ``SOCKET_LOAN``, for a plain session's thread to read and write
    while the connection has nothing else to do (`lend_socket`), and takes it
    back from a request that keeps the thread `_LONG_CALL` seconds. Written
    against uvicorn 0.52.1 to 0.54; falls back to uvicorn's own choice where
    its internals differ.
    """
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
    except ImportError:  # pragma: no cover - a uvicorn older than 0.35
        return "auto"
    if not hasattr(WebSocketsSansIOProtocol, "send_receive_event_to_app"):  # pragma: no cover
        return "websockets-sansio"
    from websockets.protocol import State

    from transports.websocket._quick_frames import server_data_frame, whole_data_frames
    from transports.websocket._socket_loan import SOCKET_LOAN, SocketLoan

    class WebSocketProtocol(WebSocketsSansIOProtocol):
        writing_paused = False
        loan: SocketLoan | None = None
        loan_timer: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            _limit_read_size(transport)

        def handle_connect(self, event: Any) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None:  # the app may lend the socket to a session's thread
                scope["extensions"][SOCKET_LOAN] = self.lend_socket

        def lend_socket(self) -> SocketLoan | None:
            """Lend the socket to a session's thread, if the connection has nothing else to do now.

            That is: open, plain TCP, no extension, nothing read but not
            parsed or not taken by the app, nothing waiting to be written, no
            keepalive ping in flight, no loan already. The socket is not read
            on the event loop until the loan ends, and the keepalive pings
            wait for it (see `transports.websocket._socket_loan`).
            """
            conn, transport = self.conn, self.transport
            if (
                self.loan is not None
                or self.scheme != "ws"
                or not self.handshake_complete
                or self.close_sent
                or self.disconnected
                or self.read_paused
                or self.writing_paused
                or self.pending_ping_payload is not None
                or conn.state is not State.OPEN
                or conn.current_size is not None
                or conn.reader.buffer
                or conn.extensions
                or not self.queue.empty()
                or transport.is_closing()
                or transport.get_write_buffer_size()
            ):
                return None
            sock = transport.get_extra_info("socket")
            if sock is None or not hasattr(select, "poll"):  # pragma: no cover - Linux and macOS have both
                return None
            limits = [size for size in (conn.max_message_size, conn.max_fragment_size) if size is not None]
            try:
                self.loan = SocketLoan(
                    sock.fileno(),
                    max_size=min(limits) if limits else None,
                    quiet_limit=self.ping_interval or None,
                    write_back=self.write_back,
                    give_back=self.take_back,
                )
            except OSError:  # out of file descriptors for its wake-up: serve the usual way
                return None
            transport.pause_reading()
            self.stop_keepalive()
            self.loan_timer = self.loop.call_later(_LONG_CALL, self.check_loan)
            return self.loan

        def check_loan(self) -> None:
            """Take the connection back from a thread that has been answering one request for long."""
            self.loan_timer = None
            loan = self.loan
            if loan is not None and not loan.release_if_running(_LONG_CALL):
                self.loan_timer = self.loop.call_later(_LONG_CALL, self.check_loan)

        def cancel_loan_timer(self) -> None:
            if self.loan_timer is not None:
                self.loan_timer.cancel()
                self.loan_timer = None

        def write_back(self, data: bytes) -> None:
            if not self.transport.is_closing():
                self.transport.write(data)

        def take_back(self, unread: bytes) -> None:
            """The loan has ended: read the socket again, from what the thread left."""
            self.loan = None
            self.cancel_loan_timer()
            if self.disconnected or self.transport.is_closing():
                return
            if not self.close_sent:
                self.start_keepalive()
            if unread:
                self.data_received(unread)
            if not (self.read_paused or self.writing_paused or self.transport.is_closing()):
                self.transport.resume_reading()

        def stop_loan(self) -> None:
            if self.loan is not None:
                self.loan.stop()

        def connection_lost(self, exc: Exception | None) -> None:
            self.stop_loan()  # before the transport closes the socket
            self.cancel_loan_timer()
            super().connection_lost(exc)

        def shutdown(self) -> None:
            self.stop_loan()
            super().shutdown()

        # Backpressure for what the client makes the server write without the
        # app (pongs): while the socket's write buffer is over its high-water
        # mark, read nothing more, so a client that pings and never reads
        # cannot grow the buffer without bound.
        def pause_writing(self) -> None:
            super().pause_writing()
            self.writing_paused = True
            self.transport.pause_reading()

        def resume_writing(self) -> None:
            super().resume_writing()
            self.writing_paused = False
            if not self.read_paused and self.loan is None:
                self.transport.resume_reading()

        def data_received(self, data: bytes) -> None:
            if not self.read_data_frames(data):
                super().data_received(data)
            if self.writing_paused:  # the app's receive may have resumed reading meanwhile
                self.transport.pause_reading()

        def write_data_frame(self, message: Any) -> bool:
            """Send a message's frame past websockets' protocol, if nothing but a data frame can follow.

            That is: the handshake is done, the connection open, no close
            begun, no fragmented message, no extension, and the socket's
            buffer is not over its high-water mark (uvicorn waits for it).
            """
            conn = self.conn
            if (
                not self.handshake_complete
                or self.close_sent
                or self.disconnected
                or self.initial_response is not None
                or not self.writable.is_set()
                or conn.state is not State.OPEN
                or conn.expect_continuation_frame
                or conn.extensions
            ):
                return False
            data = message.get("bytes")
            if data is not None:
                if not isinstance(data, bytes):
                    return False
                self.transport.write(server_data_frame(data, text=False))
                return True
            text = message.get("text")
            if not isinstance(text, str):
                return False  # uvicorn's own send says what is wrong
            self.transport.write(server_data_frame(text.encode(), text=True))
            return True

        def read_data_frames(self, data: bytes) -> bool:
            """Hand the app the messages in ``data`` past websockets' parser, if it holds only whole data frames.

            The parser, a generator reading byte ranges through several
            layers, costs far more than such a frame needs. It is skipped only
            between frames (nothing buffered, no fragmented message begun) on
            an open connection without extensions, where it would only have
            read these frames; it reads anything else (see `whole_data_frames`).
            """
            conn = self.conn
            if conn.state is not State.OPEN or conn.current_size is not None or conn.reader.buffer or conn.extensions:
                return False
            limits = [size for size in (conn.max_message_size, conn.max_fragment_size) if size is not None]
            messages = whole_data_frames(data, min(limits) if limits else None, masked=True)
            if messages is None:
                return False
            self.utf8_checked = True  # whole_data_frames took only text in valid UTF-8
            try:
                for is_text, payload in messages:
                    self.curr_msg_data_type = "text" if is_text else "bytes"
                    self.frames = [payload]
                    self.send_receive_event_to_app()
            finally:
                self.utf8_checked = False
            return True

        utf8_checked = False

        def send_receive_event_to_app(self) -> None:
            if not self.utf8_checked and self.curr_msg_data_type == "text" and not self.close_sent:
                # Uvicorn logs a traceback for a text message that is not UTF-8: a
                # client's mistake, answered with 1007 here without one.
                try:
                    b"".join(self.frames).decode()
                except UnicodeDecodeError:
                    self.frames = []
                    self.conn.send_close(1007, "invalid UTF-8 in a text message")
                    self.handle_parser_exception()
                    return
            paused = self.read_paused
            self.read_paused = True  # keeps the base class from pausing after this message
            try:
                super().send_receive_event_to_app()
            finally:
                self.read_paused = paused
            if not paused and self.queue.qsize() >= _WS_QUEUED_MESSAGES:
                self.read_paused = True
                self.transport.pause_reading()

        async def send(self, message: Any) -> None:
            if self.loan is not None:  # the thread lets go of the socket before anything else is written
                self.loan.stop()
            if message["type"] == "websocket.send" and self.write_data_frame(message):
                return
            await super().send(message)
            if message["type"] == "websocket.http.response.body" and not message.get("more_body", False):
                # A handshake refused with a response (401, 403) is complete:
                # else uvicorn logs an error and tries to send a 500 after it.
                self.handshake_complete = True

    return WebSocketProtocol

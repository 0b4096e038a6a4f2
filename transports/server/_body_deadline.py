"""A request body must arrive in time: a deadline that grows with what has come, as Apache's ``mod_reqtimeout`` does.

The servers bound how long a request's headers may take (the runner's header
timeout), not its body: a client that declares a million bytes and sends one
every two seconds held a connection, and a server's connection slots, for as
long as it liked. `BodyDeadline` wraps the app: once the app starts reading a
request's body, the body must come within `timeout` seconds, plus a second for
every `MIN_BODY_RATE` bytes received. A body that misses its deadline gets
``408`` (with ``Connection: close``, so the server closes the connection), and
the app reads the end of the request (``http.disconnect``), as when a client
goes away.

It is part of the app, so it bounds bodies under any ASGI server. Once the body
is complete, ``receive`` is left alone (an endpoint may wait on it for the
client to go away).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Final

import msgspec

from openenv import EVENT_LOOP_CLOCK, Clock
from transports.shared._asgi import Receive, Scope, Send

__all__ = ["MIN_BODY_RATE", "BodyDeadline"]

logger = logging.getLogger("openenv.server")

MIN_BODY_RATE: Final = 64 * 1024
"""Bytes per second a request body must keep coming at, on average, past its first `BodyDeadline.timeout` seconds."""

_DISCONNECT: Final = {"type": "http.disconnect"}


class _ErrorBody(msgspec.Struct):
    code: str
    message: str


class _Error(msgspec.Struct):
    error: _ErrorBody


class BodyDeadline:
    """An ASGI middleware that ends a request whose body comes too slowly.

    Args:
        app: The app it wraps.
        timeout: Seconds a body may take, plus one per `MIN_BODY_RATE` bytes received.
        clock: Where the deadline is measured (the app's clock); the event loop's time by default.
    """

    def __init__(self, app: Any, *, timeout: float, clock: Clock = EVENT_LOOP_CLOCK) -> None:
        if not timeout > 0:
            raise ValueError(f"body_timeout must be positive, not {timeout}")
        self.app = app
        self.timeout = timeout
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a request, its body held to the deadline (the ASGI entry point).

        Args:
            scope: The connection's ASGI scope.
            receive: The ASGI ``receive`` callable.
            send: The ASGI ``send`` callable.
        """
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        clock = self.clock
        request = _TimedRequest(receive, send, clock, clock.now() + self.timeout)
        try:
            await self.app(scope, request.receive, request.send)
        except Exception:
            if not request.timed_out:
                raise
            # The app met the end of the request its body never finished (Starlette's
            # ClientDisconnect, say): answered already.


class _TimedRequest:
    """One request's ``receive`` and ``send``, its body held to a deadline."""

    __slots__ = ("_clock", "_deadline", "_receive", "_send", "body_done", "started", "timed_out")

    def __init__(self, receive: Receive, send: Send, clock: Clock, deadline: float) -> None:
        self._receive = receive
        self._send = send
        self._clock = clock
        self._deadline = deadline
        self.body_done = False
        self.started = False  # a response has begun
        self.timed_out = False

    async def receive(self) -> Any:
        if self.body_done:
            return await self._receive()
        if self.timed_out:
            return _DISCONNECT
        message: Any = None
        with self._clock.cancel_scope(deadline=self._deadline):
            message = await self._receive()
        if message is None:
            await self._time_out()
            return _DISCONNECT
        if message["type"] == "http.request":
            body = message.get("body", b"")
            self._deadline += len(body) / MIN_BODY_RATE
            if not message.get("more_body", False):
                self.body_done = True
        else:
            self.body_done = True  # the client went: what comes next is the server's
        return message

    async def _time_out(self) -> None:
        self.timed_out = True
        if self.started:  # the app answers while it reads (none of ours): just end the request
            return
        self.started = True
        body = msgspec.json.encode(
            _Error(_ErrorBody("body_timeout", "the request's body did not come in time; the connection is closed"))
        )
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        with contextlib.suppress(OSError):
            await self._send({"type": "http.response.start", "status": 408, "headers": headers})
            await self._send({"type": "http.response.body", "body": body})

    async def send(self, message: Any) -> None:
        if self.timed_out:
            return  # answered with 408 already: what the app says now goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

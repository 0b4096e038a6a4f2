"""Answering HTTP requests as raw ASGI: bounded bodies, header values, and JSON error responses.

The server's hot HTTP routes (the long-polling ones) read and write ASGI
messages directly, without Starlette's request and response objects. What they
share is here: a route is a `Handler` around a coroutine that reads the request
with `read_body`, `header`, `header_int`, `header_seconds` and `media_type`,
answers with `respond`, and raises `HTTPError` for any error response (the
`Handler` answers it with openenv's JSON error body).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from transports.shared._asgi import Receive, Scope, Send
from transports.shared._error_body import encode_error

__all__ = [
    "CONTENT_LENGTH",
    "CONTENT_TYPE",
    "JSON_TYPE",
    "NO_STORE",
    "Disconnected",
    "HTTPError",
    "Handler",
    "header",
    "header_int",
    "header_seconds",
    "json_encode",
    "media_type",
    "read_body",
    "respond",
]

CONTENT_TYPE: Final = b"content-type"
"""The ``Content-Type`` header's name, as ASGI spells header names."""
CONTENT_LENGTH: Final = b"content-length"
"""The ``Content-Length`` header's name, as ASGI spells header names."""
NO_STORE: Final = (b"cache-control", b"no-store")
"""The header that keeps a response out of every cache."""
JSON_TYPE: Final = (b"content-type", b"application/json")
"""The header of a JSON body."""

json_encode = msgspec.json.Encoder().encode
"""Encode a value as JSON bytes (one encoder, built once)."""

# The most digits a numeric header may have: far beyond any count a session
# reaches, and far below what Python refuses to parse (4,300 digits).
_MAX_HEADER_DIGITS: Final = 18


class HTTPError(Exception):
    """An error response, raised from anywhere in a request's handling; its `Handler` answers it.

    Args:
        status: The response's status.
        code: The error body's code, for programs.
        message: The error body's message, for people.
        headers: More headers of the response.
    """

    def __init__(self, status: int, code: str, message: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = list(headers)


class Disconnected(Exception):
    """The client went away while its request was being read; its `Handler` answers nothing."""


def header(scope: Scope, name: bytes) -> bytes | None:
    """The value of a request's header.

    Args:
        scope: The request's ASGI scope.
        name: The header's name, in lower case.

    Returns:
        Its first value, or ``None`` if the request has none.
    """
    for key, value in scope["headers"]:
        if key == name:
            return value  # type: ignore[no-any-return]
    return None


def header_int(value: bytes, name: str, minimum: int) -> int:
    """A header's value as a whole number.

    Args:
        value: The header's value.
        name: The header's name, for the error message.
        minimum: The smallest number allowed.

    Returns:
        The number.

    Raises:
        HTTPError: ``400 invalid_header``: not digits, too many of them, or below ``minimum``.
    """
    if not value.isdigit() or len(value) > _MAX_HEADER_DIGITS or int(value) < minimum:
        raise HTTPError(400, "invalid_header", f"{name} must be an integer of at least {minimum}, not {value!r}")
    return int(value)


def header_seconds(value: bytes, name: str) -> float:
    """A header's value as seconds.

    Args:
        value: The header's value.
        name: The header's name, for the error message.

    Returns:
        The seconds, finite and 0 or more.

    Raises:
        HTTPError: ``400 invalid_header``: not such a number.
    """
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise HTTPError(400, "invalid_header", f"{name} must be a number of seconds (0 or more), not {value!r}")
    return seconds


def media_type(value: bytes) -> str:
    """The media type of a ``Content-Type`` value, without its parameters, in lower case."""
    return value.split(b";", 1)[0].strip().lower().decode("latin-1")


async def read_body(receive: Receive, limit: int, content_length: bytes | None) -> bytes:
    """Read a request's whole body.

    Args:
        receive: The request's ASGI ``receive``.
        limit: The most bytes the body may have.
        content_length: The request's ``Content-Length``, if it has one.

    Returns:
        The body.

    Raises:
        HTTPError: ``413 body_too_large``: the body has more than ``limit`` bytes.
        Disconnected: The client went away before the body was read.
    """
    if (
        content_length is not None
        and content_length.isdigit()
        and (len(content_length) > _MAX_HEADER_DIGITS or int(content_length) > limit)
    ):
        raise HTTPError(413, "body_too_large", f"the body of {content_length.decode()} bytes exceeds {limit} bytes")
    message = await receive()
    if message["type"] != "http.request":
        raise Disconnected
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise HTTPError(413, "body_too_large", f"the body exceeds {limit} bytes")
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise HTTPError(413, "body_too_large", f"the body exceeds {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def respond(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> None:
    """Send a whole response; a client gone meanwhile is no error (what it did not get, it asks for again).

    Args:
        send: The request's ASGI ``send``.
        status: The response's status.
        headers: Its headers; its ``Content-Length`` is appended to this list.
        body: Its body.
    """
    headers.append((CONTENT_LENGTH, b"%d" % len(body)))
    try:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except OSError:
        pass


class Handler:
    """A coroutine answering requests as an ASGI app (Starlette's routes call methods as request/response endpoints).

    Args:
        handle: Called with each request's scope, ``receive`` and ``send``; it
            raises `HTTPError` for an error response (answered with
            openenv's JSON error body), `Disconnected` if the client went.
    """

    __slots__ = ("_handle",)

    def __init__(self, handle: Callable[[Scope, Receive, Send], Any]) -> None:
        self._handle = handle

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one request (the ASGI entry point)."""
        try:
            await self._handle(scope, receive, send)
        except HTTPError as error:
            body = encode_error(error.code, error.message)
            await respond(send, error.status, [JSON_TYPE, NO_STORE, *error.headers], body)
        except Disconnected:
            pass

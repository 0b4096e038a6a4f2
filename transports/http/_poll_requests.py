"""Reading the long-polling server's requests: their OpenEnv headers, a creation's options, a frame's body.

Both endpoints, ``/poll/sessions`` (`transports.http._server`) and
``/poll/links`` (`transports.http._link_server`), take the same headers on their
frame requests and the same body on their creations; they read them here, and
answer what is wrong with the same errors (`transports.shared._raw_http.HTTPError`).
"""

from __future__ import annotations

from typing import Final

import msgspec

from openenv import Dialect
from transports.http._protocol import ACK_HEADER, MEDIA_TYPES, SEQ_HEADER, WAIT_HEADER, dialect_for
from transports.shared._asgi import Receive, Scope
from transports.shared._raw_http import (
    CONTENT_LENGTH,
    CONTENT_TYPE,
    HTTPError,
    header_int,
    header_seconds,
    media_type,
    read_body,
)

__all__ = ["read_created_dialect", "read_frame", "read_poll_headers"]

# The largest body of a creation (a small JSON object).
_MAX_CREATE_BODY: Final = 64 * 1024

# The accepted spellings of each encoding's media type, in requests.
_ACCEPTED_MEDIA_TYPES: Final = {
    "json": frozenset({"application/json"}),
    "msgpack": frozenset({"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}),
}

_SEQ = SEQ_HEADER.lower().encode()
_ACK = ACK_HEADER.lower().encode()
_WAIT = WAIT_HEADER.lower().encode()


class _CreateRequest(msgspec.Struct):
    """The body of a creation (every field optional; unknown fields ignored)."""

    encoding: str = "json"


_decode_create = msgspec.json.Decoder(_CreateRequest).decode


def read_poll_headers(
    scope: Scope, max_wait: float, key_name: bytes | None = None
) -> tuple[bytes | None, int, int, float, bytes | None, bytes | None]:
    """Read a frame request's headers, in one pass.

    Args:
        scope: The request's ASGI scope.
        max_wait: The longest wait the server grants (and the wait when the request names none).
        key_name: The header carrying the request's secret, if it is read here.

    Returns:
        ``(key, seq, ack, wait, content_type, content_length)``: the secret
        (``None`` without ``key_name`` or the header), ``OpenEnv-Seq`` (0
        without it), ``OpenEnv-Ack`` (0 without it), ``OpenEnv-Wait`` at most
        ``max_wait``, and the body's ``Content-Type`` and ``Content-Length``.

    Raises:
        HTTPError: ``400 invalid_header``: a number that is not one.
    """
    seq = ack = 0
    wait = max_wait
    content_type = content_length = key = None
    for name, value in scope["headers"]:
        if name == key_name:
            key = value
        elif name == _SEQ:
            seq = header_int(value, SEQ_HEADER, 1)
        elif name == _ACK:
            ack = header_int(value, ACK_HEADER, 0)
        elif name == _WAIT:
            wait = min(header_seconds(value, WAIT_HEADER), max_wait)
        elif name == CONTENT_TYPE:
            content_type = value
        elif name == CONTENT_LENGTH:
            content_length = value
    return key, seq, ack, wait, content_type, content_length


async def read_frame(
    receive: Receive,
    content_type: bytes | None,
    content_length: bytes | None,
    *,
    encoding: str,
    limit: int,
    what: str,
) -> bytes:
    """Read the body of a frame request: one frame, or one envelope, in the encoding of its session or link.

    Args:
        receive: The request's ASGI ``receive``.
        content_type: Its ``Content-Type``, if it has one.
        content_length: Its ``Content-Length``, if it has one.
        encoding: The encoding of its session or link (``"json"``, ``"msgpack"``).
        limit: The most bytes the body may have.
        what: What the bodies are, for the error message (``"session's frames"``).

    Returns:
        The body.

    Raises:
        HTTPError: ``415 unsupported_media_type``: not the media type of
            ``encoding``; ``413 body_too_large``: past ``limit``.
        transports.shared._raw_http.Disconnected: The client went away.
    """
    if content_type is None or media_type(content_type) not in _ACCEPTED_MEDIA_TYPES[encoding]:
        raise HTTPError(
            415,
            "unsupported_media_type",
            f"this {what} are {MEDIA_TYPES[encoding]}, not "
            f"{'nothing' if content_type is None else content_type.decode('latin-1')!r}",
        )
    return await read_body(receive, limit, content_length)


async def read_created_dialect(
    receive: Receive, content_type: bytes | None, content_length: bytes | None, path: str
) -> Dialect:
    """Read a creation's body (optional JSON: ``{"encoding": ...}``): the dialect it asks for.

    Args:
        receive: The request's ASGI ``receive``.
        content_type: Its ``Content-Type``, if it has one.
        content_length: Its ``Content-Length``, if it has one.
        path: The route, for the error message (``/poll/sessions``).

    Returns:
        The dialect of the session or link to create (JSON without a body).

    Raises:
        HTTPError: ``415 unsupported_media_type``: a body that is not JSON;
            ``400 invalid_body``: not the options, or an unknown encoding;
            ``413 body_too_large``: a body past 64 KiB.
        transports.shared._raw_http.Disconnected: The client went away.
    """
    body = await read_body(receive, _MAX_CREATE_BODY, content_length)
    options = _CreateRequest()
    if body.strip():
        if content_type is None or media_type(content_type) != "application/json":
            raise HTTPError(415, "unsupported_media_type", f"the body of POST {path} must be JSON")
        try:
            options = _decode_create(body)
        except msgspec.DecodeError as exc:
            raise HTTPError(400, "invalid_body", f"invalid body: {exc}") from None
    try:
        return dialect_for(options.encoding)
    except ValueError as exc:
        raise HTTPError(400, "invalid_body", str(exc)) from None

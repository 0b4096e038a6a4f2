"""The JSON body of the error responses that are openenv's own: ``{"error": {"code": ..., "message": ...}}``.

The app's guard refuses requests with it (``401``, ``403``), the HTTP
long-polling endpoint answers every error of its protocol with it, and the
long-polling client reads it. (OpenEnv's stateless routes answer as OpenEnv's
do, with ``{"detail": ...}``.)
"""

from __future__ import annotations

import msgspec

__all__ = ["ErrorBody", "ErrorReply", "decode_error", "encode_error"]


class ErrorBody(msgspec.Struct):
    """What went wrong: a code a program can test, and a message for a person."""

    code: str = ""
    message: str = ""


class ErrorReply(msgspec.Struct):
    """The whole body."""

    error: ErrorBody


_encode = msgspec.json.Encoder().encode

decode_error = msgspec.json.Decoder(ErrorReply).decode
"""Decode an error body (``msgspec.DecodeError`` if it is not one)."""


def encode_error(code: str, message: str) -> bytes:
    """The body of an error response.

    Args:
        code: The error's code (``"unauthorized"``, ``"body_too_large"``).
        message: What to tell the person reading it.

    Returns:
        The JSON body.
    """
    return _encode(ErrorReply(ErrorBody(code, message)))

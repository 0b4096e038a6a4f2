"""Who may use a server: the bearer-token and ``Origin`` checks every request passes first.

`RequestGuard` wraps the whole ASGI app, so a request it refuses reaches no
route: no session slot is taken and no environment is built.

- **Origin.** A browser names the page that makes a request in ``Origin``; other
  clients send none. A request with an ``Origin`` that is not allowed is refused
  (``403``; a WebSocket handshake is refused the same way), so no web page can
  drive a server on the user's machine. By default no origin is allowed, which
  leaves every client but a browser unaffected.
- **Token.** With tokens set, every request but ``GET /health`` must carry
  ``Authorization: Bearer <token>`` with one of them, else ``401`` and a
  ``WWW-Authenticate: Bearer`` header. Tokens are compared in constant time.

A CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an
allowed origin passes without a token (browsers never send one on it); the
app's CORS layer answers it.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Iterable, Sequence
from typing import Final

from ._asgi import Receive, Scope, Send
from ._error_body import encode_error

__all__ = ["AUTH_TOKEN_ENV", "OPEN_PATHS", "RequestGuard", "auth_tokens_from"]

AUTH_TOKEN_ENV: Final = "OPENENV_AUTH_TOKEN"
"""The environment variable a server takes its token from, and clients theirs."""

OPEN_PATHS: Final = frozenset({"/health"})
"""Paths served without a token (an orchestrator's liveness probe has none)."""

_ORIGIN = b"origin"
_AUTHORIZATION = b"authorization"
_PREFLIGHT = b"access-control-request-method"
_BEARER = b"bearer "


def auth_tokens_from(auth_token: str | Sequence[str] | None) -> tuple[str, ...]:
    """The tokens a server accepts, given its ``auth_token`` option.

    Args:
        auth_token: One token, several (any of them is accepted), ``None`` to
            take the one in `AUTH_TOKEN_ENV` (if set), or ``()`` for none.

    Returns:
        The tokens; empty when the server is open to anyone who can reach it.

    Raises:
        ValueError: An empty token, or one with whitespace or non-ASCII characters.
    """
    if auth_token is None:
        from_env = os.environ.get(AUTH_TOKEN_ENV, "")
        tokens: tuple[str, ...] = (from_env,) if from_env else ()
    elif isinstance(auth_token, str):
        tokens = (auth_token,)
    else:
        tokens = tuple(auth_token)
    for token in tokens:
        if not token or not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
            raise ValueError("an auth token must be non-empty printable ASCII without spaces")
    return tokens


class RequestGuard:
    """An ASGI middleware that refuses requests from disallowed origins and without a valid token.

    Args:
        app: The app it guards.
        auth_tokens: The bearer tokens accepted; empty for no authentication.
        allowed_origins: The ``Origin`` values accepted (``"*"``: any); a request
            without ``Origin`` is always accepted.
    """

    def __init__(self, app: object, *, auth_tokens: Sequence[str] = (), allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self._tokens = [token.encode() for token in auth_tokens]
        origins = {origin.rstrip("/") for origin in allowed_origins}
        self._any_origin = "*" in origins
        self._origins = frozenset(origin.encode("latin-1") for origin in origins)

    def _origin_allowed(self, origin: bytes) -> bool:
        return self._any_origin or origin.rstrip(b"/") in self._origins

    def _token_valid(self, authorization: bytes | None) -> bool:
        if authorization is None or authorization[:7].lower() != _BEARER:
            return False
        offered = authorization[7:].strip()
        valid = False
        for token in self._tokens:  # every token compared, in constant time each
            valid |= hmac.compare_digest(offered, token)
        return valid

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an allowed request to the app; answer a refused one (the ASGI entry point).

        Args:
            scope: The connection's ASGI scope.
            receive: The ASGI ``receive`` callable.
            send: The ASGI ``send`` callable.
        """
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)  # type: ignore[operator]
            return
        origin = authorization = None
        preflight = False
        for name, value in scope["headers"]:
            if name == _ORIGIN:
                origin = value
            elif name == _AUTHORIZATION:
                authorization = value
            elif name == _PREFLIGHT:
                preflight = True
        if origin is not None and not self._origin_allowed(origin):
            await _refuse(scope, receive, send, 403, "origin_not_allowed", "requests from this Origin are refused")
            return
        if self._tokens and scope["path"] not in OPEN_PATHS:
            preflight = preflight and kind == "http" and scope["method"] == "OPTIONS" and origin is not None
            if not preflight and not self._token_valid(authorization):
                message = "a valid 'Authorization: Bearer <token>' header is required"
                await _refuse(scope, receive, send, 401, "unauthorized", message)
                return
        await self.app(scope, receive, send)  # type: ignore[operator]


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str) -> None:
    """Answer ``status`` with a JSON error body; a WebSocket handshake is refused with it."""
    body = encode_error(code, message)
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    if (await receive())["type"] != "websocket.connect":
        return
    if "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # the server can only refuse with its own 403
        await send({"type": "websocket.close", "code": 1008})

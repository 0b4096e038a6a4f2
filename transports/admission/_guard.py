"""Who may use a server: the ``Host``, ``Origin`` and bearer-token checks every request passes first.

`RequestGuard` wraps the whole ASGI app, so a request it refuses reaches no
route: no session slot is taken and no environment is built.

- **Host.** A server without a token answers only requests addressed to it by
  an IP address, ``localhost``, or a name it was told (``allowed_hosts``):
  else a web page whose name was made to resolve to the server's address (DNS
  rebinding) would be same-origin with it, send no ``Origin``, and read its
  answers. A request for another ``Host`` gets ``403`` (but ``GET /health``).
  With a token the page cannot authenticate, so any ``Host`` is accepted.
- **Origin.** A browser names the page that makes a request in ``Origin``; other
  clients send none. A request with an ``Origin`` that is not allowed is refused
  (``403``; a WebSocket handshake is refused the same way), so no web page can
  drive a server on the user's machine. By default no origin is allowed, which
  leaves every client but a browser unaffected.
- **Token.** With tokens set, every request but ``GET /health`` must carry
  ``Authorization: Bearer <token>`` with one of them, else ``401`` and a
  ``WWW-Authenticate: Bearer`` header. Tokens are compared in constant time. A
  browser cannot set ``Authorization`` on a WebSocket handshake: there it may
  offer the token as the subprotocol ``openenv.bearer.<token, base64url>``
  (`BEARER_SUBPROTOCOL_PREFIX`) beside a subprotocol the server speaks; the
  server never selects that entry.

A CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) from an
allowed origin passes without a token (browsers never send one on it); the
app's CORS layer answers it.

The guard also names the client for the endpoints' per-client bounds
(`client_of`): the token it presented, or else its address.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
from collections.abc import Iterable, Sequence
from typing import Final

from transports.shared._asgi import Receive, Scope, Send
from transports.shared._auth import AUTH_TOKEN_ENV
from transports.shared._error_body import encode_error

__all__ = [
    "AUTH_TOKEN_ENV",
    "BEARER_SUBPROTOCOL_PREFIX",
    "CLIENT_SCOPE_KEY",
    "OPEN_PATHS",
    "RequestGuard",
    "auth_tokens_from",
    "bearer_subprotocol",
    "client_of",
    "normalized_origins",
]


OPEN_PATHS: Final = frozenset({"/health"})
"""Paths served without a token (an orchestrator's liveness probe has none)."""

BEARER_SUBPROTOCOL_PREFIX: Final = "openenv.bearer."
"""A WebSocket subprotocol entry carrying the token, for browsers: this prefix, then the token in base64url."""

CLIENT_SCOPE_KEY: Final = "openenv.client"
"""The ASGI scope key where `RequestGuard` notes which token the request presented (see `client_of`)."""

_ORIGIN = b"origin"
_AUTHORIZATION = b"authorization"
_PREFLIGHT = b"access-control-request-method"
_HOST = b"host"
_SUBPROTOCOLS = b"sec-websocket-protocol"
_BEARER = b"bearer "
_BEARER_PREFIX = BEARER_SUBPROTOCOL_PREFIX.encode()


def bearer_subprotocol(token: str) -> str:
    """The WebSocket subprotocol entry that carries ``token`` (for a browser, which cannot set ``Authorization``).

    Args:
        token: The bearer token.

    Returns:
        ``openenv.bearer.`` followed by the token in unpadded base64url, a valid subprotocol name.
    """
    encoded = base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()
    return BEARER_SUBPROTOCOL_PREFIX + encoded


def normalized_origins(origins: Iterable[str]) -> list[str]:
    """Origins as browsers send them: without a trailing slash (``https://app.example/`` is ``https://app.example``).

    Args:
        origins: The origins configured.

    Returns:
        The same origins, each without trailing slashes, in order, once each.
    """
    return list(dict.fromkeys(origin.rstrip("/") or origin for origin in origins))


def client_of(scope: Scope) -> str:
    """Who sends a request, for per-client bounds: the token it presented, or else its address.

    Args:
        scope: The request's ASGI scope, once `RequestGuard` has passed it.

    Returns:
        ``"token:<n>"`` (the n-th token the server accepts), ``"address:<ip>"``,
        or ``"address:-"`` when the server does not know the peer's address.
    """
    noted: str | None = scope.get(CLIENT_SCOPE_KEY)
    if noted is not None:
        return noted
    peer = scope.get("client")
    return f"address:{peer[0]}" if peer else "address:-"


def _host_name(host: bytes) -> str:
    """The name in a ``Host`` header, lower case, without its port or a trailing dot."""
    text = host.decode("latin-1").strip().lower()
    if text.startswith("["):  # [v6]:port
        return text[1 : text.find("]")] if "]" in text else text
    name, _, port = text.rpartition(":")
    if name and port.isdigit():
        text = name
    return text.rstrip(".")


def _is_ip_or_localhost(name: str) -> bool:
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


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
        allowed_hosts: The host names accepted in ``Host`` when there is no
            token, beside IP addresses and ``localhost`` (``"*"``: any).
    """

    def __init__(
        self,
        app: object,
        *,
        auth_tokens: Sequence[str] = (),
        allowed_origins: Iterable[str] = (),
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.app = app
        self._tokens = [token.encode() for token in auth_tokens]
        origins = set(normalized_origins(allowed_origins))
        self._any_origin = "*" in origins
        self._origins = frozenset(origin.encode("latin-1") for origin in origins)
        hosts = {host.strip().lower().rstrip(".") for host in allowed_hosts}
        self._any_host = bool(self._tokens) or "*" in hosts
        self._hosts = frozenset(hosts)

    def _origin_allowed(self, origin: bytes) -> bool:
        return self._any_origin or origin.rstrip(b"/") in self._origins

    def _host_allowed(self, host: bytes) -> bool:
        name = _host_name(host)
        return name in self._hosts or _is_ip_or_localhost(name)

    def _matching_token(self, offered: bytes) -> int | None:
        """The index of the token ``offered`` is, compared with every token in constant time."""
        match = None
        for index, token in enumerate(self._tokens):
            if hmac.compare_digest(offered, token) and match is None:
                match = index
        return match

    def _token_of(self, authorization: bytes | None, subprotocols: bytes | None) -> int | None:
        """The index of the valid token the request presents, or ``None``."""
        if authorization is not None:
            if authorization[:7].lower() != _BEARER:
                return None
            return self._matching_token(authorization[7:].strip())
        if subprotocols is None:
            return None
        for entry in subprotocols.split(b","):
            entry = entry.strip()
            if entry.startswith(_BEARER_PREFIX):
                encoded = entry[len(_BEARER_PREFIX) :]
                try:
                    offered = base64.urlsafe_b64decode(encoded + b"=" * (-len(encoded) % 4))
                except (binascii.Error, ValueError):
                    return None
                return self._matching_token(offered)
        return None

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
        origin = authorization = host = subprotocols = None
        preflight = False
        for name, value in scope["headers"]:
            if name == _ORIGIN:
                origin = value
            elif name == _AUTHORIZATION:
                authorization = value
            elif name == _PREFLIGHT:
                preflight = True
            elif name == _HOST:
                host = value
            elif name == _SUBPROTOCOLS and kind == "websocket":
                subprotocols = value if subprotocols is None else subprotocols + b"," + value
        open_path = scope["path"] in OPEN_PATHS  # /health tells a page nothing: it is open to any host too
        if host is not None and not self._any_host and not open_path and not self._host_allowed(host):
            name = _host_name(host)
            message = (
                f"requests for the host {name!r} are refused by a server without a token: "
                f"allow it (--allow-host {name}), or set a token"
            )
            await _refuse(scope, receive, send, 403, "host_not_allowed", message)
            return
        if origin is not None and not self._origin_allowed(origin):
            await _refuse(scope, receive, send, 403, "origin_not_allowed", "requests from this Origin are refused")
            return
        if self._tokens and not open_path:
            preflight = preflight and kind == "http" and scope["method"] == "OPTIONS" and origin is not None
            token = None if preflight else self._token_of(authorization, subprotocols)
            if token is None and not preflight:
                message = "a valid 'Authorization: Bearer <token>' header is required"
                await _refuse(scope, receive, send, 401, "unauthorized", message)
                return
            if token is not None:
                scope[CLIENT_SCOPE_KEY] = f"token:{token}"
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

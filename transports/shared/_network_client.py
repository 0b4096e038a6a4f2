"""Client plumbing shared by the network transports (WebSocket, HTTP long-polling, the benchmark's schema fetch).

One place for what every client that opens a socket does alike: turning the
URL a caller gives into the one it connects to, the TLS settings, the
``User-Agent``, the caller's extra headers (the bearer token, names a protocol
owns, syntax), the "connects only once" rule, how an I/O failure is worded,
and how a connection's end is recorded and reported (`ConnectionEnd`).
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import ssl
from collections.abc import Collection, Mapping, Sequence
from typing import NamedTuple, NoReturn

import anyio
import msgspec

from openenv import AuthenticationError, ClientStateError, ConnectionClosed, ProtocolError, __version__
from transports.shared._auth import AUTH_TOKEN_ENV
from transports.shared._error_body import decode_error

__all__ = [
    "STREAM_ERRORS",
    "ConnectionEnd",
    "authentication_error",
    "HeaderPairs",
    "SplitURL",
    "client_headers",
    "connect_once",
    "default_ssl_context",
    "describe",
    "error_detail",
    "error_message",
    "is_loopback",
    "network_cause",
    "no_tls_context",
    "not_connected",
    "sends_token",
    "split_url",
    "user_agent",
]

HeaderPairs = Mapping[str, str] | Sequence[tuple[str, str]]
"""Extra headers as a caller gives them: a mapping, or ``(name, value)`` pairs (a name may repeat)."""

# Everything an open socket (plain or TLS) may raise. ssl.SSLError is an OSError.
STREAM_ERRORS = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)

# RFC 9110: a field name is a token; a value has no control characters but tab.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEADER_VALUE = re.compile(r"[^\x00-\x08\x0a-\x1f\x7f]*")


# -- URLs ------------------------------------------------------------------------


class SplitURL(NamedTuple):
    """A URL taken apart for rewriting: ``f"{scheme}://{location}{query}{fragment}"``."""

    scheme: str
    """The scheme the transport speaks (mapped from the one given)."""
    location: str
    """Host, port and path, without trailing slashes."""
    query: str
    """``""`` or ``"?..."``."""
    fragment: str
    """``""`` or ``"#..."``."""


def split_url(url: str, schemes: Mapping[str, str], *, default_scheme: str | None = None) -> SplitURL | None:
    """Take a URL apart and map its scheme, as every network transport's URL rewriting starts.

    Args:
        url: The URL the caller gave.
        schemes: Each accepted scheme (lower case) and the scheme it becomes.
        default_scheme: The scheme of a URL without one (``None``: such a URL is not accepted).

    Returns:
        The parts, or ``None`` when the scheme is not one of ``schemes``.
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        if default_scheme is None:
            return None
        scheme, rest = default_scheme, url
    mapped = schemes.get(scheme.lower())
    if mapped is None:
        return None
    rest, hash_mark, fragment = rest.partition("#")
    rest, question_mark, query = rest.partition("?")
    return SplitURL(mapped, rest.rstrip("/"), question_mark + query, hash_mark + fragment)


# -- TLS and identity ---------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` (and its subdomains), ``127.0.0.0/8``, ``::1``.

    A transport never sends such a host's requests through a proxy from the
    environment (``HTTP_PROXY``...), as OpenEnv's client and Go's ``net/http``
    do not: a proxy elsewhere cannot reach it.

    Args:
        host: A URL's host, without brackets (``::1``).
    """
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@functools.cache
def default_ssl_context() -> ssl.SSLContext:
    """The TLS settings of every client a transport makes itself: the system's defaults, built once.

    Building them loads the CA store, which costs far more than a request on
    loopback; cached, many sessions opened at once do not each pay it. The
    ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` environment variables apply.
    """
    return ssl.create_default_context()


@functools.cache
def no_tls_context() -> ssl.SSLContext:
    """What a plain-text client is given where a library insists on one: it loads no CA store.

    Were it ever used, it would verify every certificate against an empty
    store and fail: never an unchecked connection.
    """
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def user_agent(library: str) -> str:
    """The ``User-Agent`` a transport sends: openenv's version, then the I/O library's token.

    Args:
        library: The library's own product token (``websockets/15.0``, ``python-httpx/0.28``).
    """
    return f"openenv/{__version__} {library}"


# -- headers ------------------------------------------------------------------------


def client_headers(
    headers: HeaderPairs | None,
    auth_token: str | None,
    *,
    reserved: Collection[str],
    owner: str,
    token_from_env: bool = True,
) -> list[tuple[str, str]]:
    """The extra headers a client sends with every request, checked once, at construction.

    Args:
        headers: The caller's headers.
        auth_token: The bearer token, sent as ``Authorization: Bearer <token>``;
            ``None`` takes it from ``OPENENV_AUTH_TOKEN`` (if set, and if
            ``token_from_env``). An ``Authorization`` header in ``headers`` wins
            over the environment variable.
        reserved: Header names (lower case) the protocol sets itself.
        owner: What owns the reserved names, for the error (``"the WebSocket handshake"``).
        token_from_env: Whether a missing token is taken from the environment.

    Returns:
        A new list of ``(name, value)`` pairs.

    Raises:
        ValueError: A reserved or malformed header, or ``auth_token`` together
            with an ``Authorization`` header.
    """
    pairs = list(headers.items()) if isinstance(headers, Mapping) else list(headers or ())
    has_authorization = any(name.lower() == "authorization" for name, _ in pairs)
    if auth_token is not None and has_authorization:
        raise ValueError("give auth_token or an Authorization header, not both")
    if auth_token is None and not has_authorization and token_from_env:
        auth_token = os.environ.get(AUTH_TOKEN_ENV) or None
    if auth_token is not None:
        pairs.append(("Authorization", f"Bearer {auth_token}"))
    for name, value in pairs:
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError(f"invalid header: {name!r}: {value!r} (names and values are str)")
        if name.lower() in reserved:
            raise ValueError(f"the {name} header belongs to {owner}; it cannot be set")
        if not _HEADER_NAME.fullmatch(name):
            raise ValueError(f"invalid header: {name!r} is not a valid header name")
        if not _HEADER_VALUE.fullmatch(value):
            raise ValueError(f"invalid header: the value of {name} holds a control character")
    return pairs


def error_message(body: bytes) -> tuple[str, str] | None:
    """The code and message of our servers' JSON error body (``{"error": {"code", "message"}}``), if it is one.

    Args:
        body: An error response's body.
    """
    try:
        error = decode_error(body).error
    except msgspec.DecodeError:
        return None
    return error.code, error.message


def error_detail(body: bytes) -> str:
    """What an error response's body says, in a line: our servers' JSON error's message, or the body's start.

    Args:
        body: The response's body.
    """
    error = error_message(body)
    if error is None:
        return " ".join(body.decode("utf-8", "replace").split())[:200]
    code, message = error
    return f"{message} ({code})" if code else message


def sends_token(headers: Sequence[tuple[str, str]]) -> bool:
    """Whether these request headers carry credentials (an ``Authorization`` header)."""
    return any(name.lower() == "authorization" for name, _ in headers)


def authentication_error(url: str, refusal: str, *, token_sent: bool) -> AuthenticationError:
    """The error for a server's ``401``, saying how to send a token when none was sent.

    Args:
        url: The URL the client connected to.
        refusal: What the server answered (``"HTTP 401 Unauthorized: ..."``).
        token_sent: Whether the request carried an ``Authorization`` header.
    """
    if token_sent:
        return AuthenticationError(
            f"the server at {url} refused the token ({refusal}); check the one given "
            f"(the auth_token option, or {AUTH_TOKEN_ENV})"
        )
    return AuthenticationError(
        f"the server at {url} wants a token and none was sent ({refusal}); give it as "
        f"auth_token='...' (EnvClient(url, auth_token=...), openenv bench --auth-token) or set {AUTH_TOKEN_ENV}"
    )


# -- lifecycle and failures ---------------------------------------------------------


def connect_once(entered: bool, transport: object) -> None:
    """Refuse a second connect: a transport carries one session, once.

    Args:
        entered: Whether the transport was entered before.
        transport: The transport, named in the error.

    Raises:
        ClientStateError: It was.
    """
    if entered:
        raise ClientStateError(
            f"this {type(transport).__name__} was connected before: a transport connects only once; create a new one"
        )


def _os_errors(exc: BaseException | None, depth: int = 0) -> list[OSError]:
    """The system's own failures at the bottom of an I/O library's chain of exceptions (groups looked into)."""
    if exc is None or depth > 8:
        return []
    inner = getattr(exc, "exceptions", None)
    if isinstance(inner, (list, tuple)):  # an exception group: anyio's connect tries every address
        return [error for member in inner for error in _os_errors(member, depth + 1)]
    below = _os_errors(exc.__cause__ or exc.__context__, depth + 1)
    if below:
        return below
    return [exc] if isinstance(exc, OSError) else []


def describe(exc: BaseException) -> str:
    """One line on why an I/O call failed: its class and message, and the system's errors beneath it.

    Args:
        exc: The failure.
    """
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    beneath = [str(error) or type(error).__name__ for error in _os_errors(exc) if error is not exc]
    beneath = [line for line in dict.fromkeys(beneath) if line not in text]
    if beneath:
        text += " (" + "; ".join(beneath) + ")"
    return text


def network_cause(exc: BaseException) -> BaseException:
    """What a transport's error is raised from: the system's failure alone, when the network failed.

    A refused or unreachable connection comes wrapped in the I/O libraries'
    exceptions, each with its traceback through their internals: 60 to 85
    lines around the one that says what happened, which the error's message
    says already. The cause kept is the system's ``OSError`` (its class,
    ``errno`` and message), without those frames. Any other failure (a bug,
    say) is kept whole.

    Args:
        exc: The failure the transport caught.

    Returns:
        The failure to chain to (``raise error from network_cause(exc)``).
    """
    errors = _os_errors(exc)
    if not errors:
        return exc
    root = errors[0]
    root.__traceback__ = None
    root.__cause__ = None
    root.__context__ = None
    return root


class ConnectionEnd:
    """How a client connection ended: the one record every network transport keeps.

    A connection ends once. Either the client closed it (`close_by_client`), or
    something else did, and the first reason noted (`note`) is the one callers
    are told: later failures are its consequences. Until then `ended` is false.

    Attributes:
        url: The URL, for the messages.
        kind: What the connection is, for the messages ("WebSocket connection").
        by_client: Whether the client closed it.
        error: Why it ended, when the client did not close it; ``None`` so far.
    """

    __slots__ = ("by_client", "cause", "error", "kind", "url")

    def __init__(self, url: str, kind: str) -> None:
        self.url = url
        self.kind = kind
        self.by_client = False
        self.error: ConnectionClosed | ProtocolError | None = None
        self.cause: BaseException | None = None

    @property
    def ended(self) -> bool:
        """Whether the connection has ended, however."""
        return self.by_client or self.error is not None

    def note(self, error: ConnectionClosed | ProtocolError, cause: BaseException | None = None) -> None:
        """Record why the connection ended, unless it has a reason already.

        Args:
            error: What `raise_ended` raises.
            cause: The failure behind it, raised from.
        """
        if self.error is None:
            self.error = error
            self.cause = cause

    def close_by_client(self) -> None:
        """Record that the client closed the connection (it wins over any later failure)."""
        self.by_client = True

    def closed_by_client_error(self) -> ConnectionClosed:
        """The error a use after the client's close raises."""
        return ConnectionClosed(f"the {self.kind} to {self.url} was closed by the client")

    def ended_error(self) -> ConnectionClosed | ProtocolError:
        """Why the connection is not usable; call once it has ended.

        A fresh exception each time (the same one raised twice would grow its
        traceback), its cause the recorded one's.
        """
        if self.by_client:
            return self.closed_by_client_error()
        error = self.error
        assert error is not None
        fresh = type(error)(str(error))
        fresh.__cause__ = self.cause or error
        return fresh

    def raise_ended(self) -> NoReturn:
        """Raise `ended_error`; call once the connection has ended."""
        raise self.ended_error()


def not_connected(kind: str, url: str) -> ConnectionClosed:
    """The error a transport's `send` or `receive` raises before it is connected."""
    return ConnectionClosed(f"the {kind} transport to {url} is not connected")

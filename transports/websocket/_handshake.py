"""Opening a WebSocket connection, client side: the socket (TCP, TLS), the upgrade, and its failures.

websockets' sans-I/O `ClientProtocol` writes the upgrade request and reads the
response; `handshake` drives it over an anyio byte stream and returns the
stream, the protocol (open) and the events that came right behind the
response. Every failure on the way becomes `openenv.ConnectError` (or
`openenv.AuthenticationError` for a refused token), named once here.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Sequence
from typing import NamedTuple

import anyio
from anyio.abc import ByteStream
from websockets.client import ClientProtocol
from websockets.datastructures import Headers
from websockets.exceptions import (
    InvalidHandshake,
    InvalidMessage,
    InvalidStatus,
    NegotiationError,
    WebSocketException,
)
from websockets.extensions.permessage_deflate import enable_client_permessage_deflate
from websockets.http11 import USER_AGENT, Response
from websockets.protocol import Event
from websockets.typing import Subprotocol
from websockets.uri import WebSocketURI

from openenv import ConnectError
from transports.shared._network_client import (
    STREAM_ERRORS,
    authentication_error,
    default_ssl_context,
    describe,
    error_detail,
    error_message,
    network_cause,
    sends_token,
    user_agent,
)
from transports.websocket._subprotocols import SPOKEN

__all__ = ["CONNECT_ERRORS", "READ_SIZE", "Handshaken", "Upgrade", "close_quietly", "connect_error", "handshake"]

# Bytes asked of the socket per read: large, so that a burst of frames (or a big
# one) takes few system calls and few trips through the protocol's parser.
READ_SIZE = 65536

# What may go wrong while connecting: the socket's failures and websockets' own.
CONNECT_ERRORS = (*STREAM_ERRORS, WebSocketException)

_USER_AGENT = user_agent(USER_AGENT)


class Handshaken(NamedTuple):
    """A connection past its upgrade: what `handshake` returns."""

    stream: ByteStream
    """The socket (TLS over TCP for ``wss://``)."""
    protocol: ClientProtocol
    """The protocol, OPEN."""
    early_events: list[Event]
    """Events the server sent right behind its response (frames already)."""
    tls: bool
    """Whether the stream is TLS."""
    after_response: bytes = b""
    """The bytes that came right behind the response: the frames of `early_events`, and part of one, maybe."""


class Upgrade(NamedTuple):
    """What a client asks of the upgrade; one per transport, reused to reconnect."""

    url: str
    """The WebSocket URL, for the messages."""
    uri: WebSocketURI
    """The parsed URL."""
    headers: Sequence[tuple[str, str]]
    """The caller's extra headers (the bearer token among them)."""
    compression: bool
    """Offer permessage-deflate."""
    max_message_size: int | None
    """The largest message accepted from the server."""
    ssl_context: ssl.SSLContext | None
    """TLS settings for ``wss://`` (``None``: the system's)."""


def connect_error(url: str, exc: BaseException, *, token_sent: bool = False) -> ConnectError:
    """Translate a failure to connect, most specific class first.

    Args:
        url: The WebSocket URL.
        exc: The failure: the socket's, or websockets'.
        token_sent: Whether the handshake carried a bearer token (for a 401's words).

    Returns:
        The error to raise (from `network_cause` of ``exc``).
    """
    if isinstance(exc, InvalidStatus):
        response = exc.response
        detail = error_detail(bytes(response.body)) if response.body else ""
        refusal = f"HTTP {response.status_code} {response.reason_phrase}" + (f": {detail}" if detail else "")
        if response.status_code == 401:
            return authentication_error(url, refusal, token_sent=token_sent)
        hint = ""
        if response.status_code in (403, 404) and error_message(bytes(response.body)) is None:
            # What Starlette (ours, OpenEnv's) answers a WebSocket to a path it does not serve.
            hint = " (no WebSocket endpoint there? give the server's base URL: the client appends /ws)"
        return ConnectError(f"the server at {url} refused the WebSocket handshake: {refusal}{hint}")
    if isinstance(exc, InvalidMessage) and isinstance(exc.__cause__, EOFError):
        return ConnectError(f"the server at {url} closed the connection during the WebSocket handshake")
    if isinstance(exc, NegotiationError):
        return ConnectError(f"the WebSocket handshake with {url} failed to negotiate: {exc}")
    if isinstance(exc, InvalidHandshake):
        return ConnectError(f"invalid WebSocket handshake response from {url}: {exc}")
    if isinstance(exc, (anyio.EndOfStream, anyio.BrokenResourceError)):
        return ConnectError(f"the connection to {url} was lost while connecting: {describe(exc)}")
    return ConnectError(f"cannot connect to {url}: {describe(exc)}")


async def close_quietly(stream: ByteStream) -> None:
    """Close a socket now, even under cancellation; it may already be broken."""
    with anyio.CancelScope(shield=True), contextlib.suppress(*STREAM_ERRORS):
        await stream.aclose()


def _set_headers(headers: Headers, added: Sequence[tuple[str, str]]) -> None:
    """Add the caller's headers to an upgrade request's; each replaces any default of its name."""
    pairs = list(added)
    if not any(name.lower() == "user-agent" for name, _ in pairs):
        pairs.append(("User-Agent", _USER_AGENT))
    for name in {name for name, _ in pairs}:
        if name in headers:
            del headers[name]
    for name, value in pairs:
        headers[name] = value


def _check_selected(url: str, events: list[Event], offer: Sequence[str]) -> None:
    """Name the subprotocol a failed handshake's response selected, if it was never offered."""
    response = events[0] if events else None
    if isinstance(response, Response) and response.status_code == 101:
        selected = response.headers.get("Sec-WebSocket-Protocol")
        if selected is not None and selected not in offer:
            offered = ", ".join(offer) or "none"
            raise ConnectError(
                f"the server at {url} selected the subprotocol {selected!r}, which was not offered (offered: {offered})"
            )


async def _connect_tcp(upgrade: Upgrade) -> ByteStream:
    uri = upgrade.uri
    if not uri.secure:
        return await anyio.connect_tcp(uri.host, uri.port)
    return await anyio.connect_tcp(
        uri.host,
        uri.port,
        tls=True,
        ssl_context=upgrade.ssl_context or default_ssl_context(),
        tls_hostname=uri.host,
        # WebSocket frames carry their own ends, so a peer that skips TLS's
        # close_notify truncates nothing.
        tls_standard_compatible=False,
    )


async def handshake(
    upgrade: Upgrade, offer: Sequence[str], extra_headers: Sequence[tuple[str, str]] = ()
) -> Handshaken:
    """Open the socket and perform the upgrade, offering ``offer``.

    Args:
        upgrade: The URL and the request's settings.
        offer: The subprotocols to offer, most preferred first.
        extra_headers: More headers for this connection only (a resume token).

    Returns:
        The stream, the open protocol, and the events behind the response.

    Raises:
        AuthenticationError: The server refused the token (HTTP 401).
        ConnectError: Anything else that stops the connection: the socket, TLS,
            a refused or invalid upgrade, a subprotocol openenv cannot speak.
    """
    url = upgrade.url
    try:
        stream = await _connect_tcp(upgrade)
    except CONNECT_ERRORS as exc:
        raise connect_error(url, exc) from network_cause(exc)
    try:
        protocol = ClientProtocol(
            upgrade.uri,
            extensions=enable_client_permessage_deflate(None) if upgrade.compression else None,
            subprotocols=[Subprotocol(name) for name in offer] or None,
            max_size=upgrade.max_message_size,
        )
        request = protocol.connect()
        _set_headers(request.headers, [*upgrade.headers, *extra_headers])
        protocol.send_request(request)
        for data in protocol.data_to_send():
            if data:
                await stream.send(data)
        received = bytearray()  # the response (it has no body), and what came behind it
        while True:
            try:
                data = await stream.receive(READ_SIZE)
            except anyio.EndOfStream:
                data = b""
                protocol.receive_eof()
            else:
                protocol.receive_data(data)
                received += data
            events = protocol.events_received()
            if protocol.handshake_exc is not None:
                _check_selected(url, events, offer)
                raise protocol.handshake_exc
            if events and isinstance(events[0], Response):
                break
            if not data:
                raise ConnectError(f"the server at {url} closed the connection during the WebSocket handshake")
        selected = protocol.subprotocol
        if selected is not None and selected not in SPOKEN:
            raise ConnectError(f"the server at {url} selected the subprotocol {selected!r}, which openenv cannot speak")
    except BaseException as exc:
        await close_quietly(stream)
        if isinstance(exc, CONNECT_ERRORS) and not isinstance(exc, ConnectError):
            token_sent = sends_token([*upgrade.headers, *extra_headers])
            raise connect_error(url, exc, token_sent=token_sent) from network_cause(exc)
        raise
    after_response = bytes(received[received.index(b"\r\n\r\n") + 4 :])
    return Handshaken(stream, protocol, events[1:], upgrade.uri.secure, after_response)

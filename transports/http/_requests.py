"""Sending the long-polling transport's requests: the one retry loop, and what an error response says.

Shared by the transport's two ways of talking to a server: a session of its
own (`transports.http._client`) and a link of many sessions (`transports.http._link`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx
import msgspec

from openenv import Clock, ConnectError
from transports.http._protocol import RECEIVED_HEADER, SEQ_HEADER
from transports.shared._network_client import authentication_error, describe, error_message, network_cause, user_agent
from transports.shared._network_client import error_detail as body_detail

__all__ = [
    "GATEWAY_STATUSES",
    "Answer",
    "Body",
    "READ_MARGIN",
    "USER_AGENT",
    "RequestFailed",
    "backoff",
    "creation_answer",
    "end_reason",
    "error_detail",
    "exchange",
    "timeouts",
]

READ_MARGIN = 10.0
"""Seconds a response may take beyond the wait the server was asked for, before the request counts as lost."""

GATEWAY_STATUSES = frozenset({502, 503, 504})
"""Statuses a proxy or gateway answers with when the server is briefly out of reach; retried like network errors.

Ours never sends them on the frame routes (nor on a link's).
"""

_SEQ_NAME = SEQ_HEADER.lower().encode()
_RECEIVED_NAME = RECEIVED_HEADER.lower().encode()


class Answer:
    """A response, with the protocol's headers read in one pass (httpx's lookups scan them each time).

    Attributes:
        response: The response.
        seq: The ``OpenEnv-Seq`` header's raw value, or ``None``.
        received: The ``OpenEnv-Received`` header's raw value, or ``None``.
        sets_cookie: Whether the response sets a cookie.
    """

    __slots__ = ("received", "response", "seq", "sets_cookie")

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        seq = received = None
        sets_cookie = False
        for name, value in response.headers.raw:
            name = name.lower()
            if name == _SEQ_NAME:
                seq = value
            elif name == _RECEIVED_NAME:
                received = value
            elif name == b"set-cookie":
                sets_cookie = True
        self.seq = seq
        self.received = received
        self.sets_cookie = sets_cookie


# httpx's failures worth a retry: the request may not have reached the server,
# or its response may not have reached us; either way, repeating it is safe.
_RETRYABLE = (httpx.NetworkError, httpx.TimeoutException, httpx.RemoteProtocolError)

USER_AGENT = user_agent(f"python-httpx/{httpx.__version__}")
"""The ``User-Agent`` of the clients the transport makes."""


class Body(httpx.AsyncByteStream):
    """A request's whole body, in one chunk, sent as often as the request is.

    httpx's own `httpx.ByteStream` yields from an async generator, which a write
    cut short leaves unfinished (trio warns when it is collected); this one
    iterates without one.
    """

    __slots__ = ("_body",)

    def __init__(self, body: bytes) -> None:
        self._body = body

    def __aiter__(self) -> _Chunks:
        return _Chunks(self._body)


class _Chunks:
    """One pass over a `Body`: its one chunk."""

    __slots__ = ("_body",)

    def __init__(self, body: bytes) -> None:
        self._body: bytes | None = body

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        body, self._body = self._body, None
        if body is None:
            raise StopAsyncIteration
        return body


class RequestFailed(Exception):
    """A request failed for good: after ``attempts`` tries, the last one for ``reason``.

    Attributes:
        cause: What the transport's own error is raised from: without the I/O
            libraries' frames when the network failed (`network_cause`).
    """

    def __init__(self, reason: str, attempts: int, cause: BaseException | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.attempts = attempts
        self.cause = network_cause(cause) if cause is not None else None


def error_detail(response: httpx.Response) -> str:
    """What an error response says, in a line: our JSON error's message, or the start of the body."""
    return body_detail(response.content)


T = TypeVar("T")


def creation_answer(response: httpx.Response, url: str, what: str, decode: Callable[[bytes], T], hint: str = "") -> T:
    """What the server says of a session or link it was asked to create: its ``201``'s body, decoded.

    Args:
        response: The creation's response.
        url: The server's URL, for the errors.
        what: What was asked for (``"a session"``, ``"a link"``).
        decode: Decodes the body of a ``201``.
        hint: What the error of another status adds (a ``404`` or ``405`` may be another server).

    Returns:
        The decoded body.

    Raises:
        openenv.AuthenticationError: The server refused the token (``401``).
        openenv.ConnectError: Any other status but ``201``, or a body that does not decode.
    """
    status = response.status_code
    if status == 401:
        refusal = f"HTTP 401 {response.reason_phrase}: {error_detail(response)}"
        raise authentication_error(url, refusal, token_sent="authorization" in response.request.headers)
    if status != 201:
        raise ConnectError(
            f"the server at {url} refused to create {what}: HTTP {status} {response.reason_phrase}: "
            f"{error_detail(response)}{hint}"
        )
    try:
        return decode(response.content)
    except msgspec.DecodeError as exc:
        raise ConnectError(f"the server at {url} answered the creation of {what} with {exc}") from exc


def error_code(response: httpx.Response) -> str:
    """The code of our JSON error response (``""`` for another body)."""
    error = error_message(response.content)
    return "" if error is None else error[0]


def end_reason(response: httpx.Response, prefix: str) -> str:
    """Why the server says a session or link ended (a 410), without its ``prefix`` ("the session has ended: ")."""
    error = error_message(response.content)
    if error is None:
        return error_detail(response)
    return error[1].removeprefix(prefix)


def timeouts(connect: float | None, wait: float) -> dict[str, float | None]:
    """The timeouts (httpx's) of a request the server may hold ``wait`` seconds."""
    return {"connect": connect, "read": wait + READ_MARGIN, "write": None, "pool": connect}


async def exchange(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    retries: int,
    clock: Clock,
    owned_by_protocol: str,
) -> httpx.Response:
    """Send one request, trying again after network failures and gateways' errors: the one retry loop.

    Args:
        client: The client to send it with.
        request: The request, sent as it is each time.
        retries: How many times to try again.
        clock: Where the backoff between tries is measured.
        owned_by_protocol: A header only our server sets: a 502, 503 or 504
            with it is the server's answer, not a gateway's, and is returned.

    Returns:
        The response (of any other status).

    Raises:
        RequestFailed: The request failed ``retries + 1`` times, or for a
            reason a retry cannot mend (a closed client, say).
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            response = await client.send(request, follow_redirects=False)
        except _RETRYABLE as exc:
            failure: str = describe(exc)
            cause: BaseException | None = exc
        except (httpx.HTTPError, httpx.StreamError, httpx.InvalidURL, RuntimeError) as exc:
            # Not the network's doing: a closed client (RuntimeError), a decoding failure, ...
            raise RequestFailed(describe(exc), 1, exc) from None
        else:
            if response.status_code not in GATEWAY_STATUSES or owned_by_protocol in response.headers:
                return response
            detail = error_detail(response)
            failure = f"HTTP {response.status_code} {response.reason_phrase}" + (f": {detail}" if detail else "")
            cause = None
        if attempt > retries:
            raise RequestFailed(failure, attempt, cause)
        await clock.sleep(backoff(attempt))


def backoff(attempt: int) -> float:
    """Seconds to wait before retry number ``attempt``.

    None before the first (a keep-alive connection the server closed is
    routine), then 0.1 s, tripling up to 5 s.
    """
    if attempt <= 1:
        return 0.0
    return float(min(0.1 * 3 ** (attempt - 2), 5.0))

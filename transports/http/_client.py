"""The HTTP long-polling transport, client side: ``http+poll://`` and ``https+poll://`` URLs, on httpx.

By default a session rides the link this event loop shares with every session
to the same server and options (`transports.http._link`): its frames travel in
envelopes with the others', a request per batch. Against a server without links
(an older openenv), or with ``share=False``, it has a session of its own on the
server, spoken to as follows (the per-session protocol).

One HTTP request per step in the common case: `HTTPPollingTransport.send` POSTs
the request frame, and the server holds the response until the reply is ready
(up to ``poll_timeout``), so the reply comes back in it. The transport queues it
for `HTTPPollingTransport.receive`, which returns it without another request;
only when the reply was not ready in time does `receive` long-poll with GETs.

Delivery is exactly-once in both directions (see ``docs/http-polling.md``):

- each request frame carries its number (``OpenEnv-Seq``) and stays with the
  transport until a response shows the server has it (``OpenEnv-Received``); a
  POST that failed on the network, or was cancelled, is sent again with the same
  number, and the server does not run it twice;
- each reply carries the server's number; the transport acknowledges what it
  holds (``OpenEnv-Ack``) on its next request, and the server keeps every reply
  until then, so a response lost to a timeout, a cancellation or a connection
  the server closed is simply fetched again.

Network errors (a refused connection, a keep-alive connection the server
closed, a read timeout, a proxy's 502/503/504) are retried a few times with a
short backoff, silently; only then does the channel count as broken.
"""

from __future__ import annotations

import secrets
from collections import deque
from typing import Literal
from urllib.parse import quote

import anyio
import anyio.lowlevel
import httpx
import msgspec

from openenv import (
    EVENT_LOOP_CLOCK,
    Clock,
    ConnectError,
    ConnectionClosed,
    ProtocolError,
    Transport,
)
from openenv._limits import DEFAULT_CLIENT_CLOSE_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_POLL_TIMEOUT, DEFAULT_RETRIES
from openenv.channel import FrameQueue
from transports.http._link import PollingLink, create_link
from transports.http._protocol import (
    ACK_HEADER,
    ERROR_HEADER,
    IDEMPOTENCY_KEY_HEADER,
    MEDIA_TYPES,
    RECEIVED_HEADER,
    SEQ_HEADER,
    SESSION_KEY_HEADER,
    SESSIONS_PATH,
    WAIT_HEADER,
    Created,
    Queued,
    QueuePlace,
    dialect_for,
)
from transports.http._requests import (
    READ_MARGIN,
    USER_AGENT,
    Answer,
    RequestFailed,
    creation_answer,
    end_reason,
    error_detail,
    exchange,
)
from transports.link._client import LinkChannel
from transports.link._registry import Private, forget, join
from transports.shared._network_client import (
    ConnectionEnd,
    HeaderPairs,
    client_headers,
    connect_once,
    default_ssl_context,
    is_loopback,
    no_tls_context,
    not_connected,
    split_url,
)

__all__ = ["HTTPPollingTransport", "polling_url"]

_SCHEMES = {"http+poll": "http", "https+poll": "https", "http": "http", "https": "https"}

# Headers the protocol owns; a caller cannot set them.
_OWN_HEADERS = frozenset(
    name.lower()
    for name in (
        SEQ_HEADER,
        ACK_HEADER,
        WAIT_HEADER,
        IDEMPOTENCY_KEY_HEADER,
        SESSION_KEY_HEADER,
        "content-type",
        "content-length",
        "transfer-encoding",
        "host",
    )
)

_SEQ = SEQ_HEADER.encode()
_ACK = ACK_HEADER.encode()
_WAIT = WAIT_HEADER.encode()
_SESSION_KEY_NAME = SESSION_KEY_HEADER.encode()


_decode_created = msgspec.json.Decoder(Created).decode
_decode_queued = msgspec.json.Decoder(Queued).decode


def polling_url(url: str) -> tuple[str, str]:
    """Split a long-polling URL into the server's HTTP base URL and its query string.

    ``http+poll://host:8000/prefix`` becomes ``("http://host:8000/prefix", "")``;
    ``https+poll://`` becomes ``https://``. Trailing slashes are stripped from
    the path; the fragment is dropped; a query string is kept, for every request.

    Args:
        url: ``http+poll://...`` or ``https+poll://...`` (``http://`` and
            ``https://`` are taken as they are).

    Returns:
        The base URL, and the query string (``""`` or ``"?..."``).

    Raises:
        ValueError: Another scheme, or no host.
    """
    parts = split_url(url, _SCHEMES)
    if parts is None:
        raise ValueError(f"{url!r} is not an http+poll:// or https+poll:// URL")
    base = f"{parts.scheme}://{parts.location}"
    try:
        host = httpx.URL(base).host
    except httpx.InvalidURL as exc:
        raise ValueError(f"invalid URL {url!r}: {exc}") from exc
    if not host:
        raise ValueError(f"{url!r} has no host")
    return base, parts.query


class HTTPPollingTransport(Transport):
    """OpenEnv frames over plain HTTP requests: ``http+poll://`` and ``https+poll://``.

    For networks that pass only plain HTTP (proxies, gateways and serverless
    front ends that drop WebSockets), and for steps that run for minutes: no
    request is held longer than ``poll_timeout``, and none is lost or run twice
    when the network or a keep-alive connection fails (see the module docstring
    and ``docs/http-polling.md``). The URL is the server's base URL with the
    scheme ``http+poll`` (or ``https+poll``); plain ``http://`` stays WebSocket.

    The sessions an event loop opens to one server with the same options share
    a link: the frames they send in one turn of the event loop leave in one
    request, and one long poll brings the replies of all of them. Its requests
    are made by the calls waiting on it, and while nobody waits by its keeper
    (`keep`, which the client's owner runs). A server without links gets a
    session of its own per transport, as before.

    Examples:
        ```python
        import httpx

        from openenv.examples.echo import EchoEnv

        async with EchoEnv("http+poll://127.0.0.1:8000", poll_timeout=10.0) as env:
            await env.reset()
            print(env.transport.shared)  # True: on the link every session here shares

        # Your own httpx client: its proxy (proxy="http://proxy:3128"), TLS
        # settings, auth, headers and cookies apply to every request.
        async with httpx.AsyncClient(headers={"Authorization": "Bearer ..."}) as client:
            async with EchoEnv("http+poll://127.0.0.1:8000", client=client) as env:
                await env.reset()
        ```

    Args:
        url: The server's base URL (``http+poll://host:8000``, ``https+poll://host/prefix``).
        client: The ``httpx.AsyncClient`` to send requests with (its proxies,
            TLS settings, auth, headers and cookies apply). The transport never
            closes a client it was given; without one, it makes its own, which
            takes its proxy from ``HTTP_PROXY``, ``HTTPS_PROXY`` or ``ALL_PROXY``
            (``NO_PROXY`` lists hosts reached directly), except for a loopback
            host (``localhost``, ``127.0.0.1``, ``::1``), always reached
            directly; and closes it on `aclose`.
        connect_timeout: Seconds allowed to create the session (retries
            included), and for each TCP/TLS connect afterwards (``None``: no limit).
        poll_timeout: The longest the server may hold one request waiting for a
            reply, in seconds: keep it below the idle timeouts of the proxies on
            the way (often 30 to 60 s). The server may cap it.
        headers: Extra headers for every request, as a mapping or as
            ``(name, value)`` pairs; the protocol's own cannot be set.
        auth_token: The bearer token the server asks for, sent as
            ``Authorization: Bearer <token>``; ``None`` takes it from the
            ``OPENENV_AUTH_TOKEN`` environment variable, if set (unless the given
            ``client`` has its own ``Authorization`` header or auth).
        encoding: The frames' encoding: ``"json"`` or ``"msgpack"``.
        retries: How many times a request that failed on the network (or got a
            gateway's 502, 503 or 504) is tried again, with a short backoff,
            before the channel counts as broken.
        close_timeout: Seconds `aclose` waits for the server to delete the session.
        share: Ride the link this event loop shares with other sessions to the
            same server (``False``: a session of its own, in the per-session protocol).
        clock: Where the connect timeout and the retries' backoff are measured
            (a test's clock, say); the event loop's time by default. The close
            is bounded on the event loop's time, always.

    Attributes:
        url: The server's HTTP base URL.
        session_id: The session's id, once connected; ``None`` on a link.
        shared: Whether the session rides a link; set on connect.
        dialect: How frames are written: the ``encoding``, with request ids.
        link_channel: The session's channel when it rides a link, else ``None``.

    Raises:
        ValueError: An unsupported URL, an unknown encoding, a protocol header in
            ``headers``, both ``auth_token`` and an ``Authorization`` header, or
            a ``poll_timeout`` or ``retries`` out of range.
    """

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        connect_timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
        poll_timeout: float = DEFAULT_POLL_TIMEOUT,
        headers: HeaderPairs | None = None,
        encoding: Literal["json", "msgpack"] = "json",
        retries: int = DEFAULT_RETRIES,
        close_timeout: float = DEFAULT_CLIENT_CLOSE_TIMEOUT,
        auth_token: str | None = None,
        share: bool = True,
        clock: Clock = EVENT_LOOP_CLOCK,
    ) -> None:
        self.url, self._query = polling_url(url)
        self.dialect = dialect_for(encoding)
        if not poll_timeout > 0:
            raise ValueError(f"poll_timeout must be positive, not {poll_timeout}")
        if retries < 0:
            raise ValueError(f"retries must be 0 or more, not {retries}")
        client_authenticates = client is not None and ("authorization" in client.headers or client.auth is not None)
        pairs = client_headers(
            headers,
            auth_token,
            reserved=_OWN_HEADERS,
            owner="the long-polling protocol",
            token_from_env=not client_authenticates,
        )
        self.connect_timeout = connect_timeout
        self.poll_timeout = poll_timeout
        self.retries = retries
        self.close_timeout = close_timeout
        self.share = share
        self.shared = False
        self.session_id: str | None = None
        self._link: PollingLink | None = None
        self.link_channel: LinkChannel | None = None
        self._session_key: str | None = None
        self._headers = pairs
        self._clock = clock
        self._given_client = client
        self._client: httpx.AsyncClient | None = None
        self._media_type = MEDIA_TYPES[encoding]
        self._entered = False
        self._max_body_size: int | None = None
        self._wait = poll_timeout
        # Built once connected: the frames URL and the headers every frame request carries.
        self._frames_url: httpx.URL | None = None
        self._session_url: httpx.URL | None = None
        self._post_headers: list[tuple[bytes, bytes]] = []
        self._get_headers: list[tuple[bytes, bytes]] = []
        self._timeouts: dict[float, dict[str, float | None]] = {}
        # Request frames not yet known to have reached the server, oldest first.
        self._unconfirmed: deque[tuple[int, bytes]] = deque()
        self._next_seq = 1
        self._send_lock: anyio.Lock | None = None  # made on connect, in the event loop
        # Replies for `receive`, oldest first; `_ack` is the last one's number. Only
        # responses bring them, so it closes once the session has ended and no
        # request is in flight; `_end` says why.
        self._inbox: FrameQueue[bytes] = FrameQueue()
        self._ack = 0
        self._end = ConnectionEnd(self.url, "HTTP long-polling session")
        self._posting = 0  # POSTs in flight (their responses may carry replies)
        self._polling = False  # a GET is in flight
        self._settled: anyio.Event | None = None  # set when a request in flight finishes, or on `aclose`
        # Why no frame can be sent: the session ended, the server refused one, ...
        self._send_closed: str | None = None
        self._scopes: set[anyio.CancelScope] = set()  # of the requests in flight

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    # -- connecting ------------------------------------------------------------

    async def __aenter__(self) -> HTTPPollingTransport:
        """Create the session on the server.

        A server at capacity answers with its ``CAPACITY_REACHED`` error frame:
        the transport then connects, hands that frame to the first `receive`,
        and ends (as over WebSocket).

        Returns:
            The transport itself.

        Raises:
            AuthenticationError: The server refused the token (HTTP 401).
            ConnectError: The server is unreachable, refused to create a session
                (the message gives the HTTP status), answered something else than
                the protocol, or `connect_timeout` elapsed.
            ClientStateError: The transport was entered before; create a new one.
        """
        connect_once(self._entered or self._end.by_client, self)
        self._entered = True
        self._send_lock = anyio.Lock(fast_acquire=True)
        if self.share and await self._join_link():
            return self
        client = self._given_client
        if client is None:
            client = self._new_client()
        self._client = client
        try:
            # A new session's key: a creation retried (its response lost) or asked
            # again while it waits in the server's queue is the same creation.
            creation = secrets.token_urlsafe(32)
            queued: QueuePlace | None = None
            while True:
                # Each answer within the connect timeout; a 202 says the server keeps
                # our place in its queue for a slot: ask again, at once.
                answer: httpx.Response | QueuePlace | None = None
                with self._clock.move_on_after(self.connect_timeout):
                    answer = await self._create_session(client, creation)
                if answer is None:
                    waiting = f" (waiting in its queue, at place {queued.position})" if queued is not None else ""
                    raise ConnectError(
                        f"timed out after {self.connect_timeout} s creating a session at {self.url}{waiting}"
                    )
                if isinstance(answer, httpx.Response):
                    self._on_created(answer)
                    break
                queued = answer
        except BaseException:
            self._end.close_by_client()
            if self._given_client is None:
                with anyio.CancelScope(shield=True):
                    await client.aclose()
            raise
        return self

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers={"User-Agent": USER_AGENT},
            # HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and NO_PROXY apply (httpx's trust_env), but
            # never to this machine, which a proxy elsewhere cannot reach (as over WebSocket).
            trust_env=not is_loopback(httpx.URL(self.url).host),
            verify=default_ssl_context() if self.url.startswith("https:") else no_tls_context(),
            # Below the servers' keep-alive timeouts (uvicorn's and hypercorn's are 5 s),
            # so that the client gives up an idle connection before the server closes it.
            limits=httpx.Limits(max_connections=8, max_keepalive_connections=4, keepalive_expiry=4.0),
        )

    async def _join_link(self) -> bool:
        """Open the session on the link this event loop shares with the server; whether the server offers links."""
        key = (
            "http+poll",
            self.url,
            self._query,
            tuple(self._headers),
            self.dialect.encoding,
            self._given_client,
            self.poll_timeout,
            self.retries,
            self.connect_timeout,
            self.close_timeout,
            self._clock,
        )

        async def connect() -> PollingLink | Private:
            given = self._given_client
            return await create_link(
                self._new_client() if given is None else given,
                owns_client=given is None,
                url=self.url,
                query=self._query,
                headers=self._headers,
                encoding=self.dialect.encoding,
                media_type=self._media_type,
                poll_timeout=self.poll_timeout,
                retries=self.retries,
                connect_timeout=self.connect_timeout,
                close_timeout=self.close_timeout,
                clock=self._clock,
                on_idle=lambda link: forget(key, link),
            )

        link = await join(key, connect)
        if link is None:
            return False
        try:
            self.link_channel = link.open()
        except ConnectionClosed as exc:  # the link ended between its opening and now: say so as a connect error
            raise ConnectError(f"cannot open a session on the link to {self.url}: {exc}") from exc
        self._link = link
        self.shared = True
        self.send_waits = False  # a frame is posted, and leaves with the next receive's request
        return True

    async def _create_session(self, client: httpx.AsyncClient, creation: str) -> httpx.Response | QueuePlace:
        """Ask for the session once (retrying network failures): the answer, or where it waits in the queue."""
        url = f"{self.url}{SESSIONS_PATH}{self._query}"
        headers = [*self._headers, ("Content-Type", "application/json")]
        # A retried creation returns the session the first attempt made, if it made one.
        headers.append((IDEMPOTENCY_KEY_HEADER, creation))
        # How long the server may hold the request while the session waits for a slot: well within our timeout.
        hold = self.poll_timeout if self.connect_timeout is None else max(self.connect_timeout / 2, 0.1)
        headers.append((WAIT_HEADER, f"{min(hold, self.poll_timeout):g}"))
        body = msgspec.json.encode({"encoding": self.dialect.encoding})
        request = client.build_request(
            "POST", url, headers=headers, content=body, timeout=httpx.Timeout(self.connect_timeout)
        )
        try:
            response = await self._exchange(request, owned_by_protocol=ERROR_HEADER)
        except RequestFailed as exc:
            raise ConnectError(f"cannot create a session at {self.url}: {exc.reason}") from exc.cause
        if response.status_code == 202:
            try:
                return _decode_queued(response.content).queued
            except msgspec.DecodeError:
                pass  # not our server's 202: _on_created says what came
        return response

    def _on_created(self, response: httpx.Response) -> None:
        status = response.status_code
        if status == 503 and response.headers.get(ERROR_HEADER):
            # Refused, with the error frame that says why: hand it to `receive`, then end.
            reason = f"the server at {self.url} refused the session ({response.headers[ERROR_HEADER]})"
            self._inbox.put(response.content)
            self._finish(ConnectionClosed(reason))
            return
        hint = " (is it an openenv server with HTTP long-polling?)" if status in (404, 405) else ""
        created = creation_answer(response, self.url, "a session", _decode_created, hint)
        self.session_id = created.session_id
        self._session_key = created.session_key
        self._max_body_size = created.max_body_size
        if created.max_wait is not None:
            self._wait = min(self.poll_timeout, created.max_wait)
        session = f"{self.url}{SESSIONS_PATH}/{quote(created.session_id, safe='')}"
        self._session_url = httpx.URL(f"{session}{self._query}")
        self._frames_url = httpx.URL(f"{session}/frames{self._query}")
        self._build_headers()

    def _build_headers(self) -> None:
        """Build the headers of frame requests once: the client's own (auth, cookies, ...) and ours.

        Building a request through the client merges its headers and cookies,
        which costs more than the rest of a request's making; a frame request
        copies this list instead. Rebuilt when the server sets a cookie.
        """
        client, url = self._client, self._frames_url
        assert client is not None
        assert url is not None
        template = client.build_request("GET", url, headers=self._headers)
        common = [
            (name, value)
            for name, value in template.headers.raw
            if name.lower() not in (b"content-length", b"transfer-encoding", b"content-type")
        ]
        if self._session_key is not None:
            common.append((_SESSION_KEY_NAME, self._session_key.encode()))
        self._get_headers = common
        self._post_headers = [*common, (b"Content-Type", self._media_type.encode())]

    def _timeout(self, wait: float) -> dict[str, float | None]:
        timeout = self._timeouts.get(wait)
        if timeout is None:
            connect = self.connect_timeout
            timeout = self._timeouts[wait] = {
                "connect": connect,
                "read": wait + READ_MARGIN,
                "write": None,
                "pool": connect,
            }
        return timeout

    # -- requests --------------------------------------------------------------

    def _frame_request(self, seq: int, frame: bytes, wait: float) -> httpx.Request:
        headers = [
            *self._post_headers,
            (b"Content-Length", b"%d" % len(frame)),
            (_SEQ, b"%d" % seq),
            (_ACK, b"%d" % self._ack),
            (_WAIT, b"%g" % wait),
        ]
        assert self._frames_url is not None
        return httpx.Request(
            "POST",
            self._frames_url,
            headers=headers,
            stream=httpx.ByteStream(frame),
            extensions={"timeout": self._timeout(wait)},
        )

    def _poll_request(self, wait: float) -> httpx.Request:
        headers = [*self._get_headers, (_ACK, b"%d" % self._ack), (_WAIT, b"%g" % wait)]
        assert self._frames_url is not None
        return httpx.Request(
            "GET",
            self._frames_url,
            headers=headers,
            stream=httpx.ByteStream(b""),
            extensions={"timeout": self._timeout(wait)},
        )

    async def _send_request(self, request: httpx.Request, what: str) -> Answer:
        """Send one request, retrying network failures; translate httpx's failures at this one place.

        Returns:
            The response, with the protocol's headers read.

        Raises:
            ConnectionClosed: It failed ``retries + 1`` times, or cannot be sent
                at all (the channel is then broken); or `aclose` was called meanwhile.
        """
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        try:
            with scope:
                try:
                    response = await self._exchange(request, owned_by_protocol=RECEIVED_HEADER)
                except RequestFailed as exc:
                    tries = f" {exc.attempts} times; the last time" if exc.attempts > 1 else ""
                    error = ConnectionClosed(f"{what} to {self.url} failed{tries}: {exc.reason}")
                    self._finish(error)
                    raise error from exc.cause
                answer = Answer(response)
                if answer.sets_cookie:
                    self._build_headers()
                return answer
        finally:
            self._scopes.discard(scope)
        # Reached only when `aclose` cancelled the request.
        raise self._end.closed_by_client_error()

    async def _exchange(self, request: httpx.Request, *, owned_by_protocol: str) -> httpx.Response:
        """Send one request with the retry loop (`transports.http._requests.exchange`)."""
        client = self._client
        assert client is not None
        return await exchange(
            client, request, retries=self.retries, clock=self._clock, owned_by_protocol=owned_by_protocol
        )

    def _confirm(self, answer: Answer) -> None:
        """Forget the request frames the server says it has (``OpenEnv-Received``)."""
        received = answer.received
        if received is not None and received.isdigit():
            self._confirm_through(int(received))

    def _confirm_through(self, number: int) -> None:
        """Forget the request frames up to ``number``: the server has them (a 2xx to a POST says so)."""
        unconfirmed = self._unconfirmed
        while unconfirmed and unconfirmed[0][0] <= number:
            unconfirmed.popleft()

    def _deliver(self, answer: Answer) -> None:
        """Queue the reply frame a 200 response carries, once, in order."""
        seq_text = answer.seq
        if seq_text is None or not seq_text.isdigit():
            raise ProtocolError(f"the server at {self.url} sent a frame without a valid {SEQ_HEADER} header")
        seq = int(seq_text)
        if seq <= self._ack:
            return  # a reply we hold already (sent again: our acknowledgement crossed it)
        if seq != self._ack + 1:
            raise ProtocolError(f"the server at {self.url} skipped replies: got {seq} after {self._ack}")
        self._ack = seq
        if not self._end.by_client:  # nobody reads any more: drop it
            self._inbox.put(answer.response.content)

    def _settle(self) -> None:
        """A request finished (or the state changed): wake the receivers waiting for it; close a finished inbox."""
        if self._end.error is not None and not self._posting and not self._polling:
            self._inbox.close()  # no response left to bring a frame
        settled = self._settled
        if settled is not None:
            self._settled = None
            settled.set()

    def _finish(self, error: ConnectionClosed | ProtocolError) -> None:
        """No frame can come after those queued and those the requests in flight bring, nor be sent."""
        self._end.note(error)
        if self._send_closed is None:
            self._send_closed = str(error)
        self._settle()

    def _refusal(self, answer: Answer, what: str) -> str:
        response = answer.response
        return f"the server at {self.url} refused {what}: HTTP {response.status_code} {error_detail(response)}"

    # -- the Transport API -----------------------------------------------------

    async def send(self, frame: bytes) -> None:
        """Send one request frame; the server's response may bring a reply, queued for `receive`.

        A frame whose POST failed on the network, or was cancelled, is sent again
        (with the same number) before the next one: the server runs each frame
        once, in order.

        Args:
            frame: The encoded request.

        Raises:
            ConnectionClosed: The session has ended, or the channel is closed or
                broken (the network failed ``retries + 1`` times; the server
                refused the frame, e.g. ``413`` for one over its size limit).
        """
        link = self._link
        if link is not None:
            assert self.link_channel is not None
            link.post(self.link_channel, frame)
            return
        lock = self._send_lock
        if self._end.by_client or self._client is None or lock is None:
            raise not_connected("HTTP long-polling", self.url)
        async with lock:
            if self._send_closed is not None:
                raise ConnectionClosed(self._send_closed)
            limit = self._max_body_size
            if limit is not None and len(frame) > limit:
                reason = f"a frame of {len(frame)} bytes is over the server's limit of {limit} bytes"
                self._finish(ConnectionClosed(reason))
                raise ConnectionClosed(reason)
            seq = self._next_seq
            self._next_seq = seq + 1
            self._unconfirmed.append((seq, frame))
            await self._post_unconfirmed()

    async def _post_unconfirmed(self) -> None:
        """POST every frame not known to have reached the server, oldest first; hold the send lock.

        Frames before the last (their POSTs failed, or were cut short) only need
        to reach the server: it is asked not to wait for a reply to them. The
        last one's POST waits for the reply, which comes in its response.
        """
        unconfirmed = self._unconfirmed
        self._posting += 1
        try:
            while unconfirmed:
                seq, frame = unconfirmed[0]
                wait = self._wait if len(unconfirmed) == 1 else 0.0
                answer = await self._send_request(self._frame_request(seq, frame, wait), f"sending frame {seq}")
                self._on_response(answer, seq)
        except ProtocolError as exc:
            self._finish(exc)
            raise ConnectionClosed(str(exc)) from exc
        finally:
            self._posting -= 1
            self._settle()

    def _on_response(self, answer: Answer, seq: int | None) -> None:
        """Act on a frame request's response: the one status dispatcher.

        Args:
            answer: The response.
            seq: The number of the frame a POST sent; ``None`` for a poll.

        Raises:
            ConnectionClosed: A POST's frame will never run (the session ended
                before it, the server refused it or forgot the session).
            ProtocolError: A poll got an answer that is not the protocol.
        """
        status = answer.response.status_code
        if status == 200 or status == 204:
            if seq is None:
                self._confirm(answer)
            else:
                self._confirm_through(seq)  # a 2xx to a POST: the server has the frame
            if status == 200:
                self._deliver(answer)
        elif status == 410:
            self._confirm(answer)
            why = end_reason(answer.response, "the session has ended: ")
            reason = f"the session at {self.url} has ended: {why}"
            if seq is None:
                self._finish(ConnectionClosed(reason))
                return
            self._send_closed = reason
            if self._unconfirmed and self._unconfirmed[0][0] <= seq:
                self._unconfirmed.clear()
                raise ConnectionClosed(reason)
            # The frame arrived (a close, say), and a 410 comes only once the client
            # holds every reply: nothing is left to fetch (a reply in flight in another
            # request still arrives), and the server may be going away.
            self._finish(ConnectionClosed(reason))
        elif status == 404:
            # The server does not know the session (any more): no use deleting it.
            self._session_url = None
            error = ConnectionClosed(f"the server at {self.url} does not know this session: it ended or expired")
            self._finish(error)
            if seq is not None:
                raise error
        else:
            refusal = self._refusal(answer, "a poll" if seq is None else f"frame {seq}")
            if seq is None:
                raise ProtocolError(refusal)
            error = ConnectionClosed(refusal)
            self._finish(error)
            raise error

    async def receive(self) -> bytes:
        """Return the next reply frame.

        Replies that came in POST responses are returned at once; otherwise it
        long-polls the server. A cancelled `receive` loses nothing: a reply is
        kept by the server until a later request acknowledges it.

        Returns:
            The frame, as the server encoded it.

        Raises:
            ConnectionClosed: The session has ended (after every frame sent before
                the end was returned), the channel broke, or `aclose` was called.
            ProtocolError: The server answered something that is not the protocol.
        """
        link = self._link
        if link is not None:
            assert self.link_channel is not None
            return await link.receive(self.link_channel)
        inbox = self._inbox
        while True:
            if self._end.by_client:
                self._end.raise_ended()
            if inbox:
                await anyio.lowlevel.checkpoint_if_cancelled()
                return await inbox.get()  # at once: a frame is there
            if inbox.closed:  # and drained: no frame will come
                self._end.raise_ended()
            if self._client is None:
                raise not_connected("HTTP long-polling", self.url)
            if self._posting or self._polling:
                # A POST in flight brings the reply in its response; or another
                # receiver is polling. Wait for either to finish.
                settled = self._settled
                if settled is None:
                    settled = self._settled = anyio.Event()
                await settled.wait()
                continue
            if self._unconfirmed:
                if self._send_closed is not None:
                    self._unconfirmed.clear()  # the session has ended: they will never run
                else:
                    # A frame whose send was cut short, and no send since to carry it:
                    # make sure it reached the server before waiting for its reply.
                    assert self._send_lock is not None
                    async with self._send_lock:
                        if self._unconfirmed and self._send_closed is None:
                            await self._post_unconfirmed()
                continue
            self._polling = True
            try:
                answer = await self._send_request(self._poll_request(self._wait), "polling for a reply")
                self._on_response(answer, None)
            except (ConnectionClosed, ProtocolError) as exc:
                if not self._end.by_client:
                    self._finish(exc)
                raise
            finally:
                self._polling = False
                self._settle()

    def send_nowait(self, frame: bytes) -> None:
        """Post a frame on the link, to leave with the next request (a session of its own POSTs: it cannot).

        Raises:
            anyio.WouldBlock: The session is not on a link: await `send` instead.
            ConnectionClosed: The session has ended, or the frame was refused (see `send`).
        """
        link = self._link
        if link is None:
            raise anyio.WouldBlock
        assert self.link_channel is not None
        link.post(self.link_channel, frame)

    def receive_nowait(self) -> bytes:
        """A reply that came already, on a link (a session of its own: await `receive`).

        Raises:
            anyio.WouldBlock: None came, or the session is not on a link.
            ConnectionClosed: The session has ended and every frame was returned.
            ProtocolError: The server broke the protocol.
        """
        link = self._link
        if link is None:
            raise anyio.WouldBlock
        assert self.link_channel is not None
        return link.receive_nowait(self.link_channel)

    async def keep(self) -> None:
        """Keep the link while nobody calls: long-poll it, so it stays alive and the server's news arrives.

        Its owner runs it in a task of its own from connect to close (see
        `openenv.Transport.keep`); a session of its own has no idle work.
        """
        if self._link is not None:
            await self._link.keep()

    async def aclose(self) -> None:
        """Delete the session on the server, and close the client if it is the transport's own.

        Waits at most `close_timeout` seconds for the server; idempotent, and
        safe on a broken channel. Requests in flight end; afterwards `send` and
        `receive` raise `ConnectionClosed`.
        """
        link = self._link
        if link is not None:
            assert self.link_channel is not None
            self._end.close_by_client()
            await link.leave(self.link_channel)
            return
        if self._end.by_client:
            return
        self._end.close_by_client()
        self._inbox.close()
        for scope in list(self._scopes):
            scope.cancel()
        self._settle()
        client = self._client
        if client is None:
            return
        try:
            url = self._session_url
            if url is not None:
                # On the event loop's time, whatever the clock: a close may run shielded.
                with anyio.move_on_after(self.close_timeout):
                    try:
                        request = httpx.Request(
                            "DELETE", url, headers=self._get_headers, extensions={"timeout": self._timeout(0.0)}
                        )
                        await client.send(request, follow_redirects=False)
                    except (httpx.HTTPError, httpx.StreamError, RuntimeError):
                        pass  # the server will reap the session when it has been idle long enough
        finally:
            if self._given_client is None:
                with anyio.CancelScope(shield=True):
                    await client.aclose()

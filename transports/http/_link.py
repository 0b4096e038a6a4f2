"""A link over HTTP long-polling, client side: every session this event loop opens to a server, in one set of requests.

A `PollingLink` carries its sessions' frames in envelopes (`transports.link._envelope`)
over the ``/poll/links/{id}`` routes (``docs/http-polling.md``, "Links"). It runs
no task of its own; its requests are made by the calls made on it:

- a session waiting in `PollingLink.receive` with frames posted and not sent
  POSTs them (the frames every session posted in the same turn of the event
  loop: one message), and waits in that request for what comes back;
- a session waiting with nothing to send long-polls (``GET``) for every
  session, unless a request of the link is in flight already: then it waits for
  that one, which brings the link's next entries, whoever they are for;
- while nobody waits, the link's keeper (`ClientLink.keep`, run by the
  client's owner) long-polls once nobody has for `IDLE_POLL` seconds, so the
  link stays alive and the server's news (a session it ended) arrives.

The server holds one request of the link at a time waiting for entries; a newer
request answers it at once. So a session never waits behind another's long
poll to send, and at most `MAX_POSTS` POSTs and one GET are in flight.

Exactly once, both ways: each message keeps its number (``OpenEnv-Seq``) until
a response shows the server took it (``OpenEnv-Received``), and is sent again,
the same, after a failure or a cancellation (the server takes each number
once); each response carries every entry after the last place the client holds
(``OpenEnv-Ack``), so one that is lost is carried again by the next, and frames
held already are dropped by their numbers on their channels.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from urllib.parse import quote

import anyio
import anyio.lowlevel
import httpx
import msgspec

from openenv import Clock, ConnectError, ConnectionClosed, OpenEnvError, ProtocolError
from transports.http._protocol import (
    ACK_HEADER,
    ERROR_HEADER,
    LINK_KEY_HEADER,
    LINKS_PATH,
    RECEIVED_HEADER,
    SEQ_HEADER,
    WAIT_HEADER,
    LinkCreated,
)
from transports.http._requests import (
    Answer,
    Body,
    RequestFailed,
    creation_answer,
    end_reason,
    error_code,
    error_detail,
    exchange,
    timeouts,
)
from transports.link._client import ClientLink, LinkChannel, fresh
from transports.link._envelope import End, Entry, EnvelopeCodec, fits
from transports.link._registry import PRIVATE, Private
from transports.link._state import ClientLinkState, LinkProtocolError

__all__ = ["IDLE_POLL", "MAX_POSTS", "PollingLink", "create_link"]

IDLE_POLL = 1.0
"""Seconds a link goes without a request before its keeper long-polls it."""

MAX_POSTS = 2
"""POSTs of a link in flight at once: the one the server holds waiting, and the one that answers it."""

_SEQ = SEQ_HEADER.encode()
_ACK = ACK_HEADER.encode()
_WAIT = WAIT_HEADER.encode()
_LINK_KEY = LINK_KEY_HEADER.encode()


class _Message:
    """One envelope the link sent or will send, until the server is known to have taken it."""

    __slots__ = ("body", "in_flight", "number")

    def __init__(self, number: int, body: bytes) -> None:
        self.number = number
        self.body = body
        self.in_flight = False


class PollingLink(ClientLink):
    """The sessions of one HTTP long-polling link, client side; see the module's docstring.

    A session leaving (`ClientLink.leave`) tells the server (an `End` on its channel).

    Args:
        client: The httpx client that sends the link's requests.
        owns_client: Close ``client`` when the link closes.
        url: The server's HTTP base URL, for the messages.
        link_url: The link's URL (``.../poll/links/{id}``, with the query string).
        link_key: The link's key, which every request carries.
        headers: The caller's headers, for every request (beside the client's own).
        codec: The link's envelope codec.
        media_type: The envelopes' media type.
        max_body_size: The largest message the server takes (``None``: it says none).
        wait: Seconds the server may hold a request waiting for entries.
        retries: How many times a request the network failed is sent again.
        connect_timeout: Seconds allowed for each TCP/TLS connect.
        close_timeout: Seconds `aclose` (and a session leaving) waits for the server.
        clock: Where the keeper's waits and the retries' backoff are measured.
        on_idle: Called once when the link ends, or its last session leaves.
    """

    _session_name = "HTTP long-polling session"

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        owns_client: bool,
        url: str,
        link_url: httpx.URL,
        link_key: str,
        headers: list[tuple[str, str]],
        codec: EnvelopeCodec,
        media_type: str,
        max_body_size: int | None,
        wait: float,
        retries: int,
        connect_timeout: float | None,
        close_timeout: float,
        clock: Clock,
        on_idle: Callable[[ClientLink], object] = lambda link: None,
    ) -> None:
        super().__init__(url=url, codec=codec, clock=clock, close_timeout=close_timeout, on_idle=on_idle)
        assert self._state is not None  # a polling link always carries envelopes
        self._envelopes: ClientLinkState = self._state
        self._envelope_codec: EnvelopeCodec = codec
        self._client = client
        self._owns_client = owns_client
        self._link_url = link_url
        self._link_key = link_key.encode()
        self._headers = headers
        self._media_type = media_type.encode()
        self._get_headers: list[tuple[bytes, bytes]] = []
        self._post_headers: list[tuple[bytes, bytes]] = []
        self._build_headers()
        self._max_body_size = max_body_size
        self._wait = wait
        self._retries = retries
        self._connect_timeout = connect_timeout
        self._messages: deque[_Message] = deque()  # not yet known to be taken, oldest first
        self._next_message = 1
        self._held = 0  # the place, in the server's log, of the last entry received
        self._requests = 0  # in flight
        self._posts = 0  # POSTs in flight
        self._last_request = clock.now()  # when a request last began or ended
        self._request_ended: anyio.Event | None = None
        self._coalescing = False  # a session lets the others of this turn post their frames
        self._scopes: set[anyio.CancelScope] = set()  # of the requests in flight
        self._known = True  # the server knows the link (a DELETE makes sense)

    # -- sessions ------------------------------------------------------------------------

    def post(self, channel: LinkChannel, frame: bytes) -> None:
        """Queue one of a session's frames; it leaves with the next message (see `receive`).

        Raises:
            ConnectionClosed: The session's channel has ended, or the frame is
                larger than the server takes or not one value of the link's
                encoding (the session ends, alone: the frame was not sent).
        """
        if not fits(len(frame), self._max_body_size) and channel.ended is None:
            self._refuse(
                channel, f"a frame of {len(frame)} bytes is over the server's limit of {self._max_body_size} bytes"
            )
        super().post(channel, frame)

    async def receive(self, channel: LinkChannel) -> bytes:
        """The next frame for a session, brought by this call's request or by another's.

        Frames that came before the channel ended are returned first.

        Raises:
            ConnectionClosed: The channel has ended (the server ended the
                session, the link failed or ended, or it was closed).
            ProtocolError: The server broke the protocol.
        """
        frames = channel.frames
        coalesced = False
        while True:
            if frames:
                frame = frames.popleft()
                if type(frame) is bytes:
                    return frame
                continue  # a batch's reply: this link never asks for batches, so never gets one
            if channel.ended is not None:
                raise fresh(channel.ended)
            if not self._coalescing:
                if self._posts < MAX_POSTS and self._unsent():
                    if len(self._channels) > 1 and not coalesced:
                        # Let the other sessions that run in this turn post theirs first: one message for all.
                        coalesced = self._coalescing = True
                        try:
                            await anyio.lowlevel.checkpoint()
                        except BaseException:
                            self._coalescing = False
                            self._wake_one()  # the others waited for this one's request: one of them makes it
                            raise
                        self._coalescing = False
                        continue
                    await self._post(self._wait)
                    continue
                if not self._requests:
                    await self._poll(self._wait)
                    continue
            try:
                await self._wait_for(channel)
            except BaseException:
                self._wake_one()  # it was this session's turn, perhaps: hand it on
                raise

    def _left(self, channel: LinkChannel) -> None:
        """Tell the server the session is over (an `End` on its channel), unless the server ended it."""
        self._envelopes.leave(channel.number)

    async def aclose(self) -> None:
        """Close the link: send what is posted, then end it on the server (``DELETE``).

        Every session still on it is ended. Idempotent; shielded and bounded
        (by ``close_timeout``); never raises.
        """
        if self._closing:
            return
        self._closing = True
        self._forget()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(self._close_timeout):
                if self._ended is None:
                    with contextlib.suppress(OpenEnvError):
                        await self._flush()
                if self._known:
                    request = httpx.Request(
                        "DELETE",
                        self._link_url,
                        headers=self._get_headers,
                        extensions={"timeout": timeouts(self._connect_timeout, 0.0)},
                    )
                    with contextlib.suppress(httpx.HTTPError, httpx.StreamError, RuntimeError):
                        await self._client.send(request, follow_redirects=False)
            self._end_all(ConnectionClosed(f"the HTTP long-polling link to {self.url} was closed by the client"))
            for scope in list(self._scopes):
                scope.cancel()
            if self._owns_client:
                await self._client.aclose()

    # -- the keeper ------------------------------------------------------------------------

    async def _keep(self) -> None:
        """Long-poll while nobody does (once the link has gone `IDLE_POLL` seconds without a request)."""
        clock = self._clock
        while self._ended is None and not self._closing:
            quiet = clock.now() - self._last_request
            # Nobody's request is in flight, for a second: the sessions think (or those waiting
            # were not woken to make one, which must not leave them waiting).
            if not self._requests and not self._coalescing and quiet >= IDLE_POLL:
                if self._posts < MAX_POSTS and self._unsent():
                    await self._post(self._wait)
                else:
                    await self._poll(self._wait)
                continue
            await clock.sleep(IDLE_POLL - quiet if quiet < IDLE_POLL else IDLE_POLL)

    # -- requests --------------------------------------------------------------------------

    def _build_headers(self) -> None:
        """Build the headers of the link's requests once: the client's own (auth, cookies, ...) and ours.

        Building a request through the client merges its headers and cookies,
        which costs more than the rest of a request's making; each request
        copies this list instead. Rebuilt when the server sets a cookie.
        """
        template = self._client.build_request("GET", self._link_url, headers=self._headers)
        common = [
            (name, value)
            for name, value in template.headers.raw
            if name.lower() not in (b"content-length", b"transfer-encoding", b"content-type")
        ]
        common.append((_LINK_KEY, self._link_key))
        self._get_headers = common
        self._post_headers = [*common, (b"Content-Type", self._media_type)]

    def _unsent(self) -> bool:
        """Whether entries are posted and not sent, or a message is not in flight and not known to be taken."""
        if self._envelopes.has_outgoing:
            return True
        return any(not message.in_flight for message in self._messages)

    async def _flush(self) -> None:
        """Send everything posted, without waiting for entries; return once the server has it (or the link ended)."""
        while self._ended is None and (self._envelopes.has_outgoing or self._messages):
            if self._posts < MAX_POSTS and self._unsent():
                await self._post(0.0)
            else:
                ended = self._request_ended
                if ended is None:
                    ended = self._request_ended = anyio.Event()
                await ended.wait()

    async def _post(self, wait: float) -> None:
        """POST the oldest message not in flight (a new one of the entries posted, if none); handle its response."""
        message = next((message for message in self._messages if not message.in_flight), None)
        if message is None:
            entries = self._envelopes.outgoing()
            if not entries:
                return
            self._pack(entries)
            message = next(message for message in self._messages if not message.in_flight)
        if message is not self._messages[-1]:
            wait = 0.0  # others follow it: do not let the server hold it
        message.in_flight = True
        self._posts += 1
        try:
            headers = [
                *self._post_headers,
                (b"Content-Length", b"%d" % len(message.body)),
                (_SEQ, b"%d" % message.number),
            ]
            await self._request("POST", headers, message.body, wait, message)
        finally:
            message.in_flight = False
            self._posts -= 1

    def _pack(self, entries: list[Entry]) -> None:
        """Number the entries posted as messages, each within the server's size limit."""
        for body in self._envelope_codec.encode_within(entries, self._max_body_size):
            self._messages.append(_Message(self._next_message, body))
            self._next_message += 1

    async def _poll(self, wait: float) -> None:
        """Long-poll (``GET``) for the link's next entries; handle the response."""
        await self._request("GET", self._get_headers, b"", wait, None)

    async def _request(
        self, method: str, headers: list[tuple[bytes, bytes]], body: bytes, wait: float, message: _Message | None
    ) -> None:
        """Send one request of the link, with the retry loop, and act on its response.

        A request that fails for good ends the link. Cancellation passes through;
        a message whose POST was cancelled is sent again by the next request.
        """
        request = httpx.Request(
            method,
            self._link_url,
            headers=[*headers, (_ACK, b"%d" % self._held), (_WAIT, b"%g" % wait)],
            stream=Body(body),
            extensions={"timeout": timeouts(self._connect_timeout, wait)},
        )
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        self._requests += 1
        self._last_request = self._clock.now()
        try:
            with scope:
                try:
                    response = await exchange(
                        self._client,
                        request,
                        retries=self._retries,
                        clock=self._clock,
                        owned_by_protocol=RECEIVED_HEADER,
                    )
                except RequestFailed as exc:
                    what = f"message {message.number}" if message is not None else "a poll"
                    tries = f" {exc.attempts} times; the last time" if exc.attempts > 1 else ""
                    self._end_all(
                        ConnectionClosed(f"sending {what} of the link to {self.url} failed{tries}: {exc.reason}"),
                        exc.cause,
                    )
                    return
                self._on_response(response, message)
        finally:
            self._scopes.discard(scope)
            self._requests -= 1
            self._last_request = self._clock.now()
            self._settle()

    def _settle(self) -> None:
        """A request ended: wake whoever waits for that, and a session whose turn it is to make the next one."""
        ended, self._request_ended = self._request_ended, None
        if ended is not None:
            ended.set()
        if not self._requests or (self._posts < MAX_POSTS and self._unsent()):
            self._wake_one()

    def _on_response(self, response: httpx.Response, message: _Message | None) -> None:
        """Act on a response of the link: the one status dispatcher."""
        status = response.status_code
        answer = Answer(response)
        seq, received = answer.seq, answer.received
        if answer.sets_cookie:
            self._build_headers()  # the client kept the cookie (sticky load balancing, say): send it from now on
        if received is not None and received.isdigit():
            self._confirm(int(received))
        if status == 200:
            self._take(response.content, seq)
        elif status == 204:
            pass
        elif status == 410:
            self._known = False
            why = end_reason(response, "the link has ended: ")
            self._end_all(ConnectionClosed(f"the link to {self.url} has ended: {why}"))
        elif status == 404:
            self._known = False
            self._end_all(
                ConnectionClosed(
                    f"the server at {self.url} does not know this link: it ended, or expired, or restarted"
                )
            )
        elif status == 409 and message is not None and error_code(response) == "sequence_gap":
            pass  # an earlier message has not reached the server: it is sent again, then this one
        else:
            what = f"message {message.number}" if message is not None else "a poll"
            self._end_all(
                ConnectionClosed(
                    f"the server at {self.url} refused {what} of the link: HTTP {status} {error_detail(response)}"
                )
            )

    def _confirm(self, received: int) -> None:
        """Forget the messages up to number ``received``: the server has taken them."""
        messages = self._messages
        while messages and messages[0].number <= received:
            messages.popleft()

    def _take(self, content: bytes, seq: bytes | None) -> None:
        """Hand the entries of a response to their sessions, once each."""
        try:
            entries = self._envelope_codec.decode(content)
        except msgspec.DecodeError as exc:
            self._end_all(ProtocolError(f"the server at {self.url} sent a response that is not an envelope: {exc}"))
            return
        if seq is None or not seq.isdigit():
            self._end_all(ProtocolError(f"the server at {self.url} sent entries without a valid {SEQ_HEADER}"))
            return
        last = int(seq)
        if last - len(entries) > self._held:
            self._end_all(
                ProtocolError(
                    f"the server at {self.url} skipped entries: got {last - len(entries) + 1} after {self._held}"
                )
            )
            return
        try:
            self._envelopes.take(entries)  # the link's own controls: none on this carrier
        except LinkProtocolError as exc:
            self._end_all(ProtocolError(f"the server at {self.url} broke the link protocol: {exc}"))
            return
        if last > self._held:
            self._held = last

    def _ended_text(self, end: End) -> str:
        return (
            f"the session at {self.url} has ended: {end.reason}"
            if end.reason
            else f"the session at {self.url} has ended"
        )


_decode_created = msgspec.json.Decoder(LinkCreated).decode


async def create_link(
    client: httpx.AsyncClient,
    *,
    owns_client: bool,
    url: str,
    query: str,
    headers: list[tuple[str, str]],
    encoding: str,
    media_type: str,
    poll_timeout: float,
    retries: int,
    connect_timeout: float | None,
    close_timeout: float,
    clock: Clock,
    on_idle: Callable[[ClientLink], object],
) -> PollingLink | Private:
    """Create a link on the server (``POST /poll/links``); `PRIVATE` if it offers none (an older openenv).

    Args:
        client: The httpx client for the link's requests.
        owns_client: Close ``client`` with the link (and here, when there is no link).
        url: The server's HTTP base URL.
        query: The URL's query string, kept on every request.
        headers: The caller's headers, for every request.
        encoding: The sessions' encoding (``"json"`` or ``"msgpack"``).
        media_type: Its media type.
        poll_timeout: The longest the server may hold a request.
        retries: How many times a request the network failed is sent again.
        connect_timeout: Seconds allowed to create the link (retries included), and for each connect after.
        close_timeout: Seconds the link's close waits for the server.
        clock: Where the timeouts and the retries' backoff are measured.
        on_idle: Called once when the link ends, or its last session leaves.

    Returns:
        The link, or `PRIVATE`.

    Raises:
        AuthenticationError: The server refused the token (HTTP 401).
        ConnectError: The server is unreachable, refused, answered something
            else than the protocol, or ``connect_timeout`` elapsed.
    """
    request = client.build_request(
        "POST",
        f"{url}{LINKS_PATH}{query}",
        headers=[*headers, ("Content-Type", "application/json")],
        content=msgspec.json.encode({"encoding": encoding}),
        timeout=httpx.Timeout(connect_timeout),
    )
    try:
        response: httpx.Response | None = None
        with clock.move_on_after(connect_timeout):
            try:
                response = await exchange(client, request, retries=retries, clock=clock, owned_by_protocol=ERROR_HEADER)
            except RequestFailed as exc:
                raise ConnectError(f"cannot create a link at {url}: {exc.reason}") from exc.cause
        if response is None:
            raise ConnectError(f"timed out after {connect_timeout} s creating a link at {url}")
        status = response.status_code
        if status in (404, 405):
            if owns_client:
                with anyio.CancelScope(shield=True):
                    await client.aclose()
            return PRIVATE  # a server without links: a session of its own, as before
        created = creation_answer(response, url, "a link", _decode_created)
    except BaseException:
        if owns_client:
            with anyio.CancelScope(shield=True):
                await client.aclose()
        raise
    wait = poll_timeout if created.max_wait is None else min(poll_timeout, created.max_wait)
    return PollingLink(
        client,
        owns_client=owns_client,
        url=url,
        link_url=httpx.URL(f"{url}{LINKS_PATH}/{quote(created.link_id, safe='')}{query}"),
        link_key=created.link_key,
        headers=headers,
        codec=EnvelopeCodec("msgpack" if encoding == "msgpack" else "json"),
        media_type=media_type,
        max_body_size=created.max_body_size or None,
        wait=wait,
        retries=retries,
        connect_timeout=connect_timeout,
        close_timeout=close_timeout,
        clock=clock,
        on_idle=on_idle,
    )

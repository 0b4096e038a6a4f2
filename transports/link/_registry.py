"""The links this event loop holds: one per server and set of options, shared by every session to it.

All the sessions a process opens to one server (the same URL, credentials and
options) ride one link, as httpx's clients share a connection pool. The first
session to connect opens it; the sessions that connect meanwhile wait for it
and open their channels on it at once. A server that does not offer links
(OpenEnv's, an older openenv) is remembered, and every session then gets a
connection (or a session) of its own, as before, without trying again.

Why one connection rather than a few: the server answers a link's frames as a
batch (the more sessions in one message, the less each costs), a session never
waits behind another's work (its frames are handed over as they come, not in
turn), and one socket is what firewalls, proxies and the server's connection
limit count. A reply far larger than the others does hold up the replies behind
it on the wire; a client expecting such replies opens the sessions that send
them with ``share=False``.

The registry knows nothing of what carries a link (a WebSocket connection, HTTP
long-polling requests): a transport hands it a key (its URL and every option)
and a way to open one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Protocol, TypeVar

import anyio
import anyio.lowlevel

from openenv import OpenEnvError

__all__ = ["PRIVATE", "Private", "SharedLink", "forget", "join"]


class SharedLink(Protocol):
    """What the registry asks of a link: whether it is over (then it hands out no more)."""

    @property
    def ended(self) -> bool:
        """Whether the link is over for good."""
        ...


LinkT = TypeVar("LinkT", bound=SharedLink)


class Private:
    """Marks a server that does not share: each session opens its own."""

    def __repr__(self) -> str:
        return "PRIVATE"


PRIVATE = Private()
"""What `join`'s ``connect`` returns for a server that does not offer links."""


class _Connecting:
    """A shared link being opened: the sessions that want it meanwhile wait for the outcome."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.error: BaseException | None = None


_LINKS: anyio.lowlevel.RunVar[dict[Hashable, object]] = anyio.lowlevel.RunVar("openenv_shared_links")


def _links() -> dict[Hashable, object]:
    links = _LINKS.get(None)
    if links is None:
        links = {}
        _LINKS.set(links)
    return links


async def join(key: Hashable, connect: Callable[[], Awaitable[LinkT | Private]]) -> LinkT | None:
    """The shared link for ``key``, opened with ``connect`` if this loop has none; ``None`` if it cannot be shared.

    Args:
        key: What makes two sessions' links interchangeable (the transport's
            name, the URL and every option).
        connect: Opens a link. It returns `PRIVATE` (having kept nothing open)
            when the server offers none; the caller then opens a connection of its own.

    Returns:
        A shared link, still open; or ``None``: open a connection of your own.

    Raises:
        Whatever ``connect`` raises (`openenv.ConnectError`, ...), to every session
        that waited for that attempt.
    """
    links = _links()
    while True:
        entry = links.get(key)
        if entry is PRIVATE:
            return None
        if isinstance(entry, _Connecting):
            await entry.done.wait()
            if isinstance(entry.error, OpenEnvError):
                raise _again(entry.error)
            continue  # opened, or the attempt was cancelled: look again (and try ourselves)
        if entry is not None:
            link: LinkT = entry  # type: ignore[assignment]  # only links are stored besides the two markers
            if not link.ended:
                return link
            del links[key]
            continue
        connecting = links[key] = _Connecting()
        try:
            outcome = await connect()
        except BaseException as exc:
            connecting.error = exc
            if links.get(key) is connecting:
                del links[key]
            raise
        finally:
            connecting.done.set()
        if isinstance(outcome, Private):
            links[key] = PRIVATE
            return None
        links[key] = outcome
        return outcome


def forget(key: Hashable, link: object) -> None:
    """Stop handing ``link`` out (it ended, or its last session left)."""
    links = _LINKS.get(None)
    if links is not None and links.get(key) is link:
        del links[key]


def _again(error: OpenEnvError) -> OpenEnvError:
    """The error another session's attempt raised, raised anew for this one."""
    fresh = type(error)(str(error))
    fresh.__cause__ = error.__cause__ or error
    return fresh

"""From a URL's scheme to the transport that serves it.

Transports join the ``openenv.transports`` entry-point group: the entry point's
name is the URL scheme and its object is a factory called as
``factory(url, **options)`` that returns a `Transport` (usually the transport
class itself). The built-in transports are registered this way too, in
openenv's own ``pyproject.toml``; a third party does the same in theirs::

    [project.entry-points."openenv.transports"]
    grpc = "my_package.transport:GRPCTransport"

`register_transport` adds one at run time (tests, applications).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from ._exceptions import UnsupportedSchemeError
from ._transport import Transport

__all__ = [
    "ENTRY_POINT_GROUP",
    "TransportFactory",
    "create_transport",
    "register_transport",
    "registered_schemes",
    "url_scheme",
]

ENTRY_POINT_GROUP = "openenv.transports"

TransportFactory = Callable[..., Transport]

_lock = threading.Lock()
_registered: dict[str, TransportFactory] = {}
_entry_points: dict[str, Any] | None = None


def _discovered() -> dict[str, Any]:
    global _entry_points
    with _lock:
        if _entry_points is None:
            _entry_points = {ep.name.lower(): ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
        return _entry_points


def register_transport(scheme: str, factory: TransportFactory) -> None:
    """Register (or replace) the transport for a URL scheme, for this process.

    Args:
        scheme: The URL scheme, without ``://`` (``"ws"``, ``"http+poll"``).
        factory: Called as ``factory(url, **options)``; returns a `Transport`.
    """
    with _lock:
        _registered[scheme.lower()] = factory


def registered_schemes() -> list[str]:
    """Return every scheme that has a transport, sorted."""
    return sorted(set(_discovered()) | set(_registered))


def url_scheme(url: str) -> str:
    """Return the lower-cased scheme of ``url``.

    Raises:
        UnsupportedSchemeError: The URL has no ``scheme://`` prefix.
    """
    scheme, separator, _ = url.partition("://")
    if not separator or not scheme:
        raise UnsupportedSchemeError(
            f"{url!r} is not a URL with a scheme; registered schemes: {', '.join(registered_schemes())}"
        )
    return scheme.lower()


def _factory_for(scheme: str) -> TransportFactory:
    with _lock:
        factory = _registered.get(scheme)
    if factory is not None:
        return factory
    entry_point = _discovered().get(scheme)
    if entry_point is None:
        raise UnsupportedSchemeError(
            f"no transport for the URL scheme {scheme!r}; registered schemes: {', '.join(registered_schemes())}"
        )
    loaded: TransportFactory = entry_point.load()
    with _lock:
        _registered.setdefault(scheme, loaded)
    return loaded


def create_transport(url: str, **options: Any) -> Transport:
    """Build the transport for ``url``, chosen by its scheme.

    Args:
        url: The server's URL (``ws://host:8000``, ``inproc://package.module:Factory``, ...).
        **options: Passed on to the transport's factory.

    Returns:
        An unconnected transport; enter it to connect.

    Raises:
        UnsupportedSchemeError: No transport is registered for the scheme; the
            message names the ones that are.
    """
    return _factory_for(url_scheme(url))(url, **options)

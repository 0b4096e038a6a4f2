"""From a URL's scheme to the transport that serves it.

Transports join the ``openenv.transports`` entry-point group: the entry point's
name is the URL scheme and its object is a factory called as
``factory(url, **options)`` that returns a `Transport` (usually the transport
class itself). The built-in transports are registered this way too, in
openenv's own ``pyproject.toml``; a third party does the same in theirs:

```toml
[project.entry-points."openenv.transports"]
grpc = "my_package.transport:GRPCTransport"
```

`register_transport` adds one at run time (tests, applications).

A factory's keyword parameters are its options, and their annotations their
types: `check_transport_options` makes them the fields of a msgspec Struct and
checks the options a client is given with ``msgspec.convert``, when the client
is built rather than when it connects.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Collection, Mapping
from importlib.metadata import entry_points
from typing import Any, NamedTuple

import msgspec

from ._config import check_options
from ._exceptions import UnsupportedSchemeError
from ._transport import Transport

__all__ = [
    "ENTRY_POINT_GROUP",
    "TransportFactory",
    "check_transport_options",
    "create_transport",
    "register_transport",
    "registered_schemes",
    "takes_option",
    "url_scheme",
]

ENTRY_POINT_GROUP = "openenv.transports"
"""The entry-point group transports join: the name is the URL scheme, the object its factory."""

TransportFactory = Callable[..., Transport]
"""What builds a transport: called as ``factory(url, **options)``, returns an unconnected `Transport`."""

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

    A registration wins over an entry point of the same scheme, so it can also
    replace a built-in transport. Schemes are case-insensitive.

    Args:
        scheme: The URL scheme, without ``://`` (``"ws"``, ``"http+poll"``).
        factory: Called as ``factory(url, **options)`` with the client's URL and
            its transport options; returns an unconnected `Transport` (usually
            the transport class itself).

    Examples:
        A scheme that serves the echo environment in-process, whatever the URL:

        ```python
        import openenv
        from openenv.examples.echo import EchoEnv, EchoEnvironment


        def local_echo(url: str, **options: object) -> openenv.Transport:
            return openenv.create_transport("inproc://", factory=EchoEnvironment)


        openenv.register_transport("echo", local_echo)
        async with EchoEnv("echo://anything") as env:
            await env.reset()
        print("echo" in openenv.registered_schemes())  # True
        ```
    """
    with _lock:
        _registered[scheme.lower()] = factory


def registered_schemes() -> list[str]:
    """List every URL scheme that has a transport: the entry points' and the registered ones.

    Returns:
        The schemes, lower-case and sorted (``["http", "http+poll", ..., "ws", "wss"]``).
    """
    return sorted(set(_discovered()) | set(_registered))


def url_scheme(url: str) -> str:
    """Return the lower-cased scheme of ``url``.

    Args:
        url: A URL (``"WS://host:8000"``).

    Returns:
        Its scheme, lower-cased (``"ws"``).

    Raises:
        UnsupportedSchemeError: The URL has no ``scheme://`` prefix.
    """
    scheme, separator, _ = url.partition("://")
    if not separator or not scheme:
        hint = f"write ws://{url} (WebSocket) or http+poll://{url} (HTTP long-polling); " if url else ""
        raise UnsupportedSchemeError(
            f"{url!r} is not a URL with a scheme: {hint}registered schemes: {', '.join(registered_schemes())}"
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

    `EnvClient` calls it when it connects; call it to hold the transport
    yourself, or to check a URL's options early.

    Args:
        url: The server's URL (``ws://host:8000``, ``inproc://package.module:Factory``, ...).
        **options: Passed on to the transport's factory (``connect_timeout``,
            ``headers``, ...: see each transport).

    Returns:
        An unconnected transport; enter it to connect, or hand it to
        ``EnvClient(transport=...)``.

    Raises:
        UnsupportedSchemeError: No transport is registered for the scheme (or
            the URL has none); the message names the ones that are.
        ValueError: The transport rejected the URL or an option.
        TypeError: The transport does not take an option given, or it is not
            of the type the transport declares.

    Examples:
        ```python
        import openenv

        transport = openenv.create_transport("ws://127.0.0.1:8000", connect_timeout=5.0)
        print(type(transport).__name__, transport.url)  # WebSocketTransport ws://127.0.0.1:8000/ws
        ```
    """
    check_transport_options(url, options)
    return _factory_for(url_scheme(url))(url, **options)


# OpenEnv's client options, and what openenv calls them.
_OPENENV_OPTION_NAMES = {
    "message_timeout_s": "timeout",
    "connect_timeout_s": "connect_timeout",
    "max_message_size_mb": "max_message_size (in bytes)",
}


class _Options(NamedTuple):
    """What a factory's signature says of its keyword options."""

    names: frozenset[str] | None
    """The options it takes, or ``None`` if it takes any (``**options``)."""
    checked: type[msgspec.Struct]
    """Its options as a Struct (every field optional), whose types msgspec checks values against."""


@functools.cache
def _options_of(factory: TransportFactory) -> _Options | None:
    """The keyword options a transport factory takes after the URL, as a Struct; ``None`` if unreadable."""
    try:
        signature = inspect.signature(factory, eval_str=True)
    except (NameError, TypeError, ValueError, SyntaxError):  # a name only a type checker sees, or no signature
        try:
            signature = inspect.signature(factory)
        except (TypeError, ValueError):  # no signature to read: let the factory judge at connect
            return None
    parameters = list(signature.parameters.values())[1:]
    keywords = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes_any = any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters)
    named = [parameter for parameter in parameters if parameter.kind in keywords]
    fields = [(parameter.name, _checkable(parameter.annotation), None) for parameter in named]
    return _Options(
        None if takes_any else frozenset(parameter.name for parameter in named),
        msgspec.defstruct(f"{getattr(factory, '__name__', 'Transport')}Options", fields, kw_only=True),
    )


def _checkable(annotation: Any) -> Any:
    """The declared type, for msgspec to check; `Any` for none, a name it cannot resolve, or a type it cannot check."""
    if annotation is inspect.Parameter.empty or isinstance(annotation, str):
        return Any
    try:
        msgspec.inspect.type_info(annotation)
    except TypeError:  # say, a union of two classes of another library: the factory judges those
        return Any
    return annotation


def takes_option(url: str, name: str) -> bool:
    """Whether the transport of ``url``'s scheme takes the keyword option ``name`` (``False`` if unknown)."""
    try:
        declared = _options_of(_factory_for(url_scheme(url)))
    except UnsupportedSchemeError:
        return False
    return declared is not None and declared.names is not None and name in declared.names


def check_transport_options(url: str, options: Mapping[str, Any], *, also: Collection[str] = ()) -> None:
    """Refuse now, not at connect, an option the URL's transport does not take, or one of the wrong type.

    The transport factory's signature is the declaration: its keyword
    parameters are the options, their annotations the types. They become the
    fields of a msgspec Struct, and ``msgspec.convert`` checks the values given
    (a type msgspec cannot check, or no annotation, lets any value through, for
    the factory to judge).

    Args:
        url: The server's URL; its scheme picks the transport.
        options: The options given for the transport, by name.
        also: Other valid names, listed in the message (a client's own options).

    Raises:
        TypeError: An option the transport does not take (the message names
            the options it does take, and openenv's name for an OpenEnv
            option), or a value not of the option's declared type. An unknown
            scheme is left for `create_transport` to report.
        ValueError: A value not one of the choices its type declares (a
            ``Literal``), or outside its bounds.
    """
    if not options:
        return
    try:
        scheme = url_scheme(url)
        factory = _factory_for(scheme)
    except UnsupportedSchemeError:
        return
    declared = _options_of(factory)
    if declared is None:
        return
    accepted = declared.names
    unknown = sorted(set(options) - accepted) if accepted is not None else []
    if unknown:
        renamed = [
            f"{name}= is {_OPENENV_OPTION_NAMES[name]}= here" for name in unknown if name in _OPENENV_OPTION_NAMES
        ]
        valid = ", ".join(sorted({*(accepted or ()), *also}))
        raise TypeError(
            f"unknown option {', '.join(name + '=' for name in unknown)} for {scheme}:// URLs"
            + (f" (OpenEnv's {'; '.join(renamed)})" if renamed else "")
            + f"; the options are: {valid}"
        )
    check_options(declared.checked, options, of=f"{scheme}:// URLs")

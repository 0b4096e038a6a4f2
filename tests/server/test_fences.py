"""Fences: every attribute openenv reads or replaces past another library's public API, named.

openenv's speed paths (and two fixes) reach into uvicorn, websockets, hypercorn
and asyncio: they subclass internal classes and read their attributes. Each
such dependency is capped in ``pyproject.toml``; when the cap is raised, this
test says which attribute an upgrade took away and which of our modules
needs it, before anything fails at run time. Meanwhile ``OPENENV_PUBLIC_IO=1``
serves and connects with the stock public classes (``docs/reliability.md``).

An instance attribute counts as present when a method of the class (or of a
base class) assigns it; a class's members, when the class or a base defines
them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Fence:
    """What one of our modules uses of another library's internals."""

    user: str
    """Our module that reaches in, and what for."""
    target: str
    """``package.module:Class`` (its members) or ``package.module`` (its attributes)."""
    names: tuple[str, ...]
    distribution: str
    """The distribution that ships ``target`` (``python`` for the standard library)."""


_WEBSOCKETS_PROTOCOL_STATE = (
    "state",
    "current_size",
    "reader",
    "extensions",
    "max_message_size",
    "max_fragment_size",
    "expect_continuation_frame",
)

FENCES = (
    # -- uvicorn's protocols as openenv serve runs them (transports/server/drivers/_uvicorn_protocols.py)
    Fence(
        "transports/server/drivers/_uvicorn_protocols.py: "
        "the WebSocket protocol (quick frames, no pause per message, socket loan)",
        "uvicorn.protocols.websockets.websockets_sansio_impl:WebSocketsSansIOProtocol",
        (
            "connection_made",
            "handle_connect",
            "data_received",
            "connection_lost",
            "shutdown",
            "pause_writing",
            "resume_writing",
            "send_receive_event_to_app",
            "send",
            "start_keepalive",
            "stop_keepalive",
            "scope",
            "conn",
            "transport",
            "loop",
            "scheme",
            "handshake_complete",
            "close_sent",
            "disconnected",
            "read_paused",
            "pending_ping_payload",
            "queue",
            "ping_interval",
            "writable",
            "initial_response",
            "curr_msg_data_type",
            "frames",
            "handle_parser_exception",
        ),
        "uvicorn",
    ),
    Fence(
        "transports/server/drivers/_uvicorn_protocols.py: the WebSocket protocol reads its sans-I/O protocol's state",
        "websockets.server:ServerProtocol",
        _WEBSOCKETS_PROTOCOL_STATE,
        "websockets",
    ),
    Fence(
        "transports/server/drivers/_uvicorn_protocols.py: nothing buffered",
        "websockets.streams:StreamReader",
        ("buffer",),
        "websockets",
    ),
    Fence(
        "transports/server/drivers/_uvicorn_protocols.py: the HTTP protocol's header timeout",
        "uvicorn.protocols.http.h11_impl:H11Protocol",
        ("connection_made", "data_received", "connection_lost", "cycle", "loop", "transport"),
        "uvicorn",
    ),
    Fence(
        "transports/server/drivers/_uvicorn_protocols.py: the HTTP protocol's header timeout (a request's end)",
        "uvicorn.protocols.http.h11_impl:RequestResponseCycle",
        ("response_complete",),
        "uvicorn",
    ),
    Fence(
        "transports/server/drivers/_uvicorn_protocols.py: "
        "reads of at most 64 KiB (asyncio's default maps memory per read)",
        "asyncio.selector_events:_SelectorSocketTransport",
        ("max_size",),
        "python",
    ),
    # -- uvicorn embedded (transports/server/drivers/_uvicorn.py)
    Fence(
        "transports/server/drivers/_uvicorn.py: uvicorn in a program (no signal handlers, readiness, stop)",
        "uvicorn.server:Server",
        ("capture_signals", "startup", "started", "should_exit", "serve"),
        "uvicorn",
    ),
    # -- hypercorn run on our socket (transports/server/drivers/_hypercorn.py)
    Fence(
        "transports/server/drivers/_hypercorn.py: hypercorn on a socket bound by openenv",
        "hypercorn.config",
        ("Config", "Sockets"),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn.py: the app as hypercorn wraps it",
        "hypercorn.utils",
        ("wrap_app",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn.py: hypercorn on trio",
        "hypercorn.trio.run",
        ("worker_serve",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn.py: hypercorn on asyncio",
        "hypercorn.asyncio.run",
        ("worker_serve",),
        "hypercorn",
    ),
    # -- what openenv changes in hypercorn on trio (transports/server/drivers/_hypercorn_patches.py)
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: "
        "the class hypercorn's trio worker builds per connection, replaced",
        "hypercorn.trio.run",
        ("TCPServer",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: "
        "the closing fix, and the WebSocket front of hypercorn+websockets",
        "hypercorn.trio.tcp_server:TCPServer",
        ("run", "protocol_send", "protocol", "stream", "context", "config", "app", "state"),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: "
        "the closing fix catches trio's error where hypercorn meets it",
        "hypercorn.trio.tcp_server",
        ("trio",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: the closing fix", "hypercorn.events", ("Closed",), "hypercorn"
    ),
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: the front stops reading a head when the server stops",
        "hypercorn.trio.worker_context:WorkerContext",
        ("terminated",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: the front serves the app hypercorn wraps",
        "hypercorn.app_wrappers:ASGIWrapper",
        ("app",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_patches.py: the front's bounds",
        "hypercorn.config:Config",
        ("keep_alive_timeout", "websocket_max_message_size", "wsgi_max_body_size"),
        "hypercorn",
    ),
    # -- hypercorn's missing bounds (transports/server/drivers/_hypercorn_limits.py)
    Fence(
        "transports/server/drivers/_hypercorn_limits.py: no compression (the handshake negotiates no extension)",
        "hypercorn.protocol.ws_stream",
        ("Handshake",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_limits.py: no compression (the extensions a client offered, forgotten)",
        "hypercorn.protocol.ws_stream:Handshake",
        ("extensions", "accept"),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_limits.py: "
        "the connection cap, on asyncio (the class its worker builds, replaced)",
        "hypercorn.asyncio.run",
        ("TCPServer",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_limits.py: the connection cap, and writes to a reset connection dropped",
        "hypercorn.asyncio.tcp_server:TCPServer",
        ("run", "protocol_send", "protocol", "writer", "config"),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_limits.py: the connection cap, on trio",
        "hypercorn.trio.run",
        ("TCPServer",),
        "hypercorn",
    ),
    Fence(
        "transports/server/drivers/_hypercorn_limits.py: writes to a reset connection dropped",
        "hypercorn.events",
        ("Closed", "RawData"),
        "hypercorn",
    ),
)


def _resolve(target: str) -> Any:
    module_name, _, qualname = target.partition(":")
    found: Any = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        found = getattr(found, part)
    return found


def _assigned_to_self(cls: type) -> set[str]:
    """The attributes a class's methods assign on ``self`` (its instance attributes)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # built in, or no source: its dict is all there is
        return set()
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    names.add(leaf.attr)
    return names


def members(cls: type) -> set[str]:
    """Everything an instance of ``cls`` has: the class's and its bases' members, and what their methods assign."""
    names: set[str] = set()
    for klass in cls.__mro__:
        names.update(vars(klass))
        names.update(getattr(klass, "__annotations__", {}))
        names.update(_assigned_to_self(klass))
    return names


def _version(distribution: str) -> str:
    if distribution == "python":
        return sys.version.split()[0]
    return importlib.metadata.version(distribution)


def what_is_missing(fence: Fence) -> str | None:
    """Why ``fence`` no longer holds, in words that name the attribute, the library and our module; or ``None``."""
    version = f"{fence.distribution} {_version(fence.distribution)}"
    try:
        target = _resolve(fence.target)
    except (ImportError, AttributeError) as exc:
        return f"{version}: {fence.target} is gone ({exc}); {fence.user} needs it"
    present = members(target) if isinstance(target, type) else set(dir(target))
    missing = [name for name in fence.names if name not in present]
    if not missing:
        return None
    return (
        f"{version}: {fence.target} has no {', '.join(missing)}, which {fence.user} relies on. "
        f"Mend that module for {version}, or cap {fence.distribution} below {_version(fence.distribution)} "
        "in pyproject.toml; OPENENV_PUBLIC_IO=1 serves and connects without the speed paths meanwhile."
    )


@pytest.mark.parametrize("fence", FENCES, ids=lambda fence: fence.target)
def test_what_the_speed_paths_use_is_there(fence: Fence) -> None:
    message = what_is_missing(fence)
    if message is not None:
        pytest.fail(message, pytrace=False)


def test_every_fenced_dependency_is_capped() -> None:
    """A dependency whose internals we touch has an upper bound, so an upgrade cannot arrive unannounced."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for distribution in sorted({fence.distribution for fence in FENCES} - {"python"}):
        requirements = re.findall(rf'"{re.escape(distribution)}([<>=!~,.\d\s]*)"', pyproject, flags=re.IGNORECASE)
        assert requirements, f"{distribution} is not a dependency in pyproject.toml"
        for specifier in requirements:
            assert "<" in specifier, f"{distribution}{specifier} in pyproject.toml: cap it (its internals are fenced)"


def test_a_missing_attribute_is_named() -> None:
    """The check itself: an attribute that is not there is reported, with the library and the module that needs it."""

    class Base:
        def __init__(self) -> None:
            self.present = 1

    class Derived(Base):
        def method(self) -> None:
            self.other, self.pair = 2, 3

    assert {"present", "other", "pair", "method"} <= members(Derived)
    assert "absent" not in members(Derived)
    fence = Fence(
        "transports/x.py: its quick path", "websockets.protocol:Protocol", ("state", "gone_in_18"), "websockets"
    )
    message = what_is_missing(fence)
    assert message is not None
    assert message.startswith(f"websockets {importlib.metadata.version('websockets')}: websockets.protocol:Protocol")
    assert "has no gone_in_18, which transports/x.py: its quick path relies on" in message
    assert what_is_missing(Fence("transports/y.py", "no_such_module:Thing", ("a",), "python")) is not None

"""What OpenEnv's names are called here: the hints a user's mistake gets, kept in one place.

A user coming from OpenEnv (0.3 or 0.10) writes its client's option names;
`openenv_option_hint` turns those an error found unknown into one clause that
says what to write instead. The option checker calls it; nothing else does.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["OPENENV_OPTIONS", "openenv_option_hint"]

OPENENV_OPTIONS: dict[str, str] = {
    "message_timeout_s": "is timeout= here",
    "connect_timeout_s": "is connect_timeout= here",
    "max_message_size_mb": "is max_message_size= here (in bytes)",
    "websocket_ping_interval_s": "is ping_interval= here",
    "websocket_ping_timeout_s": "is ping_timeout= here",
    "provider": (
        "has no counterpart: a project:// URL starts a local environment project; "
        "else start the server and pass its URL"
    ),
}
"""OpenEnv's ``EnvClient`` options openenv names otherwise, and what to write instead."""


def openenv_option_hint(unknown: Iterable[str]) -> str | None:
    """The hint for options an error found unknown, if any is OpenEnv's.

    Args:
        unknown: The option names that were refused.

    Returns:
        ``"OpenEnv's message_timeout_s= is timeout= here; ..."``, or ``None``
        when none of them is OpenEnv's.
    """
    known = [f"{name}= {OPENENV_OPTIONS[name]}" for name in unknown if name in OPENENV_OPTIONS]
    return f"OpenEnv's {'; '.join(known)}" if known else None

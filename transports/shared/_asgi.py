"""The ASGI types the raw endpoints (``/ws``, ``/poll``) are written against."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
"""The ASGI connection scope."""
Message = MutableMapping[str, Any]
"""One ASGI event, received or sent."""
Receive = Callable[[], Any]
"""The ASGI ``receive`` callable: awaits the next event."""
Send = Callable[[Message], Any]
"""The ASGI ``send`` callable: sends one event."""

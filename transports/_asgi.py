"""The ASGI types the raw endpoints (``/ws``, ``/poll``) are written against."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

__all__ = ["Message", "Receive", "Scope", "Send"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Any]
Send = Callable[[Message], Any]

"""Whether the error replies being made now may say what failed on the server.

A server that hides error details (``error_details=False``) must keep every
exception's text off the wire: the ``EXECUTION_ERROR`` of a raising
environment (`openenv._session.ServerSession` words that itself), and a tool's
exception, which an `openenv.MCPEnvironment` turns into a tool call's error
before the session sees it. The session marks the calls it makes into such an
environment (`hiding_error_details`); `error_details_shown` tells the tool code.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Final

__all__ = ["HIDDEN_TOOL_ERROR", "error_details_shown", "hiding_error_details"]

HIDDEN_TOOL_ERROR: Final = "the tool raised an exception (details are in the server's log)"
"""A tool call's error message, instead of the exception's, when error details are hidden."""

_hidden: ContextVar[bool] = ContextVar("openenv_error_details_hidden", default=False)


def error_details_shown() -> bool:
    """Whether an error reply made now may name an exception and its message (outside a hiding server, it may)."""
    return not _hidden.get()


def hiding_error_details(call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Wrap a coroutine function so that, while it runs, error details count as hidden.

    Args:
        call: An environment's method, as the session runs it.

    Returns:
        A coroutine function taking the same arguments.
    """

    async def hiding(*args: Any, **kwargs: Any) -> Any:
        token = _hidden.set(True)
        try:
            return await call(*args, **kwargs)
        finally:
            _hidden.reset(token)

    return hiding

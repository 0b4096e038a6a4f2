"""The servers' logs: session ids kept out of their access logs, and openenv's messages on a console."""

from __future__ import annotations

import logging
import re
from typing import Any

__all__ = ["configure_console_logging", "redact_access_logs"]


# A session's or link's id in a logged path: the id, not its key, but ids stay out of logs anyway.
# HTTP long-polling sessions' and links' ids in their paths, MCP sessions' in /ws?session_id=…
_SESSION_IN_PATH = re.compile(r"(/poll/(?:sessions|links)/|[?&]session_id=)[^/\s?&\"]+")


class _RedactSessionIds(logging.Filter):
    """Replaces HTTP session and link ids in the servers' access-log lines with ``...``."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_redact(arg) for arg in args)
        elif isinstance(args, dict):  # hypercorn's atoms: updated in place, keeping its class
            for key, value in list(args.items()):
                args[key] = _redact(value)
        record.msg = _redact(record.msg)
        return True


def _redact(value: Any) -> Any:
    return _SESSION_IN_PATH.sub(r"\1...", value) if isinstance(value, str) else value


def redact_access_logs() -> None:
    """Keep session ids out of the access logs of both servers (idempotent)."""
    # uvicorn logs WebSocket connections (their query strings too) to uvicorn.error.
    for name in ("uvicorn.access", "uvicorn.error", "hypercorn.access"):
        access_logger = logging.getLogger(name)
        if not any(isinstance(existing, _RedactSessionIds) for existing in access_logger.filters):
            access_logger.addFilter(_RedactSessionIds())


def configure_console_logging(log_level: str) -> None:
    """Log openenv's server messages to stderr, for a command line (the servers log their own).

    Each server line is printed once, by its own handler: not again by the root
    logger's, which an environment may set up (``logging.basicConfig()`` on
    import). uvicorn's configuration does the same for its loggers.
    """
    openenv_logger = logging.getLogger("openenv")
    if all(isinstance(handler, logging.NullHandler) for handler in openenv_logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        openenv_logger.addHandler(handler)
        openenv_logger.propagate = False
    openenv_logger.setLevel("DEBUG" if log_level == "trace" else log_level.upper())

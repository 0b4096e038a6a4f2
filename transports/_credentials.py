"""The bearer token a client sends, shared by the network transports' clients."""

from __future__ import annotations

import os

from ._guard import AUTH_TOKEN_ENV

__all__ = ["with_auth_token"]


def with_auth_token(headers: list[tuple[str, str]], auth_token: str | None) -> list[tuple[str, str]]:
    """The headers a client sends, with ``Authorization: Bearer <token>`` added.

    Args:
        headers: The caller's own headers, as ``(name, value)`` pairs.
        auth_token: The token; ``None`` takes it from ``OPENENV_AUTH_TOKEN``, if
            set. An ``Authorization`` header in ``headers`` wins over the
            environment variable.

    Returns:
        A new list of pairs.

    Raises:
        ValueError: ``auth_token`` given together with an ``Authorization`` header.
    """
    has_authorization = any(name.lower() == "authorization" for name, _ in headers)
    if auth_token is not None and has_authorization:
        raise ValueError("give auth_token or an Authorization header, not both")
    if auth_token is None:
        if has_authorization:
            return list(headers)
        auth_token = os.environ.get(AUTH_TOKEN_ENV) or None
        if auth_token is None:
            return list(headers)
    return [*headers, ("Authorization", f"Bearer {auth_token}")]

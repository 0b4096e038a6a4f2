"""The bearer token both ends of a network transport know of: where it is found when not given."""

from typing import Final

__all__ = ["AUTH_TOKEN_ENV"]

AUTH_TOKEN_ENV: Final = "OPENENV_AUTH_TOKEN"
"""The environment variable a server takes its tokens from, and a client its token, when none is given."""

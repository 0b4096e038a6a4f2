"""Retired path: this module is `transports.server.app` now; importing it here warns."""

import warnings

from transports.server.app import *  # noqa: F403
from transports.server.app import __all__ as __all__

warnings.warn(
    "transports.app is deprecated: import transports.server.app",
    DeprecationWarning,
    stacklevel=2,
)

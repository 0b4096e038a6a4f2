"""Retired path: this module is `transports.server.runner` now; importing it here warns."""

import warnings

from transports.server.runner import *  # noqa: F403
from transports.server.runner import __all__ as __all__

warnings.warn(
    "transports.runner is deprecated: import transports.server.runner",
    DeprecationWarning,
    stacklevel=2,
)

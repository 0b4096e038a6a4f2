"""Retired path: this module is `transports.server.routes.openenv_http` now; importing it here warns."""

import warnings

from transports.server.routes.openenv_http import *  # noqa: F403
from transports.server.routes.openenv_http import __all__ as __all__

warnings.warn(
    "transports.openenv_http is deprecated: import transports.server.routes.openenv_http",
    DeprecationWarning,
    stacklevel=2,
)

"""Retired path: this module is `transports.server.routes.task_api` now; importing it here warns."""

import warnings

from transports.server.routes.task_api import *  # noqa: F403
from transports.server.routes.task_api import __all__ as __all__

warnings.warn(
    "transports.task_api is deprecated: import transports.server.routes.task_api",
    DeprecationWarning,
    stacklevel=2,
)

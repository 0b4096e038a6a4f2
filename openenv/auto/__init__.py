"""Upstream OpenEnv's ``openenv.auto``: an installed environment package's client and action class by name.

Needs the ``core`` extra. `AutoEnv.from_env("echo", base_url=...)` gives the package's own
client; `AutoAction.from_env("echo")` its action class. Packages are found as upstream finds
them: a distribution named ``openenv-<name>`` (``openenv install openenv-echo-env``).
"""

from openenv.auto.auto_action import AutoAction as AutoAction
from openenv.auto.auto_env import AutoEnv as AutoEnv

__all__ = ["AutoAction", "AutoEnv"]

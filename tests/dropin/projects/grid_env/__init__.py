"""A grid world written against upstream OpenEnv's API, as environment packages write one (a test fixture).

Its code is openenv's own; its imports and habits are those of upstream's ``envs/``: pydantic
types from ``openenv.core.env_server.types``, a ``reset`` without ``**kwargs`` and a ``step``
without ``timeout_s``, no ``super().__init__()``, ``create_app`` at module level. The same files
are served by upstream 0.10.0 in its own environment and by openenv, and their replies compared.
"""

from grid_env.models import GridAction, GridObservation, GridState

__all__ = ["GridAction", "GridObservation", "GridState"]

"""The Ray transport: ``ray://package.module:Factory``, environments hosted on a Ray cluster.

Install it with ``pip install 'openenv-anyio[ray]'``. `RayTransport` is the client side;
`EnvHost` is the actor that serves sessions; `Fleet` keeps the driver's count of
actors and their free slots.
"""

from transports.ray._fleet import ACTOR_NAME_PREFIX, Fleet, HostActor, init_ray
from transports.ray._host import EnvHost
from transports.ray._transport import RayTransport

__all__ = ["ACTOR_NAME_PREFIX", "EnvHost", "Fleet", "HostActor", "RayTransport", "init_ray"]

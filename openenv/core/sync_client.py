"""Upstream OpenEnv's ``openenv.core.sync_client``: `SyncEnvClient`, the blocking view `EnvClient.sync` gives."""

from openenv.core.env_client import SyncEnvClient

__all__ = ["SyncEnvClient"]

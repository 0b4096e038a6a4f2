"""Upstream OpenEnv's ``openenv.core.containers``: where an environment's server runs (`runtime`)."""

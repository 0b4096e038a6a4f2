"""Example environments shipped with openenv, with their typed clients."""

"""Tests of `openenv.core`: environment packages written for upstream OpenEnv, served unchanged by openenv."""

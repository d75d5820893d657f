"""Fixtures the blob tier tests share (tier_world.py)."""

from tests.cachestore.tier_world import made, world  # noqa: F401

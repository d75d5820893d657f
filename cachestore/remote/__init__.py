"""The blob tier stores share: the client and layout (tier.py), push, pull, and the
cluster-wide single flight on Ray (ray_flight.py, which imports Ray only when called)."""

"""What the tests and the benches share: the real test faces and their referee, speech,
assets built for renders, and real servers (hotplate serve, nginx, SeaweedFS) on loopback.

Not shipped in the wheel; imported by tests/ and bench/ alike, so that no bench imports a
test module."""

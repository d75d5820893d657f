"""Run by every Python process a quick test starts (a server, the CLI, a worker):
tests/conftest.py puts this folder on PYTHONPATH under `-m quick`, so those processes go
without the extras and the Debian tools as the tests' own process does
(tests/quick_tier.py); otherwise a child would see, say, torch, and key its work
differently from its parent."""

from tests.quick_tier import go_without

go_without()

"""What a test or a bench needs from the machine, said once, for either to act on.

`require(ok, reason)` raises `Missing(reason)` unless ok; the reason says what is missing
and how to get it, in one line. testkit imports no pytest (a bench is a plain script):
the tests' one hook (tests/conftest.py) turns `Missing` into a skip on a developer's
machine and a failure when `CI` is set (in CI a skip would hide exactly the failure the
test is there for); bench/harness.py turns it into one line and exit status 2.
"""

from __future__ import annotations


class Missing(Exception):
    """A precondition is not met: the message is what is missing and how to get it."""


def require(ok: object, reason: str) -> None:
    """Raise Missing(reason) unless ok."""
    if not ok:
        raise Missing(reason)

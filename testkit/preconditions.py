"""What a reliability, parity or browser test needs from the machine.

`require(ok, reason)` skips the test on a developer's machine that lacks it, and fails
it when `CI` is set: in CI a skip would hide exactly the failure the test is there for.
"""

from __future__ import annotations

import os

import pytest


def require(ok: object, reason: str) -> None:
    """Skip (fail under CI) unless ok; reason says what is missing and how to get it."""
    if ok:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI must provide it (see `just setup`)")
    pytest.skip(reason)

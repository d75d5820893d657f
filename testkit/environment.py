"""This process's environment changed for a while, then put back as it was: for fixtures
whose settings every process they start must inherit (a server's credentials, Ray's
loopback addresses)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping


@contextlib.contextmanager
def environ_set(values: Mapping[str, str]) -> Iterator[None]:
    """`values` in os.environ while the block runs; each variable afterwards as it was
    before (removed where it was not set)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

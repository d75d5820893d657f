"""Store errors: each message says what is wrong, where, and what to do."""

from __future__ import annotations


class StoreError(RuntimeError):
    """Base class for every error the store raises."""


class StoreNotWritableError(StoreError):
    """The cache directory cannot be written."""


class StoreDamagedError(StoreError):
    """A file is where the store should be but is not a readable hotplate store."""


class StoreBusyError(StoreError):
    """Another process holds the store where an exclusive hold is needed (compact)."""


class MissingStageError(StoreError):
    """An avatar manifest would name a stage manifest that is not in the store."""


class StoreFullError(StoreError):
    """The disk under the cache directory has no room for a write (ENOSPC)."""


class StoreForkedError(StoreError):
    """A forked child asked for a store its parent has open (LMDB forbids it after fork)."""

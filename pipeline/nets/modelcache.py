"""Models loaded once per process: a worker or a `precompile a b c` reuses them.

Kept under (kind, name, models dir, backend identity), so replaced weights (a new
digest) load afresh while unchanged ones are never reloaded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from pipeline.nets.backends import backend_identity, require_backend

T = TypeVar("T")
_KEPT: dict[tuple[str, str, str, str], Any] = {}
_LOCK = threading.Lock()


def kept(kind: str, name: str, models_dir: Path | None, load: Callable[[], T]) -> T:
    """The model `load()` returns, loaded at most once per identity in this process.

    Errors from require_backend (a missing extra: the command that adds it), from
    backend_identity (missing weights) and from load propagate unchanged.
    """
    require_backend(kind, name)
    key = (kind, name, str(models_dir), backend_identity(kind, name, models_dir))
    with _LOCK:
        if key not in _KEPT:
            _KEPT[key] = load()
        return _KEPT[key]

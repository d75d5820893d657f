"""Atomic file replacement: the one way hotplate writes a file others may be reading.

The temporary file is created in the target's own directory (so `os.replace` is a
rename on one filesystem, atomic) under a name no other writer can take (mkstemp), so
two threads or processes replacing the same file never rename each other's temp.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def temp_beside(path: str | os.PathLike, suffix: str = ".tmp") -> Path:
    """A new, empty, uniquely named file next to `path`; the caller replaces or removes it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-", suffix=suffix)
    os.close(fd)
    return Path(tmp)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data`: a reader sees the old content or the new, never half."""
    tmp = temp_beside(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())

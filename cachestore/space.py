"""Disk space under the cache directory: what a full disk is reported as.

A write that meets ENOSPC (or EDQUOT) becomes one StoreFullError naming the cache
directory, the space the write needed and the space free, so the user knows how much
to free. The store itself is left as it was before the write (LMDB commits nothing
of a transaction that failed).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from cachestore.errors import StoreFullError

FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: str | os.PathLike) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding path."""
    path = Path(path)
    while not path.exists():
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str | int) -> int:
    """Bytes from a size such as 1048576, 64M, 8G or 20GiB (binary units); raises
    ValueError naming the text."""
    if isinstance(text, int):
        return text
    t = str(text).strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1] if t and t[-1] in UNITS else ""
    try:
        size = int(float(t[: len(t) - len(unit)]) * UNITS[unit])
    except ValueError:
        raise ValueError(f"{text!r} is not a size; use e.g. 64M, 500M or 8G") from None
    if size <= 0:
        raise ValueError(f"{text!r} is not a size above zero; use e.g. 64M, 500M or 8G")
    return size


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def full_error(where: str | os.PathLike, needed: int) -> StoreFullError:
    free = free_bytes(where)
    return StoreFullError(
        f"no space left for the cache in {where}: this write needs about {human(needed)}, "
        f"{human(free)} is free; free space there (or `hotplate gc --max-size`) or point "
        f"--cache at a bigger disk"
    )


def is_full(exc: BaseException) -> bool:
    """True for an OSError (or LMDB error) that says the disk or quota is full."""
    if isinstance(exc, OSError) and exc.errno in FULL:
        return True
    text = str(exc)
    return any(os.strerror(code) in text for code in FULL)


def raise_if_full(exc: BaseException, where: str | os.PathLike, needed: int) -> None:
    """Raise StoreFullError from exc when exc is a full disk; otherwise return."""
    if is_full(exc):
        raise full_error(where, needed) from exc

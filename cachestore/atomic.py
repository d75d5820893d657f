"""Atomic file replacement: the one way hotplate writes a file others may be reading.

The temporary file is created in the target's own directory (so `os.replace` is a
rename on one filesystem, atomic) under a name no other writer can take (mkstemp), so
two threads or processes replacing the same file never rename each other's temp.
mkstemp makes it 0600 whatever the umask; it is given the mode an ordinary new file
would have (0644 under umask 022), so a web server or another user can read a render.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def temp_beside(path: str | os.PathLike, suffix: str = ".tmp") -> Path:
    """A new, empty, uniquely named file next to `path`; the caller replaces or removes it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-", suffix=suffix)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
    finally:
        os.close(fd)
    return Path(tmp)


def current_umask() -> int:
    """The process's umask, read without changing it (os.umask sets it, racing other
    threads that create files meanwhile); Linux reports it in /proc/self/status."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no /proc: the only other way, briefly setting it
    os.umask(mask)
    return mask


def temps_of(path: str | os.PathLike) -> list[Path]:
    """The temps `temp_beside` made for path that are still there (a writer killed, or
    still writing)."""
    path = Path(path)
    return sorted(path.parent.glob(f".{path.name}.tmp-*"))


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

"""Atomic file replacement: the one way hotplate writes a file others may be reading.

The temporary file is created in the target's own directory (so `os.replace` is a
rename on one filesystem, atomic) under a name no other writer can take (mkstemp), so
two threads or processes replacing the same file never rename each other's temp.
mkstemp makes it 0600 whatever the umask; it is given the mode an ordinary new file
would have (0644 under umask 022), so a web server or another user can read a render.
"""

from __future__ import annotations

import fcntl
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


def create_locked(folder: str | os.PathLike, name: str, data: bytes = b"") -> int:
    """`folder/name`, holding `data`, under an exclusive flock from before it is visible;
    returns the locked fd (the lock lives until it is closed, or the process dies).

    For files whose lock says their holder is alive (leases, snapshots): a cleaner that
    finds one unlocked takes its holder for dead and unlinks it, so no moment may exist
    where the file has its name and no lock. An unnamed O_TMPFILE is locked, written, then
    linked in; where the filesystem has no O_TMPFILE, a dot-name temp is renamed, and
    cleaners leave dot-names alone."""
    folder = Path(folder)
    try:
        fd = os.open(folder, os.O_TMPFILE | os.O_RDWR, 0o644)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, data)
        # linkat(AT_SYMLINK_FOLLOW) names the open file; a dir fd makes os.link use it
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dir_fd, follow_symlinks=True)
        finally:
            os.close(dir_fd)
        return fd
    tmp = folder / f".{name}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, data)
    os.rename(tmp, folder / name)
    return fd


def held(path: str | os.PathLike) -> bool:
    """True when some process holds `path`'s flock now; False when nobody does (its holder
    is gone) or the file is gone. Every holder here locks exclusively, so a shared probe
    for an instant sees them all and never blocks another probe."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)

"""Content digests and recipe fingerprints.

- a source digest is xxh3-128 of a file's bytes, streamed in 8 MiB reads;
- a stage key is H(stage name, version, canonical params, model identity, upstream key);
- an avatar key is H(source digest, the recipe's stage keys).

Canonical means: JSON with sorted keys and no whitespace, so the same parameters
always give the same key whatever order a caller built them in.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

CHUNK = 8 * 1024 * 1024


def canonical(value: Any) -> bytes:
    """Deterministic bytes for JSON-able data; Paths and tuples become strings and lists."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


def digest_bytes(data: bytes | memoryview) -> str:
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True)
class FileStat:
    """The stat fields that decide whether a cached digest is still trusted."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStat:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class FileChangedError(RuntimeError):
    """The file changed while it was being hashed; its digest is not trustworthy."""


def hash_file(
    path: str | os.PathLike, on_bytes: Callable[[int], None] | None = None
) -> tuple[str, FileStat]:
    """xxh3-128 of a file, streamed, plus the stat it was taken under.

    Raises FileChangedError when the file's stat differs before and after the read
    (a copy still in progress, an editor saving), and OSError when it cannot be read.
    """
    hasher = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as handle:
        before = FileStat.of(os.fstat(handle.fileno()))
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := handle.readinto(buf):
            hasher.update(view[:n])
            if on_bytes:
                on_bytes(n)
        after = FileStat.of(os.stat(path))
    if after != before:
        raise FileChangedError(
            f"{path} changed while it was being hashed; try again once it settles"
        )
    return hasher.hexdigest(), before


def copy_and_hash(
    path: str | os.PathLike, dest: str | os.PathLike, on_bytes: Callable[[int], None] | None = None
) -> tuple[str, FileStat]:
    """Copy a file to dest and return the xxh3-128 of the bytes copied, in one read.

    The digest names exactly the bytes now in dest, whatever happens to the original
    afterwards. Raises FileChangedError when the original's stat differs before and
    after (dest may then be a mix of two versions), and OSError (ENOSPC included).
    """
    hasher = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as src, open(dest, "wb", buffering=0) as out:
        before = FileStat.of(os.fstat(src.fileno()))
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := src.readinto(buf):
            hasher.update(view[:n])
            written = 0
            while written < n:
                written += out.write(view[written:n])
            if on_bytes:
                on_bytes(n)
        after = FileStat.of(os.stat(path))
    if after != before:
        raise FileChangedError(f"{path} changed while it was being read; try again once it settles")
    return hasher.hexdigest(), before


def stage_key(
    name: str, version: int, params: Mapping[str, Any], model: str = "", upstream: str = ""
) -> str:
    """Fingerprint of one precompile stage's output."""
    return digest_bytes(
        canonical({"stage": name, "v": version, "params": params, "model": model, "up": upstream})
    )


def avatar_key(source_digest: str, stage_keys: Sequence[str]) -> str:
    """Fingerprint of a whole avatar: its source bytes and every stage of its recipe."""
    return digest_bytes(canonical({"source": source_digest, "stages": list(stage_keys)}))

"""Finding model weights on disk, and naming them by content.

Nothing here downloads: weights are looked up in the user's models directory, then in
torch hub's checkpoint cache (where face_alignment and friends leave them). A model's
identity is a digest of its bytes, so a renamed file keeps its cache and a replaced one
does not.
"""

from __future__ import annotations

import threading
from pathlib import Path

HUB_CHECKPOINTS = Path("~/.cache/torch/hub/checkpoints")
_READ = 8 << 20  # 8 MiB reads: disk-bound, not hash-bound

_identity_cache: dict[tuple[str, int, int], str] = {}
_identity_lock = threading.Lock()


class ModelMissingError(FileNotFoundError):
    """Weights that are not on disk; the message names every path tried and the fix."""


def search_dirs(models_dir: Path | None) -> list[Path]:
    """Where weights are looked for, in order."""
    dirs = [Path(models_dir).expanduser()] if models_dir is not None else []
    return [*dirs, HUB_CHECKPOINTS.expanduser()]


def find_weights(models_dir: Path | None, candidates: list[str], what: str) -> Path:
    """The first existing file among `candidates` (names or relative paths) in the search dirs.

    Raises ModelMissingError naming every path tried.
    """
    tried: list[Path] = []
    for directory in search_dirs(models_dir):
        for name in candidates:
            path = directory / name
            if path.is_file():
                return path
            tried.append(path)
    raise ModelMissingError(
        f"{what} weights not found; tried {', '.join(str(p) for p in tried)}; "
        "put the file there or run `hotplate doctor`"
    )


def file_identity(path: str | Path) -> str:
    """xxh3-128 hex digest of the file's bytes, cached by (path, size, mtime_ns)."""
    import xxhash

    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _identity_lock:
        if key in _identity_cache:
            return _identity_cache[key]
    digest = xxhash.xxh3_128()
    with path.open("rb") as f:
        while chunk := f.read(_READ):
            digest.update(chunk)
    value = digest.hexdigest()
    with _identity_lock:
        _identity_cache[key] = value
    return value

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
VAE_CONFIG = "config.json"
VAE_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")

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


def vae_files(models_dir: Path | str | None, name: str) -> tuple[Path, Path]:
    """(config, weights) of the VAE directory `models_dir/name`, checked, never loaded.

    Raises ModelMissingError when the directory or its files are missing, ValueError
    for a name that is not a plain directory name.
    """
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(f"vae={name!r} must be the name of a directory under the models dir")
    if models_dir is None:
        raise ModelMissingError(
            f"VAE {name!r} needs a models dir holding {name}/{VAE_CONFIG} and "
            f"{name}/{VAE_WEIGHTS[0]}; set one and run `hotplate doctor`"
        )
    directory = Path(models_dir).expanduser() / name
    config = directory / VAE_CONFIG
    weights = next((directory / w for w in VAE_WEIGHTS if (directory / w).is_file()), None)
    if not config.is_file() or weights is None:
        raise ModelMissingError(
            f"VAE {name!r}: {directory} must hold {VAE_CONFIG} and {VAE_WEIGHTS[0]} "
            f"(or {VAE_WEIGHTS[1]}); copy the VAE there (e.g. stabilityai/sd-vae-ft-mse) "
            "and run `hotplate doctor`"
        )
    return config, weights

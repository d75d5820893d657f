"""Finding model weights on disk, and naming them by content.

Nothing here downloads: weights are looked up in the user's models directory, then in
torch hub's checkpoint cache (where face_alignment and friends leave them). A model's
identity is a digest of its bytes, so a renamed file keeps its cache and a replaced one
does not.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

HUB_CHECKPOINTS = Path("~/.cache/torch/hub/checkpoints")
_READ = 8 << 20  # 8 MiB reads: disk-bound, not hash-bound
VAE_CONFIG = "config.json"
VAE_WEIGHTS = ("diffusion_pytorch_model.safetensors", "diffusion_pytorch_model.bin")

_identity_cache: dict[tuple[str, int, int], str] = {}
_identity_lock = threading.Lock()


class ModelMissingError(FileNotFoundError):
    """Weights that are not on disk; the message names every path tried and the fix.
    `missing` is the message without its fix (what `hotplate doctor` lists)."""

    def __init__(self, message: str, missing: str = "") -> None:
        super().__init__(message)
        self.missing = missing or message


def hub_dirs() -> list[Path]:
    """torch hub's checkpoint caches: $TORCH_HOME's (where torch puts downloads when it is
    set, as upstream MuseTalk's S3FD does), then the default one."""
    dirs = [HUB_CHECKPOINTS.expanduser()]
    if os.environ.get("TORCH_HOME"):
        dirs.insert(0, Path(os.environ["TORCH_HOME"]).expanduser() / "hub" / "checkpoints")
    return dirs


def search_dirs(models_dir: Path | None) -> list[Path]:
    """Where weights are looked for, in order."""
    dirs = [Path(models_dir).expanduser()] if models_dir is not None else []
    return [*dirs, *hub_dirs()]


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
        missing = (
            f"VAE {name!r}: {directory} must hold {VAE_CONFIG} and {VAE_WEIGHTS[0]} "
            f"(or {VAE_WEIGHTS[1]})"
        )
        raise ModelMissingError(
            f"{missing}; copy the VAE there (e.g. stabilityai/sd-vae-ft-mse) "
            "and run `hotplate doctor`",
            missing,
        )
    return config, weights


# MuseTalk's files, in upstream's `models/` layout (download_weights.sh) and hotplate's own.
# UNet: (version, config, weights alternatives, layout); the first complete row wins, so
# a folder holding both upstream versions renders with v1.5, upstream's default.
UNET_LAYOUTS: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("v1.5", "musetalkV15/musetalk.json", ("musetalkV15/unet.pth",), "state_dict"),
    ("v1.0", "musetalk/musetalk.json", ("musetalk/pytorch_model.bin",), "state_dict"),
    (
        "v1.5",
        "musetalk/unet/config.json",
        tuple(f"musetalk/unet/{w}" for w in VAE_WEIGHTS),
        "diffusers",
    ),
)
WHISPER_DIRS = ("whisper", "whisper-tiny")  # upstream's name first
WHISPER_FILES = (
    ("config.json",),
    ("model.safetensors", "pytorch_model.bin"),
    ("preprocessor_config.json",),
)
VAE_DIRS = ("sd-vae", "sd-vae-ft-mse")  # upstream's --vae_type default first
VERSIONS = ("v1.5", "v1.0")


@dataclass(frozen=True)
class UnetFiles:
    version: str  # "v1.5" or "v1.0"
    config: Path
    weights: Path
    layout: (
        str  # "state_dict": UNet2DConditionModel(**json) + torch.load; "diffusers": save_pretrained
    )


def _models_root(models_dir: Path | str | None, what: str) -> Path:
    if models_dir is None:
        raise ModelMissingError(
            f"{what} needs a models dir; set --models or HOTPLATE_MODELS (an upstream MuseTalk "
            "`models/` folder works as it is) and run `hotplate doctor`"
        )
    return Path(models_dir).expanduser()


def unet_files(models_dir: Path | str | None) -> UnetFiles:
    """The MuseTalk UNet under the models dir and its version, detected from the files:
    `musetalkV15/{musetalk.json,unet.pth}` is v1.5, `musetalk/{musetalk.json,pytorch_model.bin}`
    v1.0, hotplate's `musetalk/unet/` (diffusers folder) v1.5.

    Raises ModelMissingError naming every layout tried.
    """
    root = _models_root(models_dir, "the MuseTalk UNet")
    for version, config, weights, layout in UNET_LAYOUTS:
        found = next((root / w for w in weights if (root / w).is_file()), None)
        if (root / config).is_file() and found is not None:
            return UnetFiles(version, root / config, found, layout)
    tried = "; ".join(f"{root / c} + {' or '.join(w)}" for _, c, w, _ in UNET_LAYOUTS)
    missing = f"MuseTalk UNet not found; tried {tried}"
    raise ModelMissingError(
        f"{missing}; copy upstream's musetalkV15/ (or musetalk/) folder there and run "
        "`hotplate doctor`",
        missing,
    )


def musetalk_version(models_dir: Path | str | None, default: str = "v1.5") -> str:
    """The UNet's version ("v1.5" or "v1.0"), `default` when there is no UNet yet."""
    try:
        return unet_files(models_dir).version
    except ModelMissingError:
        return default


def _complete_dir(directory: Path, files: tuple[tuple[str, ...], ...]) -> list[str]:
    """The rows of `files` with no alternative present in `directory` (empty: complete)."""
    return [" or ".join(alts) for alts in files if not any((directory / a).is_file() for a in alts)]


def whisper_dir(models_dir: Path | str | None) -> Path:
    """`whisper/` (upstream) or `whisper-tiny/` (hotplate): config, weights and the
    feature extractor's preprocessor_config.json. Raises ModelMissingError naming what is missing."""
    root = _models_root(models_dir, "the MuseTalk Whisper encoder")
    misses = {}
    for name in WHISPER_DIRS:
        missing = _complete_dir(root / name, WHISPER_FILES)
        if not missing:
            return root / name
        misses[name] = missing
    detail = "; ".join(f"{root / n}/ lacks {', '.join(m)}" for n, m in misses.items())
    missing = f"Whisper not found: {detail}"
    raise ModelMissingError(
        f"{missing}; copy openai/whisper-tiny there and run `hotplate doctor`", missing
    )


def default_vae(models_dir: Path | str | None) -> str:
    """The VAE directory name MuseTalk uses: `sd-vae` (upstream) or `sd-vae-ft-mse`,
    whichever is complete; `sd-vae` when neither is (the error then names it)."""
    if models_dir is not None:
        for name in VAE_DIRS:
            try:
                vae_files(models_dir, name)
                return name
            except ModelMissingError:
                continue
    return VAE_DIRS[0]

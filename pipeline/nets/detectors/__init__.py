"""Face detectors behind one interface; `load_detector` picks one by recipe name."""

from __future__ import annotations

from pathlib import Path

from pipeline.nets.detectors.base import Detector

__all__ = ["Detector", "load_detector"]


def load_detector(name: str, models_dir: Path | None = None) -> Detector:
    """The detector called `name` ("retinaface", "dlib" or "s3fd").

    Raises ValueError for an unknown name and ModelMissingError (from pipeline.nets.models)
    when the weights are not in `models_dir` or torch hub's checkpoint cache.
    """
    if name == "retinaface":
        from pipeline.nets.detectors.retinaface import RetinaFaceDetector

        return RetinaFaceDetector()
    if name == "dlib":
        from pipeline.nets.detectors.dlib_hog import DlibHogDetector

        return DlibHogDetector()
    if name == "s3fd":
        from pipeline.nets.detectors.s3fd import S3FDDetector

        return S3FDDetector.from_models_dir(models_dir)
    raise ValueError(f"detector={name!r} is not one of retinaface, dlib, s3fd")

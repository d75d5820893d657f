"""Stages 3-5, landmarks, crops and masks: one pass over the full frames."""

from __future__ import annotations

import numpy as np

from pipeline.frames import FrameSource
from pipeline.nets.modelcache import kept
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.stages import Progress


class PerFrameStages:
    """landmarks, crops and masks, each one stage, sharing decoded frames.

    Frames are decoded once per pass and only held for the current index, so memory
    does not grow with the number of frames (beyond the 256x256 crops).
    """

    def __init__(
        self,
        recipe: Recipe,
        frames: FrameSource,
        boxes: np.ndarray,
        progress: Progress,
        keep_crops: bool = True,
    ) -> None:
        """`keep_crops`: make the crops in the landmarks pass (False for a mouth bank,
        which needs none: 60 s of crops are 300 MB)."""
        self.recipe, self.frames, self.boxes, self.progress = recipe, frames, boxes, progress
        self.keep_crops = keep_crops
        self._crops: tuple[np.ndarray, np.ndarray] | None = None

    def landmarks(self):
        """Landmarks; crops are made in the same pass (one decode per frame) and kept
        for the crops stage, which is stored under its own key right after."""
        from pipeline.nets.landmarks import load_landmarker

        r = self.recipe
        model = kept(
            "landmarks",
            r.landmarks,
            r.models_dir,
            lambda: load_landmarker(r.landmarks, r.models_dir),
        )
        from pipeline.nets.mesh_topology import mesh_to_68

        n = len(self.frames)
        out = np.zeros((n, 68, 2), np.float32)
        dense = getattr(model, "mesh_points", 0)  # a mesh backend: its mesh is stored too
        mesh = np.zeros((n, dense, 3), np.float32)
        if self.keep_crops:
            self._crops = self._empty_crops(n)
        for i, frame in enumerate(self.frames.each()):
            if dense:
                mesh[i] = model.predict_mesh(frame, self.boxes[i])
                out[i] = mesh_to_68(mesh[i])
            else:
                out[i] = model.predict(frame, self.boxes[i])
            if self.keep_crops:
                self._crop_one(i, frame, out[i])
            self.progress("landmarks", i + 1, n)
        return ({"landmarks": out, "mesh": mesh} if dense else {"landmarks": out}), {}

    def crops(self, landmarks: np.ndarray):
        if self._crops is None:  # landmarks were a hit: a pass of our own
            self._crops = self._empty_crops(len(self.frames))
            for i, frame in enumerate(self.frames.each()):
                self._crop_one(i, frame, landmarks[i])
                self.progress("crops", i + 1, len(self.frames))
        boxes, crops = self._crops
        return {"crop_boxes": boxes, "crops": crops}, {}

    def _empty_crops(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        size = self.recipe.crop_size
        return np.zeros((n, 4), np.int32), np.zeros((n, size, size, 3), np.uint8)

    def _crop_one(self, i: int, frame: np.ndarray, landmarks: np.ndarray) -> None:
        from pipeline.precompile.crops import crop_resize, half_face_box

        boxes, crops = self._crops
        r = self.recipe
        boxes[i] = half_face_box(landmarks, r.bbox_shift, frame.shape, self.boxes[i], r.crop_rules)
        crops[i] = crop_resize(frame, boxes[i], self.recipe.crop_size)

    def masks(self, landmarks: np.ndarray, crop_boxes: np.ndarray):
        from pipeline.precompile.masks import (
            bisenet_mask,
            blend_square,
            landmark_mask,
            load_face_parser,
        )

        n = len(self.frames)
        squares = np.zeros((n, 4), np.int32)
        masks = np.zeros((n, 256, 256), np.uint8)
        r = self.recipe
        parser = (
            kept("mask", r.mask, r.models_dir, lambda: load_face_parser(r.mask, r.models_dir))
            if r.mask == "bisenet"
            else None
        )
        for i in range(n):
            squares[i] = blend_square(crop_boxes[i])
            if parser is None:
                masks[i] = landmark_mask(
                    landmarks[i], crop_boxes[i], squares[i], 256, self.recipe.mask_feather
                )
            else:
                masks[i] = bisenet_mask(
                    parser,
                    self.frames(i),
                    crop_boxes[i],
                    squares[i],
                    256,
                    r.mask_feather,
                    r.parsing_mode,
                )
            self.progress("masks", i + 1, n)
        return {"mask_boxes": squares, "masks": masks}, {}

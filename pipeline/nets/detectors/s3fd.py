"""S3FD (face_alignment's network) with weights from the models directory; never downloads.

Post-processing is whole-tensor: anchors of all six feature levels are decoded at once
per level, and NMS is `nms.batched_nms`. Results equal face_alignment's SFDDetector
(candidates > 0.05, NMS at IoU 0.3, keep > 0.5) except that box areas here are w * h
rather than (w + 1) * (h + 1). Thresholding at 0.5 *before* NMS gives the same result
as after it: a box can only be suppressed by a higher-scoring one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.nets.detectors.base import empty_detections
from pipeline.nets.models import file_identity, find_weights

if TYPE_CHECKING:
    import torch

WEIGHTS = ["s3fd-619a316812.pth"]  # the name face_alignment's hub download uses
MEAN_BGR = (104.0, 117.0, 123.0)
VARIANCES = (0.1, 0.2)
SCORE_THRESHOLD = 0.5
NMS_IOU = 0.3
MAX_CANDIDATES = 3000  # per image, before NMS: bounds the O(n^2) IoU matrix


def decode_candidates(
    outputs: list[torch.Tensor], score_threshold: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All anchors scoring above the threshold: (boxes (M, 4), scores (M,), image (M,)).

    `outputs` is the network's [cls1, reg1, ..., cls6, reg6] (cls as logits).
    Level i has stride 2**(i + 2) and square anchors of 4 x stride centred on its cells.
    """
    import torch

    boxes, scores, images = [], [], []
    for level in range(len(outputs) // 2):
        cls, reg = outputs[2 * level], outputs[2 * level + 1]
        prob = torch.softmax(cls.float(), dim=1)[:, 1]  # (B, H, W)
        b, y, x = torch.nonzero(prob > score_threshold, as_tuple=True)
        stride = 2 ** (level + 2)
        anchor = float(stride * 4)
        loc = reg[b, :, y, x].float()  # (m, 4)
        centre = torch.stack([x, y], dim=1).float() * stride + stride / 2
        centre = centre + loc[:, :2] * VARIANCES[0] * anchor
        size = anchor * torch.exp(loc[:, 2:] * VARIANCES[1])
        boxes.append(torch.cat([centre - size / 2, centre + size / 2], dim=1))
        scores.append(prob[b, y, x])
        images.append(b)
    return torch.cat(boxes), torch.cat(scores), torch.cat(images)


def postprocess(
    outputs: list[torch.Tensor],
    batch_size: int,
    score_threshold: float = SCORE_THRESHOLD,
    iou_threshold: float = NMS_IOU,
) -> list[np.ndarray]:
    """Network outputs -> one (K, 5) float32 array per image, sorted by score."""
    import torch

    from pipeline.nets.detectors.nms import batched_nms

    boxes, scores, images = decode_candidates(outputs, score_threshold)
    results = []
    for i in range(batch_size):
        sel = torch.nonzero(images == i, as_tuple=True)[0]
        if sel.numel() > MAX_CANDIDATES:
            sel = sel[torch.topk(scores[sel], MAX_CANDIDATES).indices]
        keep = sel[batched_nms(boxes[sel], scores[sel], iou_threshold)]
        dets = torch.cat([boxes[keep], scores[keep, None]], dim=1)
        results.append(
            dets.cpu().numpy().astype(np.float32) if keep.numel() else empty_detections()
        )
    return results


class S3FDDetector:
    name = "s3fd"

    def __init__(self, weights: Path, device: str | None = None, batch_size: int = 8) -> None:
        import torch
        from face_alignment.detection.sfd.net_s3fd import s3fd

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        state = torch.load(weights, map_location="cpu", weights_only=True)
        net = s3fd()
        try:
            net.load_state_dict(state)
        except RuntimeError as err:
            raise ValueError(
                f"{weights}: not S3FD weights ({str(err).splitlines()[0]}); "
                f"use face_alignment's {WEIGHTS[0]}"
            ) from err
        self._net = net.to(self.device).eval()
        self.batch_size = batch_size
        self.identity = file_identity(weights)

    @classmethod
    def from_models_dir(cls, models_dir: Path | None) -> S3FDDetector:
        return cls(find_weights(models_dir, WEIGHTS, "S3FD face detector"))

    def detect(self, frames: list[np.ndarray]) -> list[np.ndarray]:
        results: list[np.ndarray] = [empty_detections()] * len(frames)
        # Batch frames of equal size (proxies of one video all are).
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for i, frame in enumerate(frames):
            by_shape.setdefault(frame.shape, []).append(i)
        for indices in by_shape.values():
            for start in range(0, len(indices), self.batch_size):
                chunk = indices[start : start + self.batch_size]
                for i, dets in zip(
                    chunk, self._detect_batch([frames[i] for i in chunk]), strict=True
                ):
                    results[i] = dets
        return results

    def _detect_batch(self, frames: list[np.ndarray]) -> list[np.ndarray]:
        import torch

        batch = torch.from_numpy(np.stack(frames)).to(self.device)
        # As face_alignment: RGB -> BGR, subtract the Caffe VGG mean, no scaling.
        x = batch.permute(0, 3, 1, 2).flip(1).float()
        x = x - torch.tensor(MEAN_BGR, device=self.device).view(1, 3, 1, 1)
        from pipeline.nets.cpu_speed import cached_runner

        # cpu_speed's fastest runtime for S3FD, made once (per input size, for some runtimes)
        outputs = cached_runner(self, "s3fd", lambda: self._net, (x[:1],))(x)
        return postprocess(outputs, len(frames))

"""Greedy non-maximum suppression as whole-tensor operations.

Greedy NMS keeps box i (in score order) when no *kept* box before it overlaps it by more
than the threshold. That is a recursion, but its answer is the unique fixed point of
    keep = not any(over[j, i] and keep[j] for j < i)
and iterating the whole vector from "keep all" reaches it: after round r the first r
entries are final, and in practice it settles in a few rounds (the length of the longest
chain of suppressions), each one an O(n^2) boolean matrix operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(N, M) IoU of boxes [x1, y1, x2, y2] (x2, y2 exclusive, so area = w * h)."""
    import torch

    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.maximum(a[:, None, :2], b[None, :, :2])
    rb = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return inter / union.clamp(min=torch.finfo(union.dtype).tiny)


def batched_nms(
    boxes: torch.Tensor,
    scores: torch.Tensor,
    iou_threshold: float,
    idxs: torch.Tensor | None = None,
) -> torch.Tensor:
    """Indices of the boxes greedy NMS keeps, highest score first.

    Boxes only suppress boxes with the same `idxs` value (e.g. the image in a batch);
    ties in score keep their input order. Suppression is IoU > iou_threshold.
    """
    import torch

    n = boxes.shape[0]
    if n == 0:
        return torch.zeros(0, dtype=torch.long, device=boxes.device)
    order = torch.argsort(scores, descending=True, stable=True)
    sorted_boxes = boxes[order].float()
    over = box_iou(sorted_boxes, sorted_boxes) > iou_threshold
    if idxs is not None:
        group = idxs[order]
        over &= group[:, None] == group[None, :]
    over = torch.triu(over, diagonal=1)  # over[j, i]: j ranks above i and overlaps it
    keep = torch.ones(n, dtype=torch.bool, device=boxes.device)
    for _ in range(n):
        new_keep = ~(over & keep[:, None]).any(dim=0)
        if torch.equal(new_keep, keep):
            break
        keep = new_keep
    return order[keep]

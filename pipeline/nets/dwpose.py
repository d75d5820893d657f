"""DWPose landmarks: a self-contained torch port of RTMPose-l whole-body (384x288).

Upstream MuseTalk takes its 68 face points from DWPose (`musetalk/utils/preprocessing.py`):
mmpose's `inference_topdown` on the whole frame (no person box, so the box is the frame),
whole-body keypoints 23:91. mmpose 1.3 does not install beside torch 2.13 and numpy 2, so
this module rebuilds the network from its config (`rtmpose-l_8xb32-270e_coco-ubody-
wholebody-384x288.py`) with module and parameter names that match mmpose's, so upstream's
`dw-ll_ucoco_384.pth` loads strictly:

- backbone: CSPNeXt P5 (deepen 1, widen 1, expand 0.5, channel attention, SiLU, BN eps 1e-5);
- head: RTMCC (7x7 conv, ScaleNorm + linear over the 9x12 map, one GAU block, SimCC
  classifiers at split ratio 2);
- test time: the bbox padded by 1.25 and fixed to 3:4, an affine warp to 288x384, mean/std
  normalisation, flip test (the flipped pass's vectors mirrored and their left/right points
  swapped, then averaged), argmax decode, and the inverse of the box transform.

The tests (`tests/pipeline/test_dwpose.py`) build mmpose's own modules from their source
files and compare them with this port on the same random weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.nets.backends import weight_names
from pipeline.nets.models import file_identity, find_weights

INPUT_SIZE = (288, 384)  # (w, h) of the network input
SPLIT_RATIO = 2.0  # SimCC bins per input pixel
BBOX_PADDING = 1.25  # mmpose GetBBoxCenterScale's default, which the config keeps
MEAN_RGB = (123.675, 116.28, 103.53)
STD_RGB = (58.395, 57.12, 57.375)
N_KEYPOINTS = 133  # COCO-WholeBody: 17 body, 6 feet, 68 face, 2 x 21 hands
FACE = slice(23, 91)  # the 68 face points, iBUG-300W order
BATCH = 4  # frames per forward pass (each runs twice: plain and flipped)
P5_STAGES = (
    (64, 128, 3, True, False),
    (128, 256, 6, True, False),
    (256, 512, 6, True, False),
    (512, 1024, 3, False, True),
)


@dataclass(frozen=True)
class Arch:
    """RTMPose's size knobs; `Arch()` is DWPose-l. Tests use smaller widen/deepen."""

    widen: float = 1.0
    deepen: float = 1.0
    expand_ratio: float = 0.5
    bn_eps: float = 1e-5  # the config's norm_cfg=dict(type='SyncBN') keeps BN's default
    gau_dims: int = 256
    gau_s: int = 128
    gau_expansion: int = 2
    final_kernel: int = 7
    n_keypoints: int = N_KEYPOINTS
    input_size: tuple[int, int] = INPUT_SIZE

    def stages(self) -> list[tuple[int, int, int, bool, bool]]:
        """CSPNeXt P5 scaled: (in, out, blocks, add_identity, spp) per stage."""
        return [
            (int(i * self.widen), int(o * self.widen), max(round(n * self.deepen), 1), idt, spp)
            for i, o, n, idt, spp in P5_STAGES
        ]

    @property
    def feature_map(self) -> tuple[int, int]:
        """(w, h) of the stride-32 feature map the head flattens."""
        w, h = self.input_size
        return math.ceil(w / 32), math.ceil(h / 32)


DWPOSE_L = Arch()


def flip_indices() -> list[int]:
    """For each COCO-WholeBody keypoint, its mirror image's index (mmpose's
    `flip_indices` from the dataset's swap names)."""
    idx = list(range(N_KEYPOINTS))

    def swap(a: int, b: int) -> None:
        idx[a], idx[b] = b, a

    for left in range(1, 17, 2):  # eyes, ears, shoulders, ..., ankles: left odd, right even
        swap(left, left + 1)
    for i in range(3):  # big toe, small toe, heel
        swap(17 + i, 20 + i)
    face_pairs = [(i, 16 - i) for i in range(8)]  # jaw
    face_pairs += [(17 + i, 26 - i) for i in range(5)]  # brows
    face_pairs += [(31, 35), (32, 34)]  # nostrils
    face_pairs += [(36, 45), (37, 44), (38, 43), (39, 42), (40, 47), (41, 46)]  # eyes
    face_pairs += [(48, 54), (49, 53), (50, 52), (55, 59), (56, 58)]  # outer lips
    face_pairs += [(60, 64), (61, 63), (65, 67)]  # inner lips
    for a, b in face_pairs:
        swap(23 + a, 23 + b)
    for i in range(21):  # left hand 91-111, right hand 112-132
        swap(91 + i, 112 + i)
    return idx


# --- geometry ---------------------------------------------------------------------------


def box_center_scale(
    box: Sequence[float], input_size: tuple[int, int] = INPUT_SIZE, padding: float = BBOX_PADDING
) -> tuple[np.ndarray, np.ndarray]:
    """Centre and (w, h) extent of the region the network sees for box [x1, y1, x2, y2]:
    the box padded by `padding`, then grown along one side to the input's aspect ratio."""
    b = np.asarray(box, dtype=np.float32).reshape(4)
    center = (b[:2] + b[2:]) * 0.5
    w, h = (b[2:] - b[:2]) * padding
    aspect = input_size[0] / input_size[1]
    scale = np.array([w, w / aspect] if w > h * aspect else [h * aspect, h], dtype=np.float32)
    return center, scale


def warp_matrix(
    center: np.ndarray, scale: np.ndarray, input_size: tuple[int, int] = INPUT_SIZE
) -> np.ndarray:
    """2x3 affine taking frame pixels to network-input pixels (cv2's convention: pixel
    centres at integers): the region's centre to the input's centre, its width to the
    input's width. Solved from three point pairs in float32, as mmpose does, so the warp
    is bit-identical to upstream's."""
    import cv2

    dst_w, dst_h = input_size
    half = float(scale[0]) * 0.5
    src = np.float32([center, center - [half, 0.0], center + [-half, half]])
    dst = np.float32(
        [[dst_w * 0.5, dst_h * 0.5], [0.0, dst_h * 0.5], [0.0, dst_h * 0.5 + dst_w * 0.5]]
    )
    return cv2.getAffineTransform(src, dst)


def to_frame(
    points: np.ndarray,
    center: np.ndarray,
    scale: np.ndarray,
    input_size: tuple[int, int] = INPUT_SIZE,
) -> np.ndarray:
    """Network-input pixel coordinates back to frame pixels (mmpose's inverse of the box
    transform, which ignores the half-pixel the forward warp keeps)."""
    return points / np.asarray(input_size, np.float32) * scale + center - 0.5 * scale


def crop_input(
    frame_rgb: np.ndarray, center: np.ndarray, scale: np.ndarray, input_size=INPUT_SIZE
) -> np.ndarray:
    """The (h, w, 3) uint8 network input for one region of an RGB frame."""
    import cv2

    m = warp_matrix(center, scale, input_size)
    return cv2.warpAffine(
        np.ascontiguousarray(frame_rgb),
        m,
        tuple(int(v) for v in input_size),
        flags=cv2.INTER_LINEAR,
    )


def decode_simcc(
    simcc_x: np.ndarray, simcc_y: np.ndarray, split_ratio: float = SPLIT_RATIO
) -> tuple[np.ndarray, np.ndarray]:
    """(N, K, Wx), (N, K, Wy) -> (N, K, 2) input-pixel points and (N, K) scores: argmax per
    axis, the score the lower of the two maxima; a point whose score is <= 0 is put at -1
    (as mmpose does) before dividing by the split ratio."""
    locs = np.stack([simcc_x.argmax(-1), simcc_y.argmax(-1)], axis=-1).astype(np.float32)
    scores = np.minimum(simcc_x.max(-1), simcc_y.max(-1))
    locs[scores <= 0] = -1
    return locs / split_ratio, scores


# --- network ----------------------------------------------------------------------------


def build_network(arch: Arch | None = None) -> Any:
    """An RTMPose network (`.backbone`, `.head`) with mmpose's parameter names."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    arch = arch or DWPOSE_L

    class ConvBN(nn.Module):
        """mmcv's ConvModule with BN and SiLU: conv (no bias) -> bn -> act."""

        def __init__(self, cin: int, cout: int, k: int, stride: int = 1, groups: int = 1):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)
            self.bn = nn.BatchNorm2d(cout, eps=arch.bn_eps)
            self.act = nn.SiLU(inplace=True)

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))

    class DepthwiseSeparable(nn.Module):
        def __init__(self, cin: int, cout: int, k: int):
            super().__init__()
            self.depthwise_conv = ConvBN(cin, cin, k, groups=cin)
            self.pointwise_conv = ConvBN(cin, cout, 1)

        def forward(self, x):
            return self.pointwise_conv(self.depthwise_conv(x))

    class Block(nn.Module):
        """CSPNeXt block: 3x3 conv, then a 5x5 depthwise-separable conv, plus identity."""

        def __init__(self, channels: int, identity: bool):
            super().__init__()
            self.conv1 = ConvBN(channels, channels, 3)
            self.conv2 = DepthwiseSeparable(channels, channels, 5)
            self.identity = identity

        def forward(self, x):
            out = self.conv2(self.conv1(x))
            return out + x if self.identity else out

    class ChannelAttention(nn.Module):
        def __init__(self, channels: int):
            super().__init__()
            self.fc = nn.Conv2d(channels, channels, 1, bias=True)

        def forward(self, x):
            return x * F.hardsigmoid(self.fc(F.adaptive_avg_pool2d(x, 1)))

    class CSPLayer(nn.Module):
        def __init__(self, channels: int, blocks: int, identity: bool):
            super().__init__()
            mid = int(channels * arch.expand_ratio)
            self.main_conv = ConvBN(channels, mid, 1)
            self.short_conv = ConvBN(channels, mid, 1)
            self.final_conv = ConvBN(2 * mid, channels, 1)
            self.blocks = nn.Sequential(*[Block(mid, identity) for _ in range(blocks)])
            self.attention = ChannelAttention(2 * mid)

        def forward(self, x):
            y = torch.cat([self.blocks(self.main_conv(x)), self.short_conv(x)], dim=1)
            return self.final_conv(self.attention(y))

    class SPP(nn.Module):
        """Spatial pyramid pooling: max pools of 5, 9 and 13 concatenated."""

        def __init__(self, channels: int, kernels=(5, 9, 13)):
            super().__init__()
            mid = channels // 2
            self.conv1 = ConvBN(channels, mid, 1)
            self.poolings = nn.ModuleList(nn.MaxPool2d(k, 1, k // 2) for k in kernels)
            self.conv2 = ConvBN(mid * (len(kernels) + 1), channels, 1)

        def forward(self, x):
            x = self.conv1(x)
            return self.conv2(torch.cat([x] + [p(x) for p in self.poolings], dim=1))

    class CSPNeXt(nn.Module):
        def __init__(self):
            super().__init__()
            stem = int(64 * arch.widen)
            self.stem = nn.Sequential(
                ConvBN(3, stem // 2, 3, stride=2),
                ConvBN(stem // 2, stem // 2, 3),
                ConvBN(stem // 2, stem, 3),
            )
            for i, (cin, cout, blocks, identity, spp) in enumerate(arch.stages()):
                layers = [ConvBN(cin, cout, 3, stride=2)]
                layers += [SPP(cout)] if spp else []
                layers += [CSPLayer(cout, blocks, identity)]
                self.add_module(f"stage{i + 1}", nn.Sequential(*layers))

        def forward(self, x):
            x = self.stem(x)
            for i in range(4):
                x = getattr(self, f"stage{i + 1}")(x)
            return x  # out_indices=(4,): the last stage only

    class ScaleNorm(nn.Module):
        """x / (||x|| / sqrt(dim)) * g, with the norm clamped at eps."""

        def __init__(self, dim: int, eps: float = 1e-5):
            super().__init__()
            self.scale, self.eps = dim**-0.5, eps
            self.g = nn.Parameter(torch.ones(1))

        def forward(self, x):
            norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True) * self.scale
            return x / norm.clamp(min=self.eps) * self.g

    class Scale(nn.Module):
        def __init__(self, dim: int):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            return x * self.scale

    class GAU(nn.Module):
        """RTMCC's gated attention unit over the keypoint tokens (self-attention, no
        relative bias, no rotary encoding: the DWPose config), with a scaled shortcut."""

        def __init__(self, dims: int, s: int, expansion: int):
            super().__init__()
            self.e, self.s = dims * expansion, s
            self.ln = ScaleNorm(dims)
            self.uv = nn.Linear(dims, 2 * self.e + s, bias=False)
            self.gamma = nn.Parameter(torch.ones(2, s))
            self.beta = nn.Parameter(torch.zeros(2, s))
            self.o = nn.Linear(self.e, dims, bias=False)
            self.res_scale = Scale(dims)

        def forward(self, x):
            uv = F.silu(self.uv(self.ln(x)))
            u, v, base = torch.split(uv, [self.e, self.e, self.s], dim=2)
            q, k = torch.unbind(base.unsqueeze(2) * self.gamma + self.beta, dim=2)
            kernel = torch.square(torch.relu(torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.s)))
            return self.res_scale(x) + self.o(u * torch.bmm(kernel, v))

    class RTMCCHead(nn.Module):
        def __init__(self):
            super().__init__()
            cin = int(1024 * arch.widen)
            fw, fh = arch.feature_map
            k = arch.final_kernel
            self.final_layer = nn.Conv2d(cin, arch.n_keypoints, k, 1, k // 2)
            self.mlp = nn.Sequential(ScaleNorm(fw * fh), nn.Linear(fw * fh, arch.gau_dims, False))
            self.gau = GAU(arch.gau_dims, arch.gau_s, arch.gau_expansion)
            w, h = (int(v * SPLIT_RATIO) for v in arch.input_size)
            self.cls_x = nn.Linear(arch.gau_dims, w, bias=False)
            self.cls_y = nn.Linear(arch.gau_dims, h, bias=False)

        def forward(self, feats):
            tokens = self.gau(self.mlp(torch.flatten(self.final_layer(feats), 2)))
            return self.cls_x(tokens), self.cls_y(tokens)

    class RTMPose(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = CSPNeXt()
            self.head = RTMCCHead()
            self.register_buffer("mean", torch.tensor(MEAN_RGB).view(1, 3, 1, 1), False)
            self.register_buffer("std", torch.tensor(STD_RGB).view(1, 3, 1, 1), False)
            self.register_buffer("flip", torch.tensor(flip_indices()[: arch.n_keypoints]), False)

        def forward(self, images):
            """(N, H, W, 3) uint8 RGB inputs -> SimCC (x, y), averaged with the flip test."""
            x = (images.permute(0, 3, 1, 2).float() - self.mean) / self.std
            n = x.shape[0]
            px, py = self.head(self.backbone(torch.cat([x, x.flip(-1)])))
            fx, fy = px[n:][:, self.flip].flip(-1), py[n:][:, self.flip]
            return (px[:n] + fx) * 0.5, (py[:n] + fy) * 0.5

    return RTMPose()


def load_network(path: Path, arch: Arch | None = None) -> Any:
    """The network with `path`'s weights, loaded strictly.

    Raises ValueError naming the file when it is not an RTMPose whole-body checkpoint.
    """
    state = read_state_dict(path)
    net = build_network(arch)
    try:
        net.load_state_dict(state, strict=True)
    except RuntimeError as e:
        first = str(e).splitlines()[0]
        raise ValueError(f"{path} does not match DWPose's RTMPose-l ({first}); replace it") from e
    return net.eval()


def read_state_dict(path: Path) -> dict[str, Any]:
    """The `state_dict` of an mmengine checkpoint (or a bare state dict), tensors only.

    mmengine checkpoints also pickle training state (`meta`, `message_hub`) whose classes
    are not installed here; those are read as inert placeholders, never imported or run.
    """
    import torch

    try:
        ckpt = _load_weights_only(path)
    except Exception as e:
        raise ValueError(f"{path} is not a readable PyTorch checkpoint ({e}); replace it") from e
    state = ckpt.get("state_dict", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict) or not state:
        raise ValueError(f"{path} holds no state_dict; it is not DWPose's dw-ll_ucoco_384.pth")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _load_weights_only(path: Path) -> Any:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        if not unsafe:
            raise
    # Stand-ins named like each foreign class: the weights-only unpickler accepts them,
    # and they swallow whatever state they are given.
    stand_ins = [_placeholder(name) for name in unsafe]
    with torch.serialization.safe_globals(stand_ins):
        return torch.load(path, map_location="cpu", weights_only=True)


def _placeholder(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")

    def swallow(self, *args, **kwargs):
        pass

    cls = type(name, (), {"__init__": swallow, "__setstate__": swallow, "__module__": module})
    cls.__qualname__ = name
    return cls


# --- landmarker -------------------------------------------------------------------------


class DWPoseLandmarker:
    """68 face points from DWPose, as upstream MuseTalk takes them: whole-body inference
    on the whole frame (upstream passes no person box), keypoints 23:91.

    The face box is checked but not used: upstream's points do not depend on it. Points are
    float32 frame pixels, centres at integers (cv2's convention, as mmpose's warp);
    upstream truncates them to int32 before building its crop box.
    """

    name = "dwpose"

    def __init__(self, path: Path, arch: Arch | None = None) -> None:
        import torch

        self.path = path
        self.identity = file_identity(path)
        self.arch = arch or DWPOSE_L
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._net = load_network(path, self.arch).to(self.device)

    def keypoints(self, frames: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """All 133 whole-body points (N, 133, 2) in frame pixels and their scores (N, 133)."""
        import torch

        pts = np.zeros((len(frames), self.arch.n_keypoints, 2), np.float32)
        scores = np.zeros((len(frames), self.arch.n_keypoints), np.float32)
        for start in range(0, len(frames), BATCH):
            chunk = frames[start : start + BATCH]
            size = self.arch.input_size
            regions = [box_center_scale(_frame_box(f), size) for f in chunk]
            crops = [crop_input(f, *r, size) for f, r in zip(chunk, regions, strict=True)]
            with torch.inference_mode():
                sx, sy = self._net(torch.from_numpy(np.stack(crops)).to(self.device))
            locs, vals = decode_simcc(sx.float().cpu().numpy(), sy.float().cpu().numpy())
            for i, (c, s) in enumerate(regions):
                pts[start + i] = to_frame(locs[i], c, s, self.arch.input_size)
                scores[start + i] = vals[i]
        return pts, scores

    def predict(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        return self.predict_batch([frame_rgb], np.asarray(box)[None])[0]

    def predict_batch(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        from pipeline.nets.boxes import check_boxes

        check_boxes(frames, boxes)  # upstream's points do not depend on the box
        return self.keypoints(frames)[0][:, FACE].copy()


def _frame_box(frame: np.ndarray) -> tuple[float, float, float, float]:
    h, w = frame.shape[:2]
    return 0.0, 0.0, float(w), float(h)


def load_dwpose(models_dir: Path | str | None) -> DWPoseLandmarker:
    """The DWPose landmarker on `dwpose/dw-ll_ucoco_384.pth` under the models dir."""
    path = find_weights(models_dir, weight_names("landmarks", "dwpose"), "DWPose landmark")
    return DWPoseLandmarker(path)

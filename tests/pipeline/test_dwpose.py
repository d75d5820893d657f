"""DWPose port (`pipeline/nets/dwpose.py`) against mmpose's own modules.

mmpose itself does not install here (see docs/notebook/precompile.md), so the reference network is
built from mmpose's and mmcv's source files in `shared/reference/mmpose/`, loaded with
importlib under a stand-in `mmpose` package whose registries only record. Both sides get
the same random weights through a checkpoint in upstream's format, which the port must load
strictly. A few small mmpose pieces are not in the snapshot; they are written below from
mmpose 1.3.2's text and named "stand-in".
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from skimage import data

from pipeline.nets import dwpose
from pipeline.nets.landmarks import load_landmarker
from pipeline.nets.models import ModelMissingError

# mmengine/mmcv import torch.jit.script and the reference's SPP uses torch.cuda.amp.autocast,
# both deprecated: noise about the reference, not about the port.
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:`torch.cuda.amp.autocast:FutureWarning"),
]
ROOT = Path(__file__).resolve().parents[2]
# shared/ beside the checkout (CI, /work/main); a worktree under /work/wt/ finds it one
# level further up; HOTPLATE_REFERENCE overrides both.
REFERENCE = Path(
    os.environ.get("HOTPLATE_REFERENCE")
    or next(
        (p for p in (ROOT / ".." / "shared" / "reference", ROOT / "../../shared/reference")
         if p.is_dir()),
        ROOT / ".." / "shared" / "reference",
    )
)  # fmt: skip
MMPOSE = REFERENCE / "mmpose"
SMALL = dwpose.Arch(widen=0.25, deepen=0.34)  # 1 block per stage, 256 channels at the end
FACE_BOX = np.array([175.0, 76.0, 265.0, 166.0])  # the astronaut's face


def require_reference() -> None:
    """Skip where the snapshot or mmengine/mmcv are absent; never in CI, where a skip
    would hide the parity proof."""
    missing = [] if MMPOSE.is_dir() else [str(MMPOSE)]
    for mod in ("mmengine", "mmcv"):
        if importlib.util.find_spec(mod) is None:
            missing.append(f"{mod} (pip install -e '.[dev]')")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"parity test needs {', '.join(missing)}")
        pytest.skip(f"needs {', '.join(missing)}")


# --- the reference, built from mmpose's files ---------------------------------------------

# COCO-WholeBody's swap table (configs/_base_/datasets/coco_wholebody.py), written as
# names for the body, feet and hands and as the config's face-i -> face-j list.
BODY = ["nose"] + [
    f"{side}_{part}"
    for part in ("eye", "ear", "shoulder", "elbow", "wrist", "hip", "knee", "ankle")
    for side in ("left", "right")
]
FEET = [f"{side}_{p}" for side in ("left", "right") for p in ("big_toe", "small_toe", "heel")]
FACE_SWAP = (
    "16 15 14 13 12 11 10 9 8 7 6 5 4 3 2 1 0 26 25 24 23 22 21 20 19 18 17 27 28 29 30 "
    "35 34 33 32 31 45 44 43 42 47 46 39 38 37 36 41 40 54 53 52 51 50 49 48 59 58 57 56 55 "
    "64 63 62 61 60 67 66 65"
)
HAND = ["root"] + [
    f"{f}{i}" for f in ("thumb", "forefinger", "middle_finger") for i in (1, 2, 3, 4)
]
HAND += [f"{f}{i}" for f in ("ring_finger", "pinky_finger") for i in (1, 2, 3, 4)]


def wholebody_flip_indices() -> list[int]:
    names = BODY + FEET + [f"face-{i}" for i in range(68)]
    names += [f"left_hand_{h}" if h == "root" else f"left_{h}" for h in HAND]
    names += [f"right_hand_{h}" if h == "root" else f"right_{h}" for h in HAND]
    face = dict(zip((f"face-{i}" for i in range(68)), FACE_SWAP.split(), strict=True))

    def mirror(n: str) -> str:
        if n in face:
            return f"face-{face[n]}"
        if n.startswith("left_"):
            return "right_" + n[5:]
        if n.startswith("right_"):
            return "left_" + n[6:]
        return n

    return [names.index(mirror(n)) for n in names]


class Registry:
    """An mmengine registry reduced to what these modules use: registering is a no-op,
    `build` makes the named class (None for names not needed at inference, like losses)."""

    def __init__(self) -> None:
        self.known: dict[str, type] = {}

    def register_module(self, *args, **kwargs):
        return lambda cls: cls

    def build(self, cfg):
        cfg = dict(cfg)
        kind = cfg.pop("type")
        cfg.pop("_scope_", None)
        return self.known[kind](**cfg) if kind in self.known else None


def _package(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = []
    mod.__dict__.update(attrs)
    return mod


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def patched_modules(names: list[str]):
    """Whatever the block puts into sys.modules under `names` (or below them) is removed
    again, and what was there before comes back."""
    saved = {
        k: v for k, v in sys.modules.items() if any(k == n or k.startswith(n + ".") for n in names)
    }
    try:
        yield
    finally:
        for k in [k for k in sys.modules if any(k == n or k.startswith(n + ".") for n in names)]:
            del sys.modules[k]
        sys.modules.update(saved)


def build_reference(arch: dwpose.Arch):
    """mmpose's TopdownPoseEstimator for DWPose's config (scaled by `arch`), plus the
    reference's data pipeline pieces, as a namespace."""
    import mmcv.cnn.bricks  # noqa: F401  (the real bricks: activation, norm, conv builders)
    import torch
    from mmengine.model import BaseModule, ImgDataPreprocessor
    from mmengine.model.utils import revert_sync_batchnorm
    from mmengine.structures import InstanceData

    ref = types.SimpleNamespace()
    models, codecs = Registry(), Registry()
    with patched_modules(["mmpose", "mmcv.cnn", "mmengine.registry"]):
        real_mmcv_cnn = sys.modules["mmcv.cnn"]
        sys.modules["mmengine.registry"] = _package("mmengine.registry", MODELS=Registry())
        bricks = MMPOSE.parent / "mmpose" / "mmcv" / "cnn" / "bricks"
        conv = _load("mmcv.cnn.bricks.conv_module", bricks / "conv_module.py")
        dsc = _load(
            "mmcv.cnn.bricks.depthwise_separable_conv_module",
            bricks / "depthwise_separable_conv_module.py",
        )
        sys.modules["mmcv.cnn"] = _package(
            "mmcv.cnn",
            ConvModule=conv.ConvModule,
            DepthwiseSeparableConvModule=dsc.DepthwiseSeparableConvModule,
            bricks=real_mmcv_cnn.bricks,
        )
        typing_mod = _package("mmpose.utils.typing")
        for alias in ("ConfigType", "OptConfigType", "OptMultiConfig", "InstanceList"):
            setattr(typing_mod, alias, object)
        for alias in ("OptSampleList", "SampleList", "PixelDataList"):
            setattr(typing_mod, alias, object)

        def to_numpy(x, unzip=False):
            if isinstance(x, tuple | list):
                out = [to_numpy(i) for i in x]
                return list(zip(*out, strict=True)) if unzip else out
            return x.detach().cpu().numpy()

        stand_ins = standin_modules(BaseModule, conv.ConvModule, models, InstanceData, to_numpy)
        for name, mod in {
            "mmpose": _package("mmpose"),
            "mmpose.registry": _package(
                "mmpose.registry", MODELS=models, KEYPOINT_CODECS=codecs, TRANSFORMS=Registry()
            ),
            "mmpose.utils": _package("mmpose.utils"),
            "mmpose.utils.typing": typing_mod,
            "mmpose.utils.tensor_utils": _package("mmpose.utils.tensor_utils", to_numpy=to_numpy),
            "mmpose.evaluation": _package("mmpose.evaluation"),
            "mmpose.evaluation.functional": _package(
                "mmpose.evaluation.functional", simcc_pck_accuracy=None
            ),
            "mmpose.codecs": _package("mmpose.codecs"),
            "mmpose.codecs.utils": _package("mmpose.codecs.utils"),
            "mmpose.models": _package("mmpose.models"),
            "mmpose.models.utils": _package("mmpose.models.utils"),
            "mmpose.models.backbones": _package("mmpose.models.backbones"),
            "mmpose.models.heads": _package("mmpose.models.heads"),
            "mmpose.models.heads.coord_cls_heads": _package("mmpose.models.heads.coord_cls_heads"),
            "mmpose.models.pose_estimators": _package("mmpose.models.pose_estimators"),
            "mmpose.structures": _package("mmpose.structures"),
            "mmpose.structures.bbox": _package("mmpose.structures.bbox"),
            **stand_ins,
        }.items():
            sys.modules[name] = mod
        src = MMPOSE / "mmpose"
        post = _load("mmpose.codecs.utils.post_processing", src / "codecs/utils/post_processing.py")
        sys.modules["mmpose.codecs.utils"].get_simcc_maximum = post.get_simcc_maximum
        sys.modules["mmpose.codecs.utils"].get_simcc_normalized = post.get_simcc_normalized
        _load("mmpose.codecs.utils.refinement", src / "codecs/utils/refinement.py")
        codecs.known["SimCCLabel"] = _load(
            "mmpose.codecs.simcc_label", src / "codecs/simcc_label.py"
        ).SimCCLabel
        bbox = _load("mmpose.structures.bbox.transforms", src / "structures/bbox/transforms.py")
        sys.modules["mmpose.structures.bbox"].__dict__.update(
            get_warp_matrix=bbox.get_warp_matrix, get_udp_warp_matrix=bbox.get_udp_warp_matrix
        )
        ref.bbox_xyxy2cs = bbox.bbox_xyxy2cs
        ref.TopdownAffine = _load(
            "mmpose.datasets.transforms.topdown_transforms",
            src / "datasets/transforms/topdown_transforms.py",
        ).TopdownAffine
        csp = _load("mmpose.models.utils.csp_layer", src / "models/utils/csp_layer.py")
        sys.modules["mmpose.models.utils"].CSPLayer = csp.CSPLayer
        _load("mmpose.models.utils.rtmcc_block", src / "models/utils/rtmcc_block.py")
        models.known["CSPNeXt"] = _load(
            "mmpose.models.backbones.cspnext", src / "models/backbones/cspnext.py"
        ).CSPNeXt
        models.known["RTMCCHead"] = _load(
            "mmpose.models.heads.coord_cls_heads.rtmcc_head",
            src / "models/heads/coord_cls_heads/rtmcc_head.py",
        ).RTMCCHead
        topdown = _load(
            "mmpose.models.pose_estimators.topdown", src / "models/pose_estimators/topdown.py"
        )
        codec = dict(
            type="SimCCLabel",
            input_size=arch.input_size,
            sigma=(6.0, 6.93),
            simcc_split_ratio=2.0,
            normalize=False,
            use_dark=False,
        )
        fw, fh = arch.feature_map
        torch.manual_seed(0)
        model = topdown.TopdownPoseEstimator(
            backbone=dict(
                _scope_="mmdet",
                type="CSPNeXt",
                arch="P5",
                expand_ratio=0.5,
                deepen_factor=arch.deepen,
                widen_factor=arch.widen,
                out_indices=(4,),
                channel_attention=True,
                norm_cfg=dict(type="SyncBN"),
                act_cfg=dict(type="SiLU"),
            ),
            head=dict(
                type="RTMCCHead",
                in_channels=int(1024 * arch.widen),
                out_channels=133,
                input_size=arch.input_size,
                in_featuremap_size=(fw, fh),
                simcc_split_ratio=2.0,
                final_layer_kernel_size=7,
                gau_cfg=dict(
                    hidden_dims=256,
                    s=128,
                    expansion_factor=2,
                    dropout_rate=0.0,
                    drop_path=0.0,
                    act_fn="SiLU",
                    use_rel_bias=False,
                    pos_enc=False,
                ),
                loss=dict(type="KLDiscretLoss", use_target_weight=True, beta=10.0),
                decoder=codec,
            ),
            test_cfg=dict(flip_test=True),
        )
    ref.model = randomize(revert_sync_batchnorm(model)).eval()
    ref.preprocessor = ImgDataPreprocessor(
        mean=list(dwpose.MEAN_RGB), std=list(dwpose.STD_RGB), bgr_to_rgb=True
    )
    ref.torch = torch
    return ref


def standin_modules(BaseModule, ConvModule, models, InstanceData, to_numpy):
    """mmpose modules the snapshot lacks, from mmpose 1.3.2's text (inference paths only)."""
    import torch
    from torch import nn

    class ScaleNorm(nn.Module):  # mmpose/models/utils/transformer.py
        def __init__(self, dim, eps=1e-5):
            super().__init__()
            self.scale = dim**-0.5
            self.eps = eps
            self.g = nn.Parameter(torch.ones(1))

        def forward(self, x):
            norm = torch.norm(x, dim=-1, keepdim=True)
            norm = norm * self.scale
            return x / norm.clamp(min=self.eps) * self.g

    def flip_vectors(x_labels, y_labels, flip_indices):  # mmpose/models/utils/tta.py
        assert x_labels.ndim == 3 and y_labels.ndim == 3
        x_labels = x_labels[:, flip_indices].flip(-1)
        y_labels = y_labels[:, flip_indices]
        return x_labels, y_labels

    class SPPBottleneck(BaseModule):  # mmpose/models/backbones/csp_darknet.py
        def __init__(
            self, in_channels, out_channels, kernel_sizes=(5, 9, 13), conv_cfg=None,
            norm_cfg=None, act_cfg=None, init_cfg=None,
        ):  # fmt: skip
            super().__init__(init_cfg)
            mid_channels = in_channels // 2
            kw = dict(conv_cfg=conv_cfg, norm_cfg=norm_cfg, act_cfg=act_cfg)
            self.conv1 = ConvModule(in_channels, mid_channels, 1, stride=1, **kw)
            self.poolings = nn.ModuleList(
                [nn.MaxPool2d(kernel_size=ks, stride=1, padding=ks // 2) for ks in kernel_sizes]
            )
            conv2_channels = mid_channels * (len(kernel_sizes) + 1)
            self.conv2 = ConvModule(conv2_channels, out_channels, 1, **kw)

        def forward(self, x):
            x = self.conv1(x)
            x = torch.cat([x] + [pooling(x) for pooling in self.poolings], dim=1)
            return self.conv2(x)

    class BaseHead(BaseModule):  # mmpose/models/heads/base_head.py: decode
        def decode(self, batch_outputs):
            batch_output_np = to_numpy(batch_outputs, unzip=True)
            preds = []
            for outputs in batch_output_np:
                keypoints, scores = self.decoder.decode(*outputs)
                preds.append(InstanceData(keypoints=keypoints, keypoint_scores=scores))
            return preds

    class BasePoseEstimator(BaseModule):  # mmpose/models/pose_estimators/base.py
        def __init__(self, backbone, neck=None, head=None, train_cfg=None, test_cfg=None,
                     data_preprocessor=None, init_cfg=None, metainfo=None):  # fmt: skip
            super().__init__(init_cfg)
            self.backbone = models.build(backbone)
            self.head = models.build(head)
            self.test_cfg = test_cfg or {}

        @property
        def with_head(self):
            return True

        def extract_feat(self, inputs):
            return self.backbone(inputs)

    class BaseKeypointCodec:  # mmpose/codecs/base.py
        support_batch_decoding = False

    return {
        "mmpose.models.utils.transformer": _package(
            "mmpose.models.utils.transformer", ScaleNorm=ScaleNorm
        ),
        "mmpose.models.utils.tta": _package("mmpose.models.utils.tta", flip_vectors=flip_vectors),
        "mmpose.models.backbones.csp_darknet": _package(
            "mmpose.models.backbones.csp_darknet", SPPBottleneck=SPPBottleneck
        ),
        "mmpose.models.heads.base_head": _package(
            "mmpose.models.heads.base_head", BaseHead=BaseHead
        ),
        "mmpose.models.pose_estimators.base": _package(
            "mmpose.models.pose_estimators.base", BasePoseEstimator=BasePoseEstimator
        ),
        "mmpose.codecs.base": _package("mmpose.codecs.base", BaseKeypointCodec=BaseKeypointCodec),
    }


def randomize(model):
    """Random weights everywhere, BN statistics included (mmcv initialises BN to identity)."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if not t.is_floating_point():
                continue
            if name.endswith(("running_var", "bn.weight", ".g", "scale.scale")):
                t.copy_(torch.rand(t.shape, generator=g) + 0.5)
            elif name.endswith(("running_mean", "bias", "beta", "gamma")):
                t.copy_(torch.randn(t.shape, generator=g) * 0.1)
    return model


def reference_keypoints(ref, frame_rgb: np.ndarray):
    """Upstream's `inference_topdown(model, frame)`: the frame as the box, BGR in as
    MuseTalk reads it, GetBBoxCenterScale, TopdownAffine, the data preprocessor, predict."""
    from mmengine.structures import BaseDataElement, InstanceData

    h, w = frame_rgb.shape[:2]
    box = np.array([[0, 0, w, h]], dtype=np.float32)
    center, scale = ref.bbox_xyxy2cs(box, padding=1.25)  # GetBBoxCenterScale's default
    results = ref.TopdownAffine(input_size=dwpose.INPUT_SIZE).transform(
        dict(img=np.ascontiguousarray(frame_rgb[..., ::-1]), bbox_center=center, bbox_scale=scale)
    )
    img = ref.torch.from_numpy(results["img"]).permute(2, 0, 1).contiguous()
    inputs = ref.preprocessor({"inputs": [img]})["inputs"]
    sample = BaseDataElement(
        metainfo=dict(
            input_center=results["input_center"],
            input_scale=results["input_scale"],
            input_size=results["input_size"],
            flip_indices=wholebody_flip_indices(),
        )
    )
    sample.gt_instances = InstanceData(bboxes=box, bbox_scores=np.ones(1, np.float32))
    with ref.torch.no_grad():
        out = ref.model.predict(inputs, [sample])
    return inputs, out[0].pred_instances.keypoints[0]


def save_upstream_checkpoint(model, path: Path) -> None:
    """mmengine's checkpoint layout: meta (numpy in dataset_meta), state_dict with
    backbone./head. prefixes, message_hub holding an mmengine class."""
    import torch
    from mmengine.logging import HistoryBuffer

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "meta": {"dataset_meta": {"flip_indices": wholebody_flip_indices(),
                                      "sigmas": np.full(133, 0.05, np.float32)}},
            "state_dict": model.state_dict(),
            "message_hub": {"log_scalars": {"loss": HistoryBuffer([1.0, 2.0], [1, 1])}},
        },
        path,
    )  # fmt: skip


def compare(ref, arch: dwpose.Arch, frame: np.ndarray, ckpt: Path) -> None:
    import torch

    save_upstream_checkpoint(ref.model, ckpt)
    port = dwpose.load_network(ckpt, arch)  # strict
    inputs, ref_points = reference_keypoints(ref, frame)

    # The same network input: the port's warp and normalisation against the reference's.
    center, scale = dwpose.box_center_scale((0, 0, frame.shape[1], frame.shape[0]))
    crop = dwpose.crop_input(frame, center, scale)
    x = (torch.from_numpy(crop)[None].permute(0, 3, 1, 2).float() - port.mean) / port.std
    torch.testing.assert_close(x, inputs, rtol=0, atol=1e-5)

    with torch.no_grad():
        feats_ref = ref.model.backbone(inputs)[-1]
        feats = port.backbone(inputs)
        torch.testing.assert_close(feats, feats_ref, rtol=1e-4, atol=1e-4 * feats_ref.abs().max())
        sx_ref, sy_ref = ref.model.head((feats_ref,))
        sx, sy = port.head(feats_ref)
        torch.testing.assert_close(sx, sx_ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(sy, sy_ref, rtol=1e-4, atol=1e-5)
        fx, fy = port(torch.from_numpy(crop)[None])  # with the flip test

    # Decoding: identical arrays decode identically (mmpose's SimCCLabel against ours).
    codec = ref.model.head.decoder
    locs_ref, scores_ref = codec.decode(fx[0].numpy(), fy[0].numpy())
    locs, scores = dwpose.decode_simcc(fx.numpy(), fy.numpy())
    np.testing.assert_array_equal(locs, locs_ref)
    np.testing.assert_array_equal(scores, scores_ref)

    # End to end on the frame: frame coordinates as upstream's, wherever the argmax is clear.
    points = dwpose.to_frame(locs[0], center, scale)
    assert points.shape == ref_points.shape == (133, 2)
    margin = np.minimum(_top2_gap(fx[0].numpy()), _top2_gap(fy[0].numpy()))
    clear = margin > 1e-4
    assert clear.mean() > 0.9, "too many near-ties to compare"
    np.testing.assert_allclose(points[clear], ref_points[clear], rtol=0, atol=1e-3)


def _top2_gap(simcc: np.ndarray) -> np.ndarray:
    top = np.sort(simcc, axis=-1)[:, -2:]
    return (top[:, 1] - top[:, 0]) / (np.abs(top[:, 1]) + 1e-12)


def test_port_matches_mmpose_small(tmp_path):
    """Reduced widths/depths at the real input size: features, SimCC, decode, frame
    coordinates on a non-square frame."""
    require_reference()
    ref = build_reference(SMALL)
    frame = data.astronaut()[:, 40:440]  # 512 x 400: the box is padded in height
    compare(ref, SMALL, frame, tmp_path / "small.pth")


@pytest.mark.slow
def test_port_matches_mmpose_real_size(tmp_path):
    """DWPose-l's real size: upstream's checkpoint layout loads strictly and the outputs
    match (the same checks as the small model, once)."""
    require_reference()
    ref = build_reference(dwpose.Arch())
    n_params = sum(p.numel() for p in ref.model.parameters())
    assert n_params > 30e6  # RTMPose-l, not a scaled copy
    compare(ref, dwpose.Arch(), data.astronaut(), tmp_path / "dwpose" / "dw-ll_ucoco_384.pth")


# --- geometry and the landmarker (no reference needed) ------------------------------------


def test_flip_indices_are_a_mirror():
    idx = dwpose.flip_indices()
    assert sorted(idx) == list(range(133))
    assert all(idx[idx[i]] == i for i in range(133))
    assert idx[23 + 8] == 23 + 8 and idx[23 + 30] == 23 + 30  # chin and nose tip stay
    assert idx[23 + 36] == 23 + 45 and idx[23 + 48] == 23 + 54  # eye and mouth corners swap


def test_flip_indices_match_coco_wholebody_names():
    assert dwpose.flip_indices() == wholebody_flip_indices()


@pytest.mark.parametrize(("w", "h"), [(512, 512), (640, 360), (300, 700)])
def test_affine_round_trip(w, h):
    """A dot in the frame lands in the 288x384 input where the warp says, and the input
    pixel maps back to the dot's frame pixel."""
    center, scale = dwpose.box_center_scale((0, 0, w, h))
    assert math.isclose(scale[0] / scale[1], 288 / 384, rel_tol=1e-6)
    assert scale[0] >= 1.25 * w - 1e-3 and scale[1] >= 1.25 * h - 1e-3
    k = 288 / scale[0]
    for fx, fy in [(w // 2, h // 2), (w // 5, h - h // 7), (w - 20, 15)]:
        frame = np.zeros((h, w, 3), np.uint8)
        frame[fy - 2 : fy + 3, fx - 2 : fx + 3] = 255  # 5x5: survives the downscale
        crop = dwpose.crop_input(frame, center, scale)
        assert crop.shape == (384, 288, 3) and crop.dtype == np.uint8
        m = dwpose.warp_matrix(center, scale)
        expected = m @ np.array([fx, fy, 1.0])
        ys, xs = np.nonzero(crop[..., 0] > 0)
        weights = crop[ys, xs, 0].astype(float)
        found = np.array([np.average(xs, weights=weights), np.average(ys, weights=weights)])
        np.testing.assert_allclose(found, expected, atol=0.6)
        back = dwpose.to_frame(expected.astype(np.float32)[None], center, scale)[0]
        np.testing.assert_allclose(back, [fx, fy], atol=1e-3 / k)


def test_decode_simcc_bins_and_misses():
    sx = np.full((1, 3, 576), -1.0, np.float32)
    sy = np.full((1, 3, 768), -1.0, np.float32)
    sx[0, 0, 101], sy[0, 0, 500] = 2.0, 3.0  # a clear peak
    sx[0, 1, 7], sy[0, 1, 9] = 0.5, -0.2  # y's maximum is negative: no point
    locs, scores = dwpose.decode_simcc(sx, sy)
    np.testing.assert_array_equal(locs[0, 0], [50.5, 250.0])
    assert scores[0, 0] == 2.0
    np.testing.assert_array_equal(locs[0, 1], [-0.5, -0.5])
    np.testing.assert_array_equal(locs[0, 2], [-0.5, -0.5])


@pytest.fixture
def small_models(tmp_path, monkeypatch):
    """A models dir holding a small random DWPose at upstream's path."""
    import torch

    monkeypatch.setattr(dwpose, "DWPOSE_L", SMALL)  # what the landmarker builds
    torch.manual_seed(3)
    net = dwpose.build_network(SMALL)
    randomize(net)
    path = tmp_path / "models" / "dwpose" / "dw-ll_ucoco_384.pth"
    path.parent.mkdir(parents=True)
    torch.save({"meta": {}, "state_dict": net.state_dict()}, path)
    return tmp_path / "models"


def test_landmarker_on_astronaut(small_models):
    """Random weights give meaningless points, so this checks the protocol: 68 float32
    points in the frame's coordinates (inside the padded frame region), upstream's face
    slice of the whole-body output, and that the face box does not change them."""
    frame = data.astronaut()
    lm = load_landmarker("dwpose", small_models)
    assert lm.name == "dwpose" and len(lm.identity) == 32
    pts = lm.predict(frame, FACE_BOX)
    assert pts.shape == (68, 2) and pts.dtype == np.float32
    whole, scores = lm.keypoints([frame])
    assert whole.shape == (1, 133, 2) and scores.shape == (1, 133)
    np.testing.assert_array_equal(pts, whole[0, 23:91])
    center, scale = dwpose.box_center_scale((0, 0, 512, 512))
    lo, hi = center - scale / 2, center + scale / 2
    seen = scores[0, 23:91] > 0
    assert ((pts[seen] >= lo) & (pts[seen] <= hi)).all()
    np.testing.assert_array_equal(lm.predict(frame, FACE_BOX + 40), pts)
    batch = lm.predict_batch([frame, frame[:, ::-1]], np.stack([FACE_BOX, FACE_BOX]))
    assert batch.shape == (2, 68, 2)
    np.testing.assert_array_equal(batch[0], pts)


def test_missing_weights_one_line(tmp_path, monkeypatch):
    for var in ("HOME", "TORCH_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    with pytest.raises(ModelMissingError) as e:
        load_landmarker("dwpose", tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "dwpose/dw-ll_ucoco_384.pth" in msg and "hotplate doctor" in msg


def test_wrong_checkpoint_names_the_file(tmp_path):
    import torch

    path = tmp_path / "dwpose" / "dw-ll_ucoco_384.pth"
    path.parent.mkdir()
    torch.save({"state_dict": {"backbone.stem.0.conv.weight": torch.zeros(1)}}, path)
    with pytest.raises(ValueError, match="dw-ll_ucoco_384.pth does not match"):
        load_landmarker("dwpose", tmp_path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable PyTorch checkpoint"):
        load_landmarker("dwpose", tmp_path)


def test_precompile_with_dwpose_keys_on_the_weights(small_models, tmp_path):
    """The landmarks stage runs on DWPose, and other weights under the same name are
    another landmarks key (the file's digest is the model identity)."""
    import torch

    from cachestore.store import forget_store, open_store
    from hotplate.demo_data import write_loop_video
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile

    loop = write_loop_video(tmp_path / "loop.mp4", n_frames=2, size=(360, 640), motion="gentle")
    store = open_store(tmp_path / "store")
    try:
        recipe = Recipe(landmarks="dwpose", models_dir=small_models, max_frames=2)
        first = precompile(loop, recipe, store)
        assert "landmarks" in [s.name for s in first.stages if not s.hit]
        path = small_models / "dwpose" / "dw-ll_ucoco_384.pth"
        state = torch.load(path, weights_only=True)
        state["state_dict"]["head.cls_x.weight"] += 0.01
        torch.save(state, path)
        second = precompile(loop, recipe, store)
        assert [s.name for s in second.stages if not s.hit][:3] == ["landmarks", "crops", "masks"]
    finally:
        forget_store(tmp_path / "store")

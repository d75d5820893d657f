"""hotplate's MuseTalk path against upstream MuseTalk's own code, on the same inputs and
the same tiny random weights in upstream's file layout.

Upstream's avatar preparation (`Avatar.prepare_material` of scripts/realtime_inference.py
with `get_landmark_and_bbox` of musetalk/utils/preprocessing.py) cannot be imported: both
modules load mmpose, DWPose and S3FD at import time. Their functions are compiled from the
snapshot's source (`upstream_function`) into a namespace whose pose model returns the 68
points under test and whose VAE is not needed; everything else they call (FaceParsing,
get_image_prepare_material, cv2, PIL) is upstream's real code.
"""

from __future__ import annotations

import ast
import pickle
import types
from pathlib import Path

import numpy as np
import pytest

from pipeline.precompile.crops import half_face_box
from pipeline.precompile.masks import bisenet_mask, blend_square, load_face_parser, store_size
from pipeline.render.renderers.base import fit_mask
from testkit.render_fixtures import speech
from tests.pipeline.parity_fixtures import (
    import_upstream,
    musetalk_reference,
    save_upstream_models,
)
from tests.pipeline.test_masks import synthetic_face

SHIFT_V1 = 7  # a bbox_shift v1.0 honours and v1.5 ignores


@pytest.fixture(scope="module")
def upstream_models(tmp_path_factory):
    musetalk_reference()  # skip early when the snapshot is absent
    return save_upstream_models(tmp_path_factory.mktemp("up") / "models")


def upstream_function(relpath: str, names: list[str], namespace: dict) -> dict:
    """Compile the top-level functions (or class methods, as "Class.method") `names` of
    an upstream file into `namespace`, without running the rest of the module."""
    tree = ast.parse((musetalk_reference() / relpath).read_text())
    wanted = []
    for name in names:
        cls, _, meth = name.rpartition(".")
        body = tree.body
        if cls:
            body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
        node = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == meth)
        node.decorator_list = []
        wanted.append(node)
    module = ast.Module(body=wanted, type_ignores=[])
    exec(compile(module, str(musetalk_reference() / relpath), "exec"), namespace)
    return namespace


def frames_and_points() -> list[tuple[np.ndarray, np.ndarray]]:
    """RGB frames (the astronaut, at two places and scales) and their 68 points, with
    fractions, so that upstream's int32 truncation is exercised."""
    from skimage import data

    base = data.astronaut()
    big = np.zeros((640, 600, 3), np.uint8)
    big[40:552, 30:542] = base
    out = [(base, synthetic_face(220.3, 120.7, 90.4))]
    out.append((big, synthetic_face(250.6, 160.2, 96.9)))
    out.append((big, synthetic_face(251.4, 158.8, 95.1)))
    return out


def run_upstream_preparation(
    models: Path, workdir: Path, version: str, monkeypatch
) -> tuple[list, list]:
    """Upstream's prepare_material on our frames: (crop boxes, masks) of the first cycle."""
    import cv2
    import torch
    from tqdm import tqdm

    blending = import_upstream("musetalk.utils.blending")
    face_parsing = import_upstream("musetalk.utils.face_parsing")
    items = frames_and_points()
    frames_dir = workdir / "frames"
    frames_dir.mkdir(parents=True)
    for i, (frame, _) in enumerate(items):
        cv2.imwrite(str(frames_dir / f"{i:08d}.png"), frame[:, :, ::-1])
    points = iter([p for _, p in items])

    def inference_topdown(model, frame):  # DWPose stand-in: whole-body keypoints 23:91 = ours
        keypoints = np.zeros((1, 133, 2), np.float32)
        keypoints[0, 23:91] = next(points)
        return types.SimpleNamespace(pred_instances=types.SimpleNamespace(keypoints=keypoints))

    detector = types.SimpleNamespace(get_detections_for_batch=lambda fb: [(0, 0, 10, 10)])
    monkeypatch.chdir(models.parent)  # FaceParsing reads ./models/face-parse-bisent/
    fp = face_parsing.FaceParsing(
        **({"left_cheek_width": 90, "right_cheek_width": 90} if version == "v15" else {})
    )
    ns: dict = {
        "np": np,
        "cv2": cv2,
        "torch": torch,
        "os": __import__("os"),
        "glob": __import__("glob"),
        "json": __import__("json"),
        "pickle": pickle,
        "shutil": __import__("shutil"),
        "tqdm": tqdm,
        "inference_topdown": inference_topdown,
        "merge_data_samples": lambda r: r,
        "model": None,
        "fa": detector,
        "args": types.SimpleNamespace(version=version, extra_margin=10, parsing_mode="jaw"),
        "vae": types.SimpleNamespace(get_latents_for_unet=lambda crop: torch.zeros(1)),
        "fp": fp,
        "get_image_prepare_material": blending.get_image_prepare_material,
        "video2imgs": None,
    }
    upstream_function("musetalk/utils/preprocessing.py", ["read_imgs", "get_landmark_and_bbox"], ns)
    upstream_function("scripts/realtime_inference.py", ["Avatar.prepare_material"], ns)
    avatar_dir = workdir / "avatar"
    (avatar_dir / "full").mkdir(parents=True)
    (avatar_dir / "mask").mkdir()
    avatar = types.SimpleNamespace(
        avatar_info_path=str(avatar_dir / "info.json"),
        avatar_info={},
        video_path=str(frames_dir),
        full_imgs_path=str(avatar_dir / "full"),
        mask_out_path=str(avatar_dir / "mask"),
        mask_coords_path=str(avatar_dir / "mask_coords.pkl"),
        coords_path=str(avatar_dir / "coords.pkl"),
        latents_out_path=str(avatar_dir / "latents.pt"),
        bbox_shift=0 if version == "v15" else SHIFT_V1,  # what upstream's main passes
    )
    ns["prepare_material"](avatar)
    n = len(items)
    return [list(map(int, b)) for b in avatar.coord_list_cycle[:n]], avatar.mask_list_cycle[:n]


@pytest.mark.parametrize("version", ["v15", "v1"])
def test_crop_boxes_and_masks_match_upstream(upstream_models, tmp_path, monkeypatch, version):
    boxes, masks = run_upstream_preparation(upstream_models, tmp_path, version, monkeypatch)
    rules, mode = ("v1.5", "jaw") if version == "v15" else ("v1.0", "raw")
    parser = load_face_parser("bisenet", upstream_models)
    for (frame, pts), box, up_mask in zip(frames_and_points(), boxes, masks, strict=True):
        # hotplate is given a persona's shift in both versions: v1.5 must ignore it
        ours = half_face_box(pts, SHIFT_V1, frame.shape, np.array([0, 0, 10, 10]), rules)
        assert ours.tolist() == box
        square = blend_square(ours)
        mask = bisenet_mask(parser, frame, ours, square, 256, 0.1, mode)
        assert up_mask.shape == (square[3] - square[1], square[2] - square[0])
        assert 0 < (up_mask > 128).mean() < 0.5  # the weights give a real region to compare
        # the store keeps masks at 256x256: compare there, then as the renderer fits it back
        assert np.abs(mask.astype(int) - store_size(up_mask, 256)).max() <= 2
        full = fit_mask(mask, square).astype(int)
        assert np.abs(full - up_mask).max() <= 4  # + the two resamplings' rounding


def test_whisper_prompts_are_bit_identical(upstream_models):
    import torch
    from transformers import WhisperModel

    from pipeline.render.renderers.musetalk import MuseTalkRenderer
    from testkit.render_fixtures import build_assets

    audio_processor = import_upstream("musetalk.utils.audio_processor")
    audio = speech(1.3, 16000)
    proc = audio_processor.AudioProcessor(str(upstream_models / "whisper"))
    feats = [
        proc.feature_extractor(
            audio[i : i + 480000], return_tensors="pt", sampling_rate=16000
        ).input_features.to(torch.float32)
        for i in range(0, len(audio), 480000)
    ]
    whisper = WhisperModel.from_pretrained(upstream_models / "whisper").eval()
    with torch.no_grad():
        prompts = proc.get_whisper_chunk(feats, "cpu", torch.float32, whisper, len(audio), fps=25)
    r = MuseTalkRenderer(upstream_models, device="cpu")
    assets = build_assets(4, latents=np.zeros((4, 8, 32, 32), np.float16))
    r.prepare(assets, audio, 16000, len(prompts), 25.0)
    ours = r.audio_tokens(range(len(prompts)))
    assert tuple(ours.shape) == tuple(prompts.shape) == (32, 50, 384)
    assert torch.equal(ours, prompts)


def test_unet_decode_and_blend_match_upstream(upstream_models, tmp_path, monkeypatch):
    # Bit-identical is a statement about the arithmetic, so it is checked on eager torch,
    # upstream's own runtime; the faster CPU runtimes hotplate picks by default are held
    # within 2/255 of eager by tests/pipeline/test_cpu_speed.py.
    monkeypatch.setenv("HOTPLATE_CPU_RUNTIME", "eager")
    import cv2
    import torch
    from transformers import WhisperModel

    from pipeline.render.renderers.musetalk import MuseTalkRenderer, paste_face
    from testkit.render_fixtures import build_assets

    unet_mod = import_upstream("musetalk.models.unet")
    vae_mod = import_upstream("musetalk.models.vae")
    audio_processor = import_upstream("musetalk.utils.audio_processor")
    blending = import_upstream("musetalk.utils.blending")
    rng = np.random.default_rng(0)
    latents = rng.normal(0, 1, (4, 8, 32, 32)).astype(np.float16)
    audio = speech(0.5, 16000)

    # upstream: realtime_inference.py's inference loop, on CPU in float32
    unet = unet_mod.UNet(
        str(upstream_models / "musetalkV15" / "musetalk.json"),
        str(upstream_models / "musetalkV15" / "unet.pth"),
        device=torch.device("cpu"),
    )
    vae = vae_mod.VAE(model_path=str(upstream_models / "sd-vae"))
    pe = unet_mod.PositionalEncoding(d_model=384)
    proc = audio_processor.AudioProcessor(str(upstream_models / "whisper"))
    feats = [proc.feature_extractor(audio, return_tensors="pt", sampling_rate=16000).input_features]
    whisper = WhisperModel.from_pretrained(upstream_models / "whisper").eval()
    ts, idxs = [0, 5, 11], [2, 0, 3]
    with torch.no_grad():
        chunks = proc.get_whisper_chunk(feats, "cpu", torch.float32, whisper, len(audio), fps=25)
        latent_batch = torch.from_numpy(latents[idxs].astype(np.float32))
        pred = unet.model(
            latent_batch, torch.tensor([0]), encoder_hidden_states=pe(chunks[ts])
        ).sample
        recon = vae.decode_latents(pred)  # BGR

    r = MuseTalkRenderer(upstream_models, device="cpu", vae="sd-vae")
    assets = build_assets(4, latents=latents)
    r.prepare(assets, audio, 16000, 12, 25.0)
    faces = r.faces(ts, idxs)
    assert np.array_equal(faces, recon[..., ::-1])

    # the blend, on the same decoded face and upstream's own mask for the frame
    frame, pts = frames_and_points()[1]
    crop = half_face_box(pts, 0, frame.shape, np.array([0, 0, 10, 10]), "v1.5")
    square = blend_square(crop)
    parser = load_face_parser("bisenet", upstream_models)
    mask = bisenet_mask(parser, frame, crop, square, 256, 0.1, "jaw")
    up_mask = fit_mask(mask, square)  # upstream blends through a full-size mask
    x1, y1, x2, y2 = (int(v) for v in crop)
    res = cv2.resize(recon[0], (x2 - x1, y2 - y1))
    want = blending.get_image_blending(
        frame[:, :, ::-1].copy(), res, [x1, y1, x2, y2], up_mask, [int(v) for v in square]
    )[:, :, ::-1]
    got = paste_face(frame, faces[0], crop, mask, square)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 2
    assert not np.array_equal(got, frame)

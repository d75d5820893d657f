"""Small in-memory avatars and audio files for the render tests.

An avatar is built the way precompile builds one, from the project's own pieces:
frames from `hotplate.demo_data` (the astronaut photo moved by a known affine, whose
face boxes are ground truth), dlib's 68 landmarks inside those boxes, half-face crop
boxes, blend squares and landmark masks. No store is involved: `load_frame` reads a
list of read-only arrays, so a renderer that writes into its input fails loudly.
"""

from __future__ import annotations

import os
import time
from functools import lru_cache
from pathlib import Path

import numpy as np

from hotplate.demo_data import make_loop_frames, make_speech_audio
from pipeline.assets import AvatarAssets

SMALL = (360, 640)  # (width, height): portrait, face ~108 px wide
FULL = (1080, 1920)
MASK_SIZE = 256


@lru_cache(maxsize=4)
def _geometry(
    n_frames: int, size: tuple[int, int], motion: str, seed: int, landmarks: str = "dlib"
) -> tuple:
    from pipeline.nets.landmarks import load_landmarker
    from pipeline.precompile.crops import crop_resize, half_face_box
    from pipeline.precompile.masks import blend_square, landmark_mask

    frames, boxes = make_loop_frames(n_frames, size, motion, seed)
    for f in frames:
        f.flags.writeable = False
    landmarker = load_landmarker(landmarks, None)
    landmarks = landmarker.predict_batch(frames, boxes)
    shape = frames[0].shape
    crop_boxes = np.stack(
        [half_face_box(lm, 0, shape, b) for lm, b in zip(landmarks, boxes, strict=True)]
    )
    crops = np.stack([crop_resize(f, cb) for f, cb in zip(frames, crop_boxes, strict=True)])
    mask_boxes = np.stack([blend_square(cb) for cb in crop_boxes])
    masks = np.stack(
        [
            landmark_mask(lm, cb, sq, MASK_SIZE)
            for lm, cb, sq in zip(landmarks, crop_boxes, mask_boxes, strict=True)
        ]
    )
    for arr in (landmarks, crop_boxes, crops, mask_boxes, masks):
        arr.flags.writeable = False
    return frames, boxes, landmarks, crop_boxes, crops, mask_boxes, masks


def build_assets(
    n_frames: int = 6,
    size: tuple[int, int] = SMALL,
    fps: float = 25.0,
    motion: str = "gentle",
    seed: int = 0,
    latents: np.ndarray | None = None,
    landmarker: str = "dlib",
) -> AvatarAssets:
    """An AvatarAssets of `n_frames` synthetic frames of (width, height) `size`, with
    the 68 points of `landmarker`."""
    frames, boxes, landmarks, crop_boxes, crops, mask_boxes, masks = _geometry(
        n_frames, size, motion, seed, landmarker
    )
    return AvatarAssets(
        key=f"test-{n_frames}-{size[0]}x{size[1]}-{motion}-{seed}-{landmarker}",
        fps=fps,
        width=size[0],
        height=size[1],
        boxes=boxes,
        landmarks=landmarks,
        crop_boxes=crop_boxes,
        crops=crops,
        mask_boxes=mask_boxes,
        masks=masks,
        load_frame=frames.__getitem__,
        latents=latents,
    )


def full_mask(assets: AvatarAssets, i: int) -> np.ndarray:
    """(H, W) uint8 blend weight of stored frame i over the whole frame (0 outside its square)."""
    from pipeline.render.renderers.base import fit_mask

    out = np.zeros((assets.height, assets.width), np.uint8)
    x1, y1, x2, y2 = (int(v) for v in assets.mask_boxes[i])
    m = fit_mask(assets.masks[i], assets.mask_boxes[i])
    fx1, fy1, fx2, fy2 = max(x1, 0), max(y1, 0), min(x2, assets.width), min(y2, assets.height)
    out[fy1:fy2, fx1:fx2] = m[fy1 - y1 : fy2 - y1, fx1 - x1 : fx2 - x1]
    return out


def speech(seconds: float, sr: int = 16000, seed: int = 0) -> np.ndarray:
    """Syllables and pauses (see hotplate.demo_data.make_speech_audio)."""
    return make_speech_audio(seconds, sr, seed)


def threads_down_to(limit: int, seconds: float = 10.0) -> int:
    """This process's thread count once it is `limit` or fewer, or after `seconds`: a
    thread just joined may be listed a moment longer while it exits; a kept one stays."""
    deadline = time.monotonic() + seconds
    while (n := len(os.listdir("/proc/self/task"))) > limit and time.monotonic() < deadline:
        time.sleep(0.01)
    return n


def write_audio(
    path: str | Path,
    samples: np.ndarray,
    sr: int,
    codec: str = "pcm_s16le",
    container: str | None = None,
) -> Path:
    """Write float samples, (n,) mono or (channels, n), with PyAV's encoder `codec`."""
    import av

    path = Path(path)
    data = np.asarray(samples, np.float32)
    data = data[None, :] if data.ndim == 1 else data
    layout = {1: "mono", 2: "stereo"}[data.shape[0]]
    with av.open(str(path), "w", format=container) as out:
        stream = out.add_stream(codec, rate=sr, layout=layout)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format="fltp", layout=layout)
        frame.sample_rate = sr
        frame.pts = 0
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path


def read_video(path: str | Path) -> tuple[list[np.ndarray], dict]:
    """Decoded RGB frames and stream facts of an MP4 written by the renderer."""
    import av

    with av.open(str(path)) as c:
        v, a = c.streams.video[0], c.streams.audio[0]
        info = {
            "video_codec": v.codec_context.name,
            "audio_codec": a.codec_context.name,
            "width": v.codec_context.width,
            "height": v.codec_context.height,
            "audio_seconds": float(a.duration * a.time_base),
            "video_seconds": float(v.duration * v.time_base),
            "rate": v.average_rate,
        }
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(v)]
    return frames, info


# A small MuseTalk UNet as upstream's musetalk.json holds one (the real one: see
# bench/bench_musetalk.py). The "_" keys are in upstream's file too and must be accepted.
TINY_UNET = {
    "_class_name": "UNet2DConditionModel",
    "_diffusers_version": "0.6.0",
    "sample_size": 32,
    "in_channels": 8,
    "out_channels": 4,
    "block_out_channels": [32, 64],
    "layers_per_block": 1,
    "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
    "cross_attention_dim": 384,
    "attention_head_dim": 8,
    "norm_num_groups": 8,
}


def tiny_sd_vae():
    """A random AutoencoderKL with the SD VAE's shape contract (4 latents, 256 -> 32)."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=4,
        sample_size=256,
    )


def tiny_whisper(encoder_layers: int = 1):
    """(random WhisperModel with d_model 384, its feature extractor)."""
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperModel

    config = WhisperConfig(
        d_model=384,
        encoder_layers=encoder_layers,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        vocab_size=64,
        num_mel_bins=80,
        max_source_positions=1500,
        max_target_positions=16,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    return WhisperModel(config), WhisperFeatureExtractor(feature_size=80)


def save_tiny_musetalk_models(models_dir: str | Path) -> Path:
    """Randomly initialised stand-ins for MuseTalk's weights, saved in hotplate's own
    layout: musetalk/unet (UNet2DConditionModel 8 -> 4, cross-attention 384),
    sd-vae-ft-mse (AutoencoderKL, 4 latent channels, 256 -> 32) and whisper-tiny
    (WhisperModel, d_model 384, one encoder layer, + WhisperFeatureExtractor)."""
    import torch
    from diffusers import UNet2DConditionModel

    models_dir = Path(models_dir)
    torch.manual_seed(0)
    UNet2DConditionModel(**TINY_UNET).save_pretrained(models_dir / "musetalk" / "unet")
    tiny_sd_vae().save_pretrained(models_dir / "sd-vae-ft-mse")
    whisper, extractor = tiny_whisper()
    whisper.save_pretrained(models_dir / "whisper-tiny")
    extractor.save_pretrained(models_dir / "whisper-tiny")
    return models_dir


def tiny_musetalk_avatar(models_dir: str | Path, n_frames: int = 4) -> tuple[Path, AvatarAssets]:
    """(models_dir with the tiny weights, an avatar of `n_frames` with their VAE latents)."""
    from pipeline.nets.vae import encode_latents, load_vae

    models = save_tiny_musetalk_models(models_dir)
    vae, _ = load_vae(models, "sd-vae-ft-mse")
    latents = encode_latents(vae, np.array(build_assets(n_frames).crops))
    return models, build_assets(n_frames, latents=latents)

"""`musetalk`: MuseTalk's UNet redraws the lower half-face from Whisper audio features.

Weights, all from the models dir (nothing is downloaded):
- `musetalk/unet/`: diffusers UNet2DConditionModel (8 in, 4 out, cross-attention 384);
- `sd-vae-ft-mse/`: the SD VAE (loaded by `pipeline.nets.vae.load_vae`);
- `whisper-tiny/`: transformers WhisperModel + WhisperFeatureExtractor.

Per output frame t (at 25 fps, MuseTalk's rate):

1. audio features: the Whisper encoder's hidden states (50 per second) of the audio,
   encoded in 30 s windows (all the encoder takes) and concatenated; for frame t the
   10 feature frames [2t-4 .. 2t+5] (zeros past either end), each with 5 layers of
   384, flattened time-major to 50 tokens x 384, plus a sinusoidal position encoding;
2. UNet at timestep 0 on the stored 8-channel latents (masked crop, reference crop)
   with the audio tokens as cross-attention context -> 4-channel latent;
3. VAE decode to 256x256, resize into the crop box, blend through the stored mask.

MuseTalk stacks *all* of whisper-tiny's hidden states: the embedding output and its 4
layers make 5. An encoder with a different depth is mapped onto 5 slots: the last 5
states when it has more, states repeated in order (evenly spread) when it has fewer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.assets import AvatarAssets
from pipeline.nets.models import VAE_CONFIG, VAE_WEIGHTS, ModelMissingError
from pipeline.render.renderers.base import blend

UNET_DIR = Path("musetalk") / "unet"
UNET_WEIGHTS = VAE_WEIGHTS  # both are diffusers save_pretrained folders
VAE_NAME = "sd-vae-ft-mse"
WHISPER_DIR = Path("whisper-tiny")
WHISPER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")

SAMPLE_RATE = 16000
FEATURE_RATE = 50  # Whisper encoder frames per second
WINDOW_SECONDS = 30  # Whisper's fixed input length
LAYERS = 5  # hidden-state slots per feature frame
PAD_LEFT, PAD_RIGHT = 2, 2  # video frames of context each side (MuseTalk's padding)
D_MODEL = 384


def _expected_files(models_dir: Path, vae: str) -> list[tuple[Path, tuple[str, ...]]]:
    """(directory, alternatives) for every file the renderer needs; one must exist per row."""
    unet, vae_dir, whisper = models_dir / UNET_DIR, models_dir / vae, models_dir / WHISPER_DIR
    return [
        (unet, (VAE_CONFIG,)),
        (unet, UNET_WEIGHTS),
        (vae_dir, (VAE_CONFIG,)),
        (vae_dir, VAE_WEIGHTS),
        (whisper, ("config.json",)),
        (whisper, WHISPER_WEIGHTS),
        (whisper, ("preprocessor_config.json",)),
    ]


def check_weights(models_dir: str | Path | None, vae: str = VAE_NAME) -> Path:
    """The models dir, if it holds every musetalk file; else ModelMissingError naming them."""
    if models_dir is None:
        raise ModelMissingError(
            f"the musetalk renderer needs a models dir holding {UNET_DIR}/, {vae}/ and "
            f"{WHISPER_DIR}/; set one (--models or HOTPLATE_MODELS) and run `hotplate doctor`"
        )
    models_dir = Path(models_dir).expanduser()
    missing = [
        " or ".join(str(d / n) for n in names)
        for d, names in _expected_files(models_dir, vae)
        if not any((d / n).is_file() for n in names)
    ]
    if missing:
        raise ModelMissingError(
            f"musetalk weights missing: {'; '.join(missing)}; copy them into {models_dir} "
            "and run `hotplate doctor`"
        )
    return models_dir


def positional_encoding(length: int, d_model: int = D_MODEL) -> np.ndarray:
    """(length, d_model) float32 sinusoidal encoding, as MuseTalk's PositionalEncoding."""
    pos = np.arange(length, dtype=np.float64)[:, None]
    div = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
    pe = np.zeros((length, d_model), np.float64)
    pe[:, 0::2] = np.sin(pos * div)
    pe[:, 1::2] = np.cos(pos * div)
    return pe.astype(np.float32)


def layer_slots(n_states: int, slots: int = LAYERS) -> list[int]:
    """Which hidden states fill the `slots`: the last `slots`, or all, repeated in order."""
    if n_states >= slots:
        return list(range(n_states - slots, n_states))
    return [int(i) for i in np.floor(np.arange(slots) * n_states / slots)]


def feature_window(t: int, fps: float) -> tuple[int, int]:
    """[start, stop) of the 50 Hz feature frames for video frame t (10 frames at 25 fps)."""
    per_frame = FEATURE_RATE / fps
    length = 2 * (PAD_LEFT + PAD_RIGHT + 1)
    start = math.floor(t * per_frame) - math.ceil(per_frame) * PAD_LEFT
    return start, start + length


class _WhisperFeatures:
    """Encoder hidden states of the audio, one 30 s window at a time, on demand.

    Output frames are rendered in order, so only the windows around the current
    frame are kept: memory does not grow with the audio length.
    """

    def __init__(
        self, model: Any, extractor: Any, audio: np.ndarray, device: Any, dtype: Any
    ) -> None:
        self.model, self.extractor, self.audio = model, extractor, audio
        self.device, self.dtype = device, dtype
        self.length = math.floor(audio.size / SAMPLE_RATE * FEATURE_RATE)
        self.per_window = WINDOW_SECONDS * FEATURE_RATE
        self._windows: dict[int, Any] = {}

    def _window(self, k: int) -> Any:
        import torch

        if k not in self._windows:
            n = WINDOW_SECONDS * SAMPLE_RATE
            segment = self.audio[k * n : (k + 1) * n]
            mel = self.extractor(
                segment, sampling_rate=SAMPLE_RATE, return_tensors="pt"
            ).input_features
            with torch.inference_mode():
                states = self.model(
                    mel.to(self.device, self.dtype), output_hidden_states=True
                ).hidden_states
            slots = layer_slots(len(states))
            self._windows[k] = torch.stack([states[i][0] for i in slots], dim=1)  # (1500, 5, 384)
        return self._windows[k]

    def frames(self, start: int, stop: int) -> Any:
        """(stop - start, 5, 384) features, zeros outside the audio."""
        import torch

        out = torch.zeros((stop - start, LAYERS, D_MODEL), device=self.device, dtype=self.dtype)
        lo, hi = max(start, 0), min(stop, self.length)
        pos = lo
        while pos < hi:
            k, w0 = pos // self.per_window, pos // self.per_window * self.per_window
            end = min(hi, w0 + self.per_window)
            out[pos - start : end - start] = self._window(k)[pos - w0 : end - w0]
            pos = end
        for k in [k for k in self._windows if (k + 1) * self.per_window <= lo]:
            del self._windows[k]  # frames come in order: earlier windows are done
        return out


class MuseTalkRenderer:
    name = "musetalk"
    fps: float | None = 25.0  # MuseTalk's audio windows are laid out for 25 fps
    sample_rate = SAMPLE_RATE  # Whisper's rate

    def __init__(
        self,
        models_dir: str | Path | None,
        device: str | None = None,
        batch_size: int | None = None,
        vae: str = VAE_NAME,
    ) -> None:
        self.models_dir = check_weights(models_dir, vae)
        self.vae_name = vae
        self._device_name = device
        self.batch_size = batch_size or 8
        self._assets: AvatarAssets | None = None

    # 1. models and audio features
    def prepare(
        self, assets: AvatarAssets, audio: np.ndarray, sr: int, n_out: int, fps: float
    ) -> None:
        import torch

        if assets.latents is None:
            raise ValueError(
                f"avatar {assets.key} has no VAE latents; precompile it with a VAE configured "
                f"(--vae {self.vae_name}) to render with musetalk"
            )
        if assets.latents.ndim != 4 or assets.latents.shape[:2] != (assets.n_frames, 8):
            raise ValueError(
                f"avatar {assets.key} latents have shape {assets.latents.shape}; expected "
                f"({assets.n_frames}, 8, h, w): precompile it again"
            )
        if sr != SAMPLE_RATE:
            raise ValueError(f"musetalk needs audio at {SAMPLE_RATE} Hz, got sr={sr}")
        self.device = torch.device(
            self._device_name or ("cuda" if torch.cuda.is_available() else "cpu")
        )
        # fp16 only where it is fast and safe (CUDA); CPU stays in float32.
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self._load_models()
        self._features = _WhisperFeatures(
            self._whisper, self._extractor, audio, self.device, self.dtype
        )
        window = feature_window(0, fps)
        tokens = (window[1] - window[0]) * LAYERS
        self._pe = torch.from_numpy(positional_encoding(tokens)).to(self.device, self.dtype)
        self._fps = fps
        self._assets = assets

    def _load_models(self) -> None:
        import torch
        from diffusers import UNet2DConditionModel
        from transformers import WhisperFeatureExtractor, WhisperModel

        from pipeline.nets.vae import load_vae

        d = self.models_dir
        # low_cpu_mem_usage=False: without `accelerate` diffusers falls back to it anyway
        # (and says so at length); dtype at load time, so nothing is cast afterwards.
        unet = UNet2DConditionModel.from_pretrained(
            d / UNET_DIR, local_files_only=True, low_cpu_mem_usage=False, torch_dtype=self.dtype
        )
        cfg = unet.config
        if (cfg.in_channels, cfg.out_channels, cfg.cross_attention_dim) != (8, 4, D_MODEL):
            raise ValueError(
                f"{d / UNET_DIR} is not a MuseTalk UNet (needs 8 in, 4 out channels, "
                f"cross-attention {D_MODEL}); replace it"
            )
        whisper = WhisperModel.from_pretrained(
            d / WHISPER_DIR, local_files_only=True, dtype=self.dtype
        )
        whisper = whisper.get_encoder()
        if whisper.config.d_model != D_MODEL:
            raise ValueError(
                f"{d / WHISPER_DIR} has d_model {whisper.config.d_model}, musetalk needs {D_MODEL} (whisper-tiny)"
            )
        self._extractor = WhisperFeatureExtractor.from_pretrained(
            d / WHISPER_DIR, local_files_only=True
        )
        vae, _ = load_vae(d, self.vae_name)
        self._unet = unet.to(self.device).eval()
        self._whisper = whisper.to(self.device).eval()
        if vae.device.type != self.device.type or vae.dtype != self.dtype:
            vae = vae.to(self.device, self.dtype)
        self._vae = vae.eval()
        self._t0 = torch.zeros(1, dtype=torch.long, device=self.device)

    def audio_tokens(self, ts: Sequence[int]) -> Any:
        """(B, 50, 384) cross-attention context for output frames ts (no position encoding)."""
        import torch

        windows = [feature_window(int(t), self._fps) for t in ts]
        return torch.stack([self._features.frames(a, b).reshape(-1, D_MODEL) for a, b in windows])

    # 2-3. UNet, decode, blend
    def render_batch(
        self, ts: Sequence[int], idxs: Sequence[int], frames: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        import torch

        from pipeline.nets.cpu_speed import cached_runner, unet_module
        from pipeline.nets.vae import decode_latents

        if self._assets is None:
            raise RuntimeError("MuseTalkRenderer.render_batch() before prepare()")
        a = self._assets
        with torch.inference_mode():
            context = self.audio_tokens(ts) + self._pe
            lat = torch.from_numpy(np.ascontiguousarray(a.latents[list(idxs)])).to(
                self.device, self.dtype
            )
            example = (lat[:1], self._t0, context[:1])  # cpu_speed's fastest runtime, made once
            unet = cached_runner(self._unet, "unet", lambda: unet_module(self._unet), example)
            pred = unet(lat, self._t0, context)
            faces = decode_latents(self._vae, pred, batch=len(ts))
        return [
            blend(frame, face, a.crop_boxes[i], a.masks[i], a.mask_boxes[i])
            for frame, face, i in zip(frames, faces, idxs, strict=True)
        ]

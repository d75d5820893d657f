"""`musetalk`: MuseTalk's UNet redraws the lower half-face from Whisper audio features.

Weights, all from the models dir (nothing is downloaded), in upstream's `models/` layout
or hotplate's own (see `pipeline.nets.models`):
- the UNet: `musetalkV15/{musetalk.json,unet.pth}` (v1.5), `musetalk/{musetalk.json,
  pytorch_model.bin}` (v1.0), built as upstream does (`UNet2DConditionModel(**json)`, then
  the state dict), or a diffusers folder `musetalk/unet/`;
- the VAE that encoded the avatar's latents (the recipe's `vae`: `sd-vae` upstream);
- `whisper/` (or `whisper-tiny/`): transformers WhisperModel + WhisperFeatureExtractor.

Per output frame t (at 25 fps, MuseTalk's rate):

1. audio features: the Whisper encoder's hidden states (50 per second) of the audio,
   encoded in 30 s windows (all the encoder takes) and concatenated; for frame t the
   10 feature frames [2t-4 .. 2t+5] (zeros past either end), each with 5 layers of
   384, flattened time-major to 50 tokens x 384, plus a sinusoidal position encoding;
2. UNet at timestep 0 on the stored 8-channel latents (masked crop, reference crop)
   with the audio tokens as cross-attention context -> 4-channel latent;
3. VAE decode to 256x256, resize into the crop box, blend through the stored mask.

During silence longer than `silence.min_silence` the mask's weight fades to 0 (the
stored frame, untouched: no mumbling on silence) and back before speech resumes
(`pipeline/render/silence.py`); frames at weight 0 skip the UNet.

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
from pipeline.nets.models import (
    ModelMissingError,
    default_vae,
    unet_files,
    vae_files,
    whisper_dir,
)
from pipeline.render.renderers.base import blend
from pipeline.render.silence import DEFAULT as DEFAULT_SILENCE
from pipeline.render.silence import SilenceParams, speech_weight

SAMPLE_RATE = 16000
FEATURE_RATE = 50  # Whisper encoder frames per second
WINDOW_SECONDS = 30  # Whisper's fixed input length
LAYERS = 5  # hidden-state slots per feature frame
PAD_LEFT, PAD_RIGHT = 2, 2  # video frames of context each side (MuseTalk's padding)
D_MODEL = 384
BATCH_SIZE = 20  # UNet frames per call: upstream's realtime_inference.py default


def check_weights(models_dir: str | Path | None, vae: str | None = None) -> Path:
    """The models dir, if it holds every musetalk file; else ModelMissingError naming
    each missing one. `vae` None: the VAE MuseTalk uses by default (`default_vae`)."""
    if models_dir is None:
        raise ModelMissingError(
            "the musetalk renderer needs a models dir (upstream MuseTalk's `models/` works as "
            "it is); set one (--models or HOTPLATE_MODELS) and run `hotplate doctor`"
        )
    models_dir = Path(models_dir).expanduser()
    missing = []
    for find in (unet_files, whisper_dir, lambda d: vae_files(d, vae or default_vae(d))):
        try:
            find(models_dir)
        except ModelMissingError as e:
            missing.append(str(e).split("; copy")[0])
    if missing:
        raise ModelMissingError(
            f"musetalk weights missing: {'; '.join(missing)}; copy them into {models_dir} "
            "and run `hotplate doctor`"
        )
    return models_dir


def whisper_load_kwargs(dtype: Any, version: str | None = None) -> dict[str, Any]:
    """from_pretrained's dtype keyword for this transformers: `dtype` from 4.56 on,
    `torch_dtype` before (4.40 raises TypeError on `dtype`; 5.x warns on `torch_dtype`)."""
    if version is None:
        import transformers

        version = transformers.__version__
    major, minor = (int(p) for p in version.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def load_unet(models_dir: str | Path, dtype: Any = None) -> tuple[Any, str]:
    """(UNet2DConditionModel in eval mode, version), built the way the files ask:
    upstream's json + state dict (loaded strictly), or a diffusers folder."""
    import json

    import torch
    from diffusers import UNet2DConditionModel

    files = unet_files(models_dir)
    if files.layout == "state_dict":
        try:
            unet = UNet2DConditionModel(**json.loads(files.config.read_text()))
            state = torch.load(files.weights, map_location="cpu", weights_only=True)
            unet.load_state_dict(state)
        except (ValueError, TypeError, RuntimeError, KeyError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(
                f"{files.weights} does not load into the UNet {files.config} describes "
                f"({first}); replace the pair"
            ) from e
    else:
        # low_cpu_mem_usage=False: without `accelerate` diffusers falls back to it anyway
        unet = UNet2DConditionModel.from_pretrained(
            files.config.parent, local_files_only=True, low_cpu_mem_usage=False
        )
    cfg = unet.config
    if (cfg.in_channels, cfg.out_channels, cfg.cross_attention_dim) != (8, 4, D_MODEL):
        raise ValueError(
            f"{files.config} is not a MuseTalk UNet (needs 8 in, 4 out channels, "
            f"cross-attention {D_MODEL}); replace it"
        )
    if dtype is not None and unet.dtype != dtype:  # a no-op cast makes diffusers warn
        unet = unet.to(dtype)
    return unet.eval(), files.version


def positional_encoding(length: int, d_model: int = D_MODEL) -> np.ndarray:
    """(length, d_model) float32 sinusoidal encoding, computed as MuseTalk's
    PositionalEncoding does (float32 torch ops in its order), so that it is bit-identical."""
    import torch

    position = torch.arange(0, length, dtype=torch.float).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.numpy()


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
        vae: str | None = None,
        silence: SilenceParams | None = DEFAULT_SILENCE,
    ) -> None:
        """`silence`: when the mouth rests (None: the UNet draws every frame). `vae`: the directory of the VAE that encoded the avatar's latents (the recipe's);
        None = MuseTalk's default (`sd-vae`, else `sd-vae-ft-mse`). `device`: "cpu",
        "cuda", "cuda:1"...; None = CUDA when there is one. `batch_size`: UNet frames per
        call (default 20, upstream's)."""
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.models_dir = check_weights(models_dir, vae)
        self.vae_name = vae or default_vae(self.models_dir)
        self._device_name = device
        self.batch_size = batch_size or BATCH_SIZE
        self.version = unet_files(self.models_dir).version
        self._assets: AvatarAssets | None = None
        self.silence = silence
        self._speak = np.ones(0, np.float32)
        self._loaded: tuple | None = None  # (device, dtype) the models were loaded for

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
        try:
            self.device = torch.device(
                self._device_name or ("cuda" if torch.cuda.is_available() else "cpu")
            )
        except RuntimeError as e:
            raise ValueError(f"--device {self._device_name!r}: {e}; use cpu or cuda") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self._device_name}: this machine has no CUDA; use cpu")
        # fp16 where it is fast and safe (CUDA, as upstream's realtime script); CPU float32.
        self.dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        if self._loaded != (self.device, self.dtype):
            # once: prepared per fragment (live) or per frame (a conversation), reloading
            # cost 0.34 s a call, and the new UNet its OpenVINO compile (0.49 s) each time
            self._load_models()
            self._loaded = (self.device, self.dtype)
        self._features = _WhisperFeatures(
            self._whisper, self._extractor, audio, self.device, self.dtype
        )
        window = feature_window(0, fps)
        tokens = (window[1] - window[0]) * LAYERS
        self._pe = torch.from_numpy(positional_encoding(tokens)).to(self.device, self.dtype)
        self._fps = fps
        self._assets = assets
        self._speak = np.ones(n_out, np.float32)
        if self.silence is not None:
            w = speech_weight(audio, sr, fps, self.silence)[:n_out]
            self._speak[: w.size] = w

    def _load_models(self) -> None:
        import torch
        from transformers import WhisperFeatureExtractor, WhisperModel

        from pipeline.nets.vae import load_vae

        unet, _ = load_unet(self.models_dir, self.dtype)
        wdir = whisper_dir(self.models_dir)
        whisper = WhisperModel.from_pretrained(
            wdir, local_files_only=True, **whisper_load_kwargs(self.dtype)
        ).get_encoder()
        if whisper.config.d_model != D_MODEL:
            raise ValueError(
                f"{wdir} has d_model {whisper.config.d_model}, musetalk needs {D_MODEL} (whisper-tiny)"
            )
        self._extractor = WhisperFeatureExtractor.from_pretrained(wdir, local_files_only=True)
        vae, _ = load_vae(self.models_dir, self.vae_name)
        self._unet = unet.to(self.device).eval()
        self._whisper = whisper.to(self.device, self.dtype).eval()
        if vae.dtype != self.dtype:
            vae = vae.to(dtype=self.dtype)
        self._vae = vae.to(self.device).eval()
        self._t0 = torch.zeros(1, dtype=torch.long, device=self.device)

    def audio_tokens(self, ts: Sequence[int]) -> Any:
        """(B, 50, 384) cross-attention context for output frames ts (no position encoding)."""
        import torch

        windows = [feature_window(int(t), self._fps) for t in ts]
        return torch.stack([self._features.frames(a, b).reshape(-1, D_MODEL) for a, b in windows])

    # 2-3. UNet, decode, blend
    def faces(self, ts: Sequence[int], idxs: Sequence[int]) -> np.ndarray:
        """(B, 256, 256, 3) uint8 RGB mouths for output frames ts over stored frames idxs:
        UNet at timestep 0 on the stored latents with the audio tokens, then VAE decode."""
        import torch

        from pipeline.nets.cpu_speed import cached_runner, unet_module
        from pipeline.nets.vae import decode_latents

        if self._assets is None:
            raise RuntimeError("MuseTalkRenderer.faces() before prepare()")
        with torch.inference_mode():
            context = self.audio_tokens(ts) + self._pe
            lat = torch.from_numpy(np.ascontiguousarray(self._assets.latents[list(idxs)])).to(
                self.device, self.dtype
            )
            example = (lat[:1], self._t0, context[:1])  # cpu_speed's fastest runtime, made once
            unet = cached_runner(self._unet, "unet", lambda: unet_module(self._unet), example)
            pred = unet(lat, self._t0, context)
            return decode_latents(self._vae, pred, batch=len(ts))

    def render_batch(
        self, ts: Sequence[int], idxs: Sequence[int], frames: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        a = self._assets
        w = [float(self._speak[t]) if t < self._speak.size else 1.0 for t in ts]
        talk = [k for k, wk in enumerate(w) if wk > 0.0]
        out = [frame.copy() for frame in frames]  # resting frames: the stored frame
        if not talk:
            return out
        faces = self.faces([ts[k] for k in talk], [idxs[k] for k in talk])
        for k, face in zip(talk, faces, strict=True):
            i = idxs[k]
            mask = a.masks[i] if w[k] >= 1.0 else (a.masks[i] * w[k] + 0.5).astype(np.uint8)
            out[k] = paste_face(frames[k], face, a.crop_boxes[i], mask, a.mask_boxes[i])
        return out


def paste_face(
    frame: np.ndarray,
    face: np.ndarray,
    crop_box: Sequence[int],
    mask: np.ndarray,
    mask_box: Sequence[int],
) -> np.ndarray:
    """The frame with the 256x256 `face` resized into `crop_box` and blended through the
    mask, as upstream's realtime script: cv2.resize's default (bilinear) to the box, then
    the blend square's mask."""
    import cv2

    x1, y1, x2, y2 = (int(v) for v in crop_box)
    if x2 > x1 and y2 > y1 and face.shape[:2] != (y2 - y1, x2 - x1):
        face = cv2.resize(face, (x2 - x1, y2 - y1), interpolation=cv2.INTER_LINEAR)
    return blend(frame, face, crop_box, mask, mask_box)

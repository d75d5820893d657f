"""The mouth bank: a presenter's own mouths, from footage of them talking.

Built at precompile (`build_bank`, the `bank` stage) from a clip in which the presenter
speaks: for every frame with a face, the mouth crop aligned to the canonical frame
(`pipeline.mouth.lips`), its shape (opening, width, height), its lip points there, and
the log-mel features of that frame's audio, from the clip's own audio track. A ridge
model from a window of features to the shape is fitted on those pairs, so a render can
predict the presenter's mouth for new speech. Read at render as a `MouthBank`.

The crop covers the mouth, the chin and the room a dropped jaw needs (CROP, canonical
units), at SCALE pixels per inter-ocular distance, stored as JPEG (the frame codec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from pipeline.mouth.features import CONTEXT, log_mel, stack
from pipeline.mouth.lips import LIPS, apply, mouth_shape, to_canonical

VERSION = 1
SCALE = 112.0  # crop pixels per inter-ocular distance
CROP = (-0.85, 0.55, 0.85, 2.05)  # canonical x1, y1, x2, y2: mouth, chin, a dropped jaw
FEATURE_RATE = 16000  # Hz the clip's audio is analysed at
MIN_SPEECH = 0.2  # share of the frames that must be speech for the clip to talk
MIN_ENTRIES = 25  # frames with a face (one second): fewer make no bank
RIDGE = 1.0  # ridge penalty, per standardised feature
GATE_DB = -50.0  # dBFS: quieter is no speech
SPEECH_DB = 30.0  # dB below the clip's speech level that still counts as speech


def crop_size() -> tuple[int, int]:
    """(width, height) of a bank crop in pixels."""
    x1, y1, x2, y2 = CROP
    return int(round((x2 - x1) * SCALE)), int(round((y2 - y1) * SCALE))


def crop_from_frame(m: np.ndarray) -> np.ndarray:
    """(2, 3) frame pixels -> crop pixels, for a face whose canonical map is `m`."""
    x1, y1 = CROP[0], CROP[1]
    out = m * SCALE
    out[:, 2] -= np.array([x1 * SCALE, y1 * SCALE])
    return out


def speech_frames(samples: np.ndarray, sr: int, fps: float, n: int) -> np.ndarray:
    """(n,) bool: frames louder than the gate and within SPEECH_DB of the speech level
    (`silence.quiet_frames`' measure, with the bank's thresholds)."""
    from pipeline.render.silence import SilenceParams, quiet_frames

    quiet = quiet_frames(samples, sr, fps, SilenceParams(silence_db=SPEECH_DB, gate_db=GATE_DB))
    speech = ~quiet[:n]
    return np.concatenate([speech, np.zeros(n - speech.size, bool)])


def normalise(feats: np.ndarray, speech: np.ndarray) -> np.ndarray:
    """Features less their mean over the speech frames (a recording's level and
    microphone move every band alike; a mean taken over speech removes that)."""
    if speech.any():
        return feats - feats[speech].mean(0, keepdims=True)
    return feats - feats.mean(0, keepdims=True) if feats.size else feats


@dataclass
class BankBuild:
    arrays: dict[str, np.ndarray]
    meta: dict


def empty_bank(reason: str, **meta: object) -> BankBuild:
    """A bank with no entries: the clip does not talk (or has no face). Stored all the
    same, so the question is not asked again for the same clip and recipe."""
    arrays = {
        "shapes": np.zeros((0, 3), np.float32),
        "lips": np.zeros((0, len(LIPS), 2), np.float32),
        "frame_index": np.zeros(0, np.int32),
    }
    return BankBuild(arrays, {"entries": 0, "reason": reason, **meta})


def build_bank(
    n_frames: int,
    frames: Iterable[np.ndarray],
    landmarks: np.ndarray,
    audio: np.ndarray | None,
    fps: float,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> BankBuild:
    """The bank of a clip of `n_frames` (`frames` yields them in order; read only when
    the clip talks), its landmarks (N, 68, 2) and its audio (float32 mono at
    FEATURE_RATE, None when it has none).

    Crops are JPEG-encoded as the frames are read. Returns the stage's arrays and meta;
    a clip without enough speech gives an empty bank."""
    import cv2

    from pipeline.media import encode_frame

    # 1. which frames speak, from the clip's own audio
    if audio is None or audio.size == 0:
        return empty_bank("the clip has no audio track", speech_share=0.0)
    speech = speech_frames(audio, FEATURE_RATE, fps, n_frames)
    share = float(speech.mean()) if n_frames else 0.0
    if share < MIN_SPEECH:
        return empty_bank(
            f"only {share:.0%} of its frames are speech (a talking clip has >= {MIN_SPEECH:.0%})",
            speech_share=share,
        )
    feats = normalise(log_mel(audio, FEATURE_RATE, fps, n_frames), speech)

    # 2. every frame with a face: its crop in the canonical frame, shape and lips there
    faces = [i for i in range(n_frames) if np.isfinite(landmarks[i]).all()]
    if len(faces) < MIN_ENTRIES:
        return empty_bank(f"a face in only {len(faces)} frames", speech_share=share)
    w, h = crop_size()
    arrays: dict[str, np.ndarray] = {}
    shapes = np.zeros((len(faces), 3), np.float32)
    lips = np.zeros((len(faces), len(LIPS), 2), np.float32)
    entry = {i: k for k, i in enumerate(faces)}
    for i, image in enumerate(frames):
        if i >= n_frames:
            break
        if i not in entry:
            continue
        k = entry[i]
        m = to_canonical(landmarks[i])
        crop = cv2.warpAffine(
            image,
            crop_from_frame(m),
            (w, h),
            flags=cv2.INTER_AREA,
            borderMode=cv2.BORDER_REPLICATE,
        )
        # the crops keep the codec the bank stage was made with (full chroma)
        arrays[f"crop/{k:06d}"] = np.frombuffer(encode_frame(crop, "jpeg-q95-444"), np.uint8)
        shapes[k] = mouth_shape(landmarks[i], m)
        lips[k] = apply(m, landmarks[i][list(LIPS)])
        progress(k + 1, len(faces))

    # 3. the presenter's own audio -> mouth model: ridge over a window of features
    index = np.asarray(faces, np.int32)
    model, scores = fit_ridge(stack(feats)[index], shapes)
    arrays.update(
        shapes=shapes,
        lips=lips,
        frame_index=index,
        speech=speech[index],
        feats=feats[index].astype(np.float32),
        **model,
    )
    meta = {
        "entries": len(faces),
        "speech_share": share,
        "fit_r": scores,
        "scale": SCALE,
        "crop": list(CROP),
        "context": list(CONTEXT),
        "fps": fps,
    }
    return BankBuild(arrays, meta)


def fit_ridge(x: np.ndarray, y: np.ndarray, penalty: float = RIDGE) -> tuple[dict, list[float]]:
    """Ridge regression y ~ x on standardised x; (the model's arrays, the in-sample
    correlation of each output)."""
    mean, std = x.mean(0), x.std(0) + 1e-3
    z = (x - mean) / std
    z1 = np.concatenate([z, np.ones((len(z), 1), np.float32)], axis=1).astype(np.float64)
    reg = penalty * np.eye(z1.shape[1])
    reg[-1, -1] = 0.0  # the bias is not penalised
    w = np.linalg.solve(z1.T @ z1 + reg, z1.T @ y.astype(np.float64))
    pred = z1 @ w
    scores = [
        float(np.corrcoef(pred[:, k], y[:, k])[0, 1]) if y[:, k].std() > 1e-9 else 0.0
        for k in range(y.shape[1])
    ]
    model = {
        "model_w": w.astype(np.float32),
        "model_mean": mean.astype(np.float32),
        "model_std": std.astype(np.float32),
    }
    return model, scores


@dataclass
class MouthBank:
    """A bank read back from the store: what a render draws mouths from."""

    key: str
    shapes: np.ndarray  # (N, 3) opening, width, height (canonical units)
    lips: np.ndarray  # (N, 20, 2) lip points 48-67, canonical
    frame_index: np.ndarray  # (N,) the clip frame each entry was taken from
    model_w: np.ndarray  # (D + 1, 3) ridge weights over stacked features
    model_mean: np.ndarray  # (D,)
    model_std: np.ndarray  # (D,)
    crop_jpeg: list[np.ndarray]  # (N,) JPEG bytes of each aligned crop
    fps: float
    _decoded: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return int(self.shapes.shape[0])

    @classmethod
    def from_arrays(cls, key: str, arrays: dict[str, np.ndarray], meta: dict) -> MouthBank | None:
        """The bank of a stage's arrays, or None when it has no entries."""
        if int(meta.get("entries", 0)) == 0:
            return None
        names = sorted(k for k in arrays if k.startswith("crop/"))
        return cls(
            key=key,
            shapes=arrays["shapes"],
            lips=arrays["lips"],
            frame_index=arrays["frame_index"],
            model_w=arrays["model_w"],
            model_mean=arrays["model_mean"],
            model_std=arrays["model_std"],
            crop_jpeg=[arrays[k] for k in names],
            fps=float(meta.get("fps", 25.0)),
        )

    def crop(self, j: int) -> np.ndarray:
        """Entry j's aligned crop, RGB uint8, decoded once and kept (a bank of 60 s at
        25 fps decodes to 70 MB; a render shows far fewer entries than that)."""
        got = self._decoded.get(j)
        if got is None:
            from pipeline.media import decode_frame

            got = self._decoded[j] = decode_frame(self.crop_jpeg[j])
            got.flags.writeable = False
        return got

    def predict(self, samples: np.ndarray, sr: int, fps: float, n_frames: int) -> np.ndarray:
        """(n_frames, 3) the shapes the presenter's mouth takes for `samples` (mono at
        `sr`), by the model fitted on their own footage. The features are read at `sr`
        itself: a rate changes the log-mel of every band by one constant (the window's
        length), which `normalise` removes, as it removes the recording's level."""
        speech = speech_frames(samples, sr, fps, n_frames)
        feats = normalise(log_mel(samples, sr, fps, n_frames), speech)
        z = (stack(feats) - self.model_mean) / self.model_std
        pred = np.concatenate([z, np.ones((len(z), 1), np.float32)], axis=1) @ self.model_w
        lo, hi = self.shapes.min(0), self.shapes.max(0)
        return np.clip(pred, lo, hi).astype(np.float32)

    def rest_shape(self) -> np.ndarray:
        """(3,) the presenter's closed mouth: the median shape of the least open tenth."""
        opening = self.shapes[:, 0]
        closed = self.shapes[opening <= np.quantile(opening, 0.1)]
        return np.median(closed, axis=0).astype(np.float32)

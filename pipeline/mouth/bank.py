"""The mouth bank: a presenter's own mouths, from footage of them talking.

Built at precompile (`build_bank`, the `bank` stage) from any clip in which the presenter
speaks, with or without sound: for every frame with a face, the mouth crop aligned to the
canonical frame (`pipeline.mouth.lips`), its shape (opening, width, height: the face
mesh's, so no audio is needed) and its lip and lower jaw points there. A clip talks when its sound is
speech or, without speech to hear, when its mouth moves (the openings span as much as the
still stage's talking loop, `precompile.still.QUIET_SPREAD`). Where the sound is speech,
the log-mel features of each frame's audio are kept too, and a linear model from a window
of features to the shape is fitted on those pairs (`fit_model`), so a render can predict
the presenter's mouth for new speech; how much of the opening a render takes from the
drive's cue instead is chosen on the same pairs. Without speech there is no model: a
render asks the bank for the shape the drive (or, later, the ear) gives, on the
presenter's own range (`render/mouth/from_bank.py`). Read at render as a `MouthBank`.

The crop covers the mouth, the chin and the room a dropped jaw needs (CROP, canonical
units), at SCALE pixels per inter-ocular distance, stored as JPEG (the frame codec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from pipeline.mouth.features import MEL_CONTEXT, MFCC_CONTEXT, N_MFCC, log_mel, windowed
from pipeline.mouth.lips import LIPS, apply, mouth_shape, to_canonical

if TYPE_CHECKING:
    from pipeline.render.mouth.drive import Drive

VERSION = 6  # 2: the windowed cepstrum and log-mel model, its penalties and drive share by CV;
# 3: the drive's cue (loudness or phones) chosen by CV beside its share; 4: a clip whose
# mouth moves is a bank without sound (its frames alone), the model only where it speaks;
# 5: footage whose sound sits off its pictures is aligned before the model is fitted;
# 6: its record says the footage's range of openings (`opening_range`)
SCALE = 112.0  # crop pixels per inter-ocular distance
CROP = (-0.85, 0.55, 0.85, 2.05)  # canonical x1, y1, x2, y2: mouth, chin, a dropped jaw
FEATURE_RATE = 16000  # Hz the clip's audio is analysed at
MIN_SPEECH = 0.2  # share of the frames that must be speech for the clip to talk
MIN_ENTRIES = 25  # frames with a face (one second): fewer make no bank
PENALTIES = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)  # ridge penalties cross-validated
FOLDS = 5  # contiguous blocks of the clip, each predicted by a model fitted on the rest
FOLD_GAP = 4  # frames left out either side of a block (the window reaches 4 frames)
DRIVE_SHARES = (0.0, 0.25, 0.5, 0.75)  # of the opening taken from the drive's cue
CUES = ("loudness", "phones")  # what the drive's opening is read from (`cue_opening`)
LIVE_AHEAD = 1  # frames ahead a live render sees: it gets a model that reads no further
MAX_GAIN = 3.0  # the most the model's opening is stretched (`opening_gain`)
JAW_UNDER = tuple(range(4, 13))  # the jaw line under the mouth: it moves as the mouth opens
SMOOTH = 1.0  # frames: the predicted trajectory's Gaussian smoothing (sigma)
GATE_DB = -50.0  # dBFS: quieter is no speech
SPEECH_DB = 30.0  # dB below the clip's speech level that still counts as speech
# How far a footage's sound may sit from its pictures (`sound_offset`), in frames either
# way (8 at 25 fps: 320 ms) ...
SYNC_LAGS = range(-8, 9)
SYNC_MIN_R = 0.3  # ... the ear must follow the mouth this well at the lag it finds ...
SYNC_GAIN = 0.1  # ... and this much better than in sync, to be believed ...
SYNC_ACT = 2  # ... and an offset under 2 frames (80 ms at 25 fps) is left: sound
# late by 40 ms is below what viewers notice (ITU-R BT.1359: from 125 ms late) ...
SYNC_MIN_SECONDS = 8.0  # ... and shorter footage is fitted as shot: on GRID's talker
# (the ear's own), windows of 2.4 s read a sound made 3 frames late as 4 early in 2 of
# 24 and off by 1-3 frames in 5 more, windows of 4.8 s within a frame in all 23 (none
# found an offset in the footage as shot); on HDTF's katie_hill, whom the ear hardly
# knows, 2.4 s read her sound 4 frames early where 4.8 s found nothing it believed


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


def sound_offset(
    audio: np.ndarray, fps: float, n_frames: int, index: np.ndarray, opening: np.ndarray
) -> dict:
    """How many frames the footage's sound comes after its pictures ("late"; negative:
    before), read by the ear (`pipeline/mouth/ear.py`, trained on footage in sync)
    against the mouth's opening on the frames with a face (`index`,
    `opening`): the lag in SYNC_LAGS at which the ear's opening, heard whole, follows
    the mouth best. A bank fitted on footage whose sound is late would move every
    render's mouth that much ahead of its speech, and its own cross-validation cannot
    see it (both sides carry the offset). 0 unless the ear is believed (SYNC_MIN_R,
    SYNC_GAIN) and the offset is SYNC_ACT frames or more, and 0 on footage shorter than
    SYNC_MIN_SECONDS; "r_late" and "r_sync": the ear's r at the lag found and in sync."""
    from pipeline.mouth.ear import load

    if index.size < SYNC_MIN_SECONDS * fps:
        return {"late": 0, "why": f"under {SYNC_MIN_SECONDS:g} s of footage with a face"}
    try:
        heard = load().predict(audio, FEATURE_RATE, fps, n_frames)[:, 0]
    except FileNotFoundError as exc:  # the ear's weights gone: fit as shot
        return {"late": 0, "r_late": 0.0, "r_sync": 0.0, "why": str(exc)}
    mouth = np.full(n_frames, np.nan)
    mouth[index] = opening

    def r_at(late: int) -> float:  # frame t's mouth against what is heard at t + late
        a = mouth[max(0, -late) : n_frames - max(0, late)]
        b = heard[max(0, late) : n_frames - max(0, -late)]
        ok = np.isfinite(a)
        return correlation(a[ok], b[ok]) if ok.sum() >= MIN_ENTRIES else 0.0

    r = {late: r_at(late) for late in SYNC_LAGS}
    best = max(r, key=r.get)
    believed = r[best] >= SYNC_MIN_R and r[best] - r[0] >= SYNC_GAIN
    late = best if believed and abs(best) >= SYNC_ACT else 0
    return {"late": late, "r_late": r[best], "r_sync": r[0], "found": best}


def aligned(audio: np.ndarray, late: int, fps: float) -> np.ndarray:
    """`audio` moved `late` frames earlier (its start cut, silence after its end; a
    negative `late` the other way), the same length: each frame's sound under it."""
    shift = int(round(late * FEATURE_RATE / fps))
    if shift == 0:
        return audio
    pad = np.zeros(abs(shift), audio.dtype)
    if shift > 0:
        return np.concatenate([audio[shift:], pad])[: audio.size]
    return np.concatenate([pad, audio[:shift]])


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
        "jaw": np.zeros((0, len(JAW_UNDER), 2), np.float32),
        "frame_index": np.zeros(0, np.int32),
    }
    return BankBuild(arrays, {"entries": 0, "reason": reason, **meta})


def opening_range(shapes: np.ndarray) -> list[float]:
    """[min, max] of a bank's openings (`lips.mouth_shape`'s: the inner lips' gap in
    canonical units, one unit the inter-ocular distance): how far the footage's mouth
    opens, and so how far the bank's own mouths can show; a render opens further than
    the max where speech asks for more (`render/mouth/from_bank.py`)."""
    if shapes.shape[0] == 0:
        return [0.0, 0.0]
    return [round(float(shapes[:, 0].min()), 4), round(float(shapes[:, 0].max()), 4)]


def mouth_spread(landmarks: np.ndarray) -> float:
    """How far a clip's mouth moves: its openings' 10th to 90th percentile span, in
    canonical units (the still stage's measure, `precompile.still.rest_pose`); 0 when
    no frame has a face."""
    from pipeline.precompile.still import rest_pose

    rest = rest_pose(landmarks)
    return 0.0 if rest is None else round(float(rest.spread), 4)


def talks(spread: float, speech_share: float) -> bool:
    """Whether a clip is talking footage, a bank of mouths: its sound is speech (at least
    MIN_SPEECH of its frames), or, with no speech to hear, its mouth moves as a talking
    loop's does (`mouth_spread` at least the still stage's QUIET_SPREAD)."""
    from pipeline.precompile.still import QUIET_SPREAD

    return speech_share >= MIN_SPEECH or spread >= QUIET_SPREAD


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
    FEATURE_RATE, None when it has none or it cannot be read).

    Crops are JPEG-encoded as the frames are read. Returns the stage's arrays and meta;
    a clip that does not talk (no speech, and a mouth that hardly moves) or shows too
    few faces gives an empty bank."""
    import cv2

    from pipeline.media import encode_frame
    from pipeline.precompile.still import QUIET_SPREAD

    # 1. does it talk (`talks`): its sound is speech, or its mouth moves as a talker's
    speech = np.zeros(n_frames, bool)
    if audio is not None and audio.size:
        speech = speech_frames(audio, FEATURE_RATE, fps, n_frames)
    share = float(speech.mean()) if n_frames else 0.0
    heard = share >= MIN_SPEECH
    spread = mouth_spread(landmarks[:n_frames])
    if not talks(spread, share):
        sound = (
            "no sound"
            if audio is None or audio.size == 0
            else f"{share:.0%} of its frames speech (a talking clip has >= {MIN_SPEECH:.0%})"
        )
        return empty_bank(
            f"its mouth hardly moves (openings span {spread:.3f}, a talking loop's >= "
            f"{QUIET_SPREAD}) and it has {sound}",
            speech_share=share,
            spread=spread,
        )

    # 2. every frame with a face: its crop in the canonical frame, shape and lips there
    faces = [i for i in range(n_frames) if np.isfinite(landmarks[i]).all()]
    if len(faces) < MIN_ENTRIES:
        return empty_bank(f"a face in only {len(faces)} frames", speech_share=share)
    w, h = crop_size()
    arrays: dict[str, np.ndarray] = {}
    shapes = np.zeros((len(faces), 3), np.float32)
    lips = np.zeros((len(faces), len(LIPS), 2), np.float32)
    jaw = np.zeros((len(faces), len(JAW_UNDER), 2), np.float32)
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
        jaw[k] = apply(m, landmarks[i][list(JAW_UNDER)])
        progress(k + 1, len(faces))
    index = np.asarray(faces, np.int32)
    arrays.update(shapes=shapes, lips=lips, jaw=jaw, frame_index=index)
    meta = {
        "entries": len(faces),
        "opening_range": opening_range(shapes),
        "speech_share": share,
        "spread": spread,
        "scale": SCALE,
        "crop": list(CROP),
        "fps": fps,
    }
    if not heard:  # footage without speech: its shapes alone, the drive asks for them
        return BankBuild(arrays, {**meta, "model": False, "drive_cue": "drive"})

    # 3. the presenter's own audio -> mouth model, and the drive cue's share, on the
    # footage's sound aligned to its pictures where it sits off them
    sync = sound_offset(audio, fps, n_frames, index, shapes[:, 0])
    if sync["late"]:
        audio = aligned(audio, sync["late"], fps)
        speech = speech_frames(audio, FEATURE_RATE, fps, n_frames)
    feats = normalise(log_mel(audio, FEATURE_RATE, fps, n_frames), speech)
    model, scores = fit_model(windowed(feats)[index], shapes)
    live, live_scores = fit_model(windowed(feats, LIVE_AHEAD)[index], shapes)
    model.update({f"live_{k}": v for k, v in live.items()})
    live_scores.pop("cv_opening")
    cv_opening = scores.pop("cv_opening")
    gain = opening_gain(cv_opening, shapes)
    drive = drive_share(cv_opening, shapes, audio, fps, n_frames, index)
    arrays.update(speech=speech[index], feats=feats[index].astype(np.float32), **model)
    meta |= {
        "model": True,
        **scores,
        "live_cv_r": live_scores["cv_r"],
        "drive_share": drive["share"],
        "drive_cue": drive["cue"],
        "opening_gain": gain,
        "drive_cv_r": drive["r"],
        "sound_late": {**sync, "ms": round(1000.0 * sync["late"] / fps)},
        "context": {"mfcc": list(MFCC_CONTEXT), "n_mfcc": N_MFCC, "mel": list(MEL_CONTEXT)},
    }
    return BankBuild(arrays, meta)


def smooth(x: np.ndarray, sigma: float = SMOOTH) -> np.ndarray:
    """(T, ...) each frame a Gaussian-weighted mean of its neighbours within 3 sigma
    (edges held): a mouth does not jump between frames as a per-frame estimate does."""
    n = x.shape[0]
    if n == 0 or sigma <= 0:
        return x
    reach = int(np.ceil(3 * sigma))
    ks = np.arange(-reach, reach + 1)
    w = np.exp(-0.5 * (ks / sigma) ** 2)
    w /= w.sum()
    t = np.arange(n)
    return sum(wk * x[np.clip(t + k, 0, n - 1)] for k, wk in zip(ks, w, strict=True))


def ridge(z1: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """(D + 1, K) ridge weights for standardised features with a bias column last (the
    bias is not penalised)."""
    reg = penalty * np.eye(z1.shape[1])
    reg[-1, -1] = 0.0
    return np.linalg.solve(z1.T @ z1 + reg, z1.T @ y)


def folds(n: int) -> list[tuple[np.ndarray, slice]]:
    """(training rows, held-out block) per fold: FOLDS contiguous blocks, FOLD_GAP frames
    either side of each left out of its training rows (neighbours share their windows)."""
    edges = np.linspace(0, n, FOLDS + 1).astype(int)
    return [
        (np.r_[0 : max(0, a - FOLD_GAP), min(n, b + FOLD_GAP) : n], slice(a, b))
        for a, b in zip(edges[:-1], edges[1:], strict=True)
        if b > a
    ]


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1]) if a.std() > 1e-9 and b.std() > 1e-9 else 0.0


def fit_model(x: np.ndarray, y: np.ndarray) -> tuple[dict, dict]:
    """A linear model y ~ x on standardised x: the mean of two ridge regressions, one on
    the windowed cepstrum and one on the windowed log-mel (`features.windowed`'s two
    parts), each with the penalty whose cross-validated opening (smoothed as a render
    smooths it) follows the clip's best. The mean of two linear models is one, stored
    as one. Returns (the model's arrays, its figures: each output's in-sample r, the
    opening's cross-validated r and, as "cv_opening", its cross-validated prediction)."""
    n = len(x)
    mean, std = x.mean(0), x.std(0) + 1e-3
    z = ((x - mean) / std).astype(np.float64)
    yy = y.astype(np.float64)
    split = N_MFCC * len(MFCC_CONTEXT)
    parts = (slice(0, split), slice(split, x.shape[1]))
    w = np.zeros((x.shape[1] + 1, y.shape[1]))
    cv = np.zeros(n)
    penalties = []
    for part in parts:
        z1 = np.concatenate([z[:, part], np.ones((n, 1))], axis=1)
        best = None
        for penalty in PENALTIES:
            pred = np.zeros(n)
            for rows, block in folds(n):
                pred[block] = (z1[block] @ ridge(z1[rows], yy[rows, :1], penalty))[:, 0]
            r = correlation(smooth(pred), yy[:, 0])
            if best is None or r > best[0]:
                best = (r, penalty, pred)
        _, penalty, pred = best
        penalties.append(penalty)
        cv += pred / len(parts)
        wp = ridge(z1, yy, penalty) / len(parts)
        w[part] += wp[:-1]
        w[-1] += wp[-1]
    cv = smooth(cv)
    fitted = smooth(np.concatenate([z, np.ones((n, 1))], axis=1) @ w)
    scores = {
        "fit_r": [correlation(fitted[:, k], yy[:, k]) for k in range(y.shape[1])],
        "cv_r": correlation(cv, yy[:, 0]),
        "penalties": penalties,
        "cv_opening": cv,
    }
    model = {
        "model_w": w.astype(np.float32),
        "model_mean": mean.astype(np.float32),
        "model_std": std.astype(np.float32),
    }
    return model, scores


def opening_gain(cv_opening: np.ndarray, shapes: np.ndarray) -> float:
    """How far to stretch the model's opening about the clip's mean so that on speech it
    never heard it spans what the presenter's mouth spans: a ridge shrinks what it is
    unsure of towards the mean, and a bank search on a target that hardly moves shows
    mouths that hardly differ (the referee then sees noise, not speech). The ratio of
    the clip's spread to the cross-validated prediction's, within MAX_GAIN."""
    spread = float(np.std(cv_opening))
    if spread < 1e-9:
        return 1.0
    return float(np.clip(np.std(shapes[:, 0]) / spread, 1.0, MAX_GAIN))


def cue_opening(
    cue: str, audio: np.ndarray, sr: int, fps: float, n_frames: int, drive: Drive | None = None
) -> np.ndarray:
    """(n_frames,) in [0, 1]: the opening the drive's `cue` reads from `audio`:
    "loudness", the loudness drive's (`render/mouth/drive.py`), or "phones", the
    recognised phones' (`visemes.phone_opening`); from a render's `drive` of the same
    audio where it has them (so nothing is heard twice)."""
    from pipeline.render.mouth.drive import mouth_drive

    if cue == "phones":
        from pipeline.mouth.visemes import phone_opening

        if drive is not None and drive.phones is not None:
            drive.ready()
            return drive.phones.heard
        return phone_opening(audio, sr, fps, n_frames)
    if drive is not None:
        return drive.by_loudness
    return mouth_drive(audio, sr, fps, n_frames).open


def drive_share(
    cv_opening: np.ndarray,
    shapes: np.ndarray,
    audio: np.ndarray,
    fps: float,
    n_frames: int,
    index: np.ndarray,
) -> dict:
    """The cue and share of the target opening a render takes from the drive
    (`render/mouth/from_bank.py`): the pair of CUES and DRIVE_SHARES whose blend of the
    cue's opening (on the clip's own audio, mapped onto the presenter's range as a render
    maps it) and the model's cross-validated opening follows the clip's opening best. On
    real footage loudness barely predicts the lips (r under 0.2 on six clips) and the
    phones a little more; on a clip whose mouth loudness itself opened, loudness is most
    of the answer."""
    opening = shapes[:, 0].astype(np.float64)
    rest = rest_shape(shapes)[0]
    wide = float(np.quantile(opening, 0.95))
    best = {"cue": CUES[0], "share": 0.0, "r": correlation(cv_opening, opening)}
    for cue in CUES:
        cued = cue_opening(cue, audio, FEATURE_RATE, fps, n_frames)[index]
        mapped = rest + cued * max(wide - rest, 0)
        for s in DRIVE_SHARES[1:]:
            r = correlation(s * mapped + (1.0 - s) * cv_opening, opening)
            if r > best["r"]:
                best = {"cue": cue, "share": s, "r": r}
    return best


def rest_shape(shapes: np.ndarray) -> np.ndarray:
    """(3,) a presenter's closed mouth: the median shape of the least open tenth."""
    opening = shapes[:, 0]
    closed = shapes[opening <= np.quantile(opening, 0.1)]
    return np.median(closed, axis=0).astype(np.float32)


@dataclass
class MouthBank:
    """A bank read back from the store: what a render draws mouths from. A bank of
    footage without speech has no model (`has_model` False): a render gives it the
    shapes the drive asks for (`render/mouth/from_bank.py::asked_shapes`)."""

    key: str
    shapes: np.ndarray  # (N, 3) opening, width, height (canonical units)
    lips: np.ndarray  # (N, 20, 2) lip points 48-67, canonical
    frame_index: np.ndarray  # (N,) the clip frame each entry was taken from
    model_w: np.ndarray | None  # (D + 1, 3) linear weights over the windowed features
    model_mean: np.ndarray | None  # (D,)
    model_std: np.ndarray | None  # (D,)
    live_model: tuple[np.ndarray, np.ndarray, np.ndarray] | None  # reading LIVE_AHEAD ahead
    crop_jpeg: list[np.ndarray]  # (N,) JPEG bytes of each aligned crop
    fps: float
    drive_share: float  # of the target opening a render takes from the drive's cue
    drive_cue: str = "loudness"  # which (`cue_opening`); "drive": no model, the drive's alone
    opening_gain: float = 1.0  # the stretch of the model's opening (`opening_gain`)
    jaw: np.ndarray | None = None  # (N, 9, 2) jaw points 4-12 (JAW_UNDER), canonical
    _decoded: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def size(self) -> int:
        return int(self.shapes.shape[0])

    @property
    def has_model(self) -> bool:
        """Whether the bank predicts shapes from audio (its footage's sound was speech)."""
        return self.model_w is not None

    @classmethod
    def from_arrays(cls, key: str, arrays: dict[str, np.ndarray], meta: dict) -> MouthBank | None:
        """The bank of a stage's arrays, or None when it has no entries."""
        if int(meta.get("entries", 0)) == 0:
            return None
        names = sorted(k for k in arrays if k.startswith("crop/"))
        modelled = "model_w" in arrays
        return cls(
            key=key,
            shapes=arrays["shapes"],
            lips=arrays["lips"],
            frame_index=arrays["frame_index"],
            model_w=arrays.get("model_w"),
            model_mean=arrays.get("model_mean"),
            model_std=arrays.get("model_std"),
            live_model=(
                (arrays["live_model_w"], arrays["live_model_mean"], arrays["live_model_std"])
                if modelled
                else None
            ),
            crop_jpeg=[arrays[k] for k in names],
            fps=float(meta.get("fps", 25.0)),
            drive_share=float(meta.get("drive_share", 1.0)),
            drive_cue=str(meta.get("drive_cue", "loudness")),
            opening_gain=float(meta.get("opening_gain", 1.0)),
            jaw=arrays.get("jaw"),
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

    def predict(
        self, samples: np.ndarray, sr: int, fps: float, n_frames: int, lookahead: int | None = None
    ) -> np.ndarray:
        """(n_frames, 3) the shapes the presenter's mouth takes for `samples` (mono at
        `sr`), by the model fitted on their own footage. The features are read at `sr`
        itself: a rate changes the log-mel of every band by one constant (the window's
        length), which `normalise` removes, as it removes the recording's level.
        `lookahead`: frames past each frame the caller has audio for (None: all, a whole
        file); a live render's LIVE_AHEAD gets the model fitted to read no further, not
        the whole-file one guessing at the frames it lacks. Only for a bank with a model
        (`has_model`)."""
        if not self.has_model:
            raise ValueError(
                f"mouth bank {self.key[:12]} has no audio model (footage without speech)"
            )
        speech = speech_frames(samples, sr, fps, n_frames)
        feats = normalise(log_mel(samples, sr, fps, n_frames), speech)
        if lookahead is not None and lookahead <= LIVE_AHEAD:
            w, mean, std = self.live_model
            x = windowed(feats, LIVE_AHEAD)
        else:
            w, mean, std = self.model_w, self.model_mean, self.model_std
            x = windowed(feats)
        z = (x - mean) / std
        pred = smooth(np.concatenate([z, np.ones((len(z), 1), np.float32)], axis=1) @ w)
        centre = float(self.shapes[:, 0].mean())
        pred[:, 0] = centre + self.opening_gain * (pred[:, 0] - centre)
        lo, hi = self.shapes.min(0), self.shapes.max(0)
        return np.clip(pred, lo, hi).astype(np.float32)

    def rest_shape(self) -> np.ndarray:
        """(3,) the presenter's closed mouth (`rest_shape`)."""
        return rest_shape(self.shapes)

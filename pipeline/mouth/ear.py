"""The ear: audio to mouth shape, trained once on real footage, knowing no speaker.

    python -m pipeline.mouth.ear train --data DIR [--out FILE] [--cache DIR] [--limit N]

Input, per video frame (25 fps), all speaker-independent: the phones PocketSphinx's
phone recogniser hears (`visemes.phones`: its model ships inside the `pocketsphinx`
wheel), as each frame's share of every ARPAbet phone, and the log-mel's first cepstral
coefficients, each band less its mean and over its spread across the utterance's speech
(level, microphone and voice go). A window of them, CONTEXT frames back and ahead, is
stacked and a ridge regression maps it to the mouth's shape.

Targets: the face mesh's (the renderer's landmarker) inner-lip opening and corner width
in canonical units (`lips.mouth_shape`: one unit is the distance between the eyes),
normalised per speaker by the width of the speaker's mouth at rest: opening over rest
width, width over rest width less one. A bank (the presenter's own footage) maps them
onto the presenter's own range; a render without one takes the ear's as they are.

Weights ship as package data (`pipeline/mouth/data/ear.npz`, a few KB, with SOURCES.md
beside it: the footage, its licence and the commit it came from). Training reads a
folder of clips the user laid out (docs/using.md); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

FPS = 25.0
WEIGHTS = Path(__file__).parent / "data" / "ear.npz"
# ARPAbet as PocketSphinx's en-us model labels it, silence and noise included
PHONES = (
    "SIL", "AA", "AE", "AH", "AO", "AW", "AY", "B", "CH", "D", "DH", "EH", "ER", "EY", "F",
    "G", "HH", "IH", "IY", "JH", "K", "L", "M", "N", "NG", "OW", "OY", "P", "R", "S", "SH",
    "T", "TH", "UH", "UW", "V", "W", "Y", "Z", "ZH", "+NSN+", "+SPN+",
)  # fmt: skip
N_CEPS = 13
# frames the ear reads, back and ahead (the mouth moves before the sound): on GRID's
# held-out sentences -6..+6 0.797, -4..+4 0.790, -3..+1 0.776 (r of the opening)
CONTEXT = tuple(range(-6, 7))
# frames: the Gaussian its prediction is smoothed by; none, as GRID's held-out sentences
# chose (sigma 1: r 0.789 against 0.797 unsmoothed)
SMOOTH = 0.0
SEED = 20261205
HOLD_OUT = 0.2  # share of sentences held out, chosen by a hash of their name ...
# ... and, always, the 14 sentences testkit's grid_s1 clip joins (its tests and
# bench_mouth_real judge the ear on speech it never heard)
TEST_SENTENCES = frozenset(
    "bbaf2n bgat9s brbm8p bwig2p lbix4n lgwm7s lwae8n pbao9s pgbe2n prbj7a pwby1a sbig5s"
    " sgiv1s srwczp".split()
)
PENALTIES = (1.0, 10.0, 100.0, 1000.0, 10000.0)


def frame_phones(
    samples: np.ndarray, sr: int, fps: float, n_frames: int, apart: bool = False
) -> np.ndarray:
    """(n_frames, len(PHONES)) float32: each video frame's share of each phone over the
    10 ms frames it covers (the recogniser hears `samples` as one utterance)."""
    from pipeline.mouth.visemes import PHONE_FPS, phones

    fine = np.zeros(int(np.ceil(samples.size / sr * PHONE_FPS)) + 2, np.int64)  # SIL
    index = {p: k for k, p in enumerate(PHONES)}
    if samples.size:
        for phone, first, last in phones(samples, sr, apart):
            fine[first : last + 1] = index.get(phone, index["+SPN+"])
    frame = np.minimum(((np.arange(fine.size) + 0.5) / PHONE_FPS * fps).astype(np.int64), n_frames)
    out = np.zeros((n_frames + 1, len(PHONES)), np.float32)
    np.add.at(out, (frame, fine), 1.0)
    out = out[:n_frames]
    return out / np.maximum(out.sum(1, keepdims=True), 1.0)


def acoustic(samples: np.ndarray, sr: int, fps: float, n_frames: int) -> np.ndarray:
    """(n_frames, N_CEPS) float32: the cepstrum of the log-mel, each coefficient less its
    mean and over its spread across the utterance's speech frames."""
    from pipeline.mouth.features import log_mel, mfcc
    from pipeline.render.audio import GATE_DB, frame_rms

    feats = mfcc(log_mel(samples, sr, fps, n_frames), N_CEPS)
    rms = np.zeros(n_frames, np.float32)
    got = frame_rms(samples, sr, fps)[:n_frames]
    rms[: got.size] = got
    speech = rms > 10.0 ** (GATE_DB / 20.0)
    ref = feats[speech] if speech.sum() >= 5 else feats
    return ((feats - ref.mean(0)) / (ref.std(0) + 1e-3)).astype(np.float32)


def frame_features(
    samples: np.ndarray, sr: int, fps: float, n_frames: int, apart: bool = False
) -> np.ndarray:
    """(n_frames, len(PHONES) + N_CEPS) what the ear reads of each frame; `apart`: the
    phones heard by the worker process (`phone_worker`)."""
    samples = np.asarray(samples, np.float32)
    return np.concatenate(
        [frame_phones(samples, sr, fps, n_frames, apart), acoustic(samples, sr, fps, n_frames)],
        1,
    )


def smooth(x: np.ndarray, sigma: float) -> np.ndarray:
    """`x` (T, ...) smoothed along its first axis by a Gaussian of `sigma` frames (the
    ends held)."""
    if sigma <= 0 or x.shape[0] < 2:
        return x
    half = int(np.ceil(3 * sigma))
    k = np.exp(-0.5 * (np.arange(-half, half + 1) / sigma) ** 2)
    k /= k.sum()
    pad = np.concatenate([np.repeat(x[:1], half, 0), x, np.repeat(x[-1:], half, 0)])
    return (
        np.stack([np.convolve(pad[:, j], k, mode="valid") for j in range(x.shape[1])], 1)
        if x.ndim == 2
        else np.convolve(pad, k, mode="valid")
    )


def stacked(feats: np.ndarray, context: tuple[int, ...] = CONTEXT) -> np.ndarray:
    """(T, F * len(context) + 1): each frame's features beside its neighbours' (clamped
    at the ends), and a constant."""
    from pipeline.mouth.features import stack

    x = stack(feats, context)
    return np.concatenate([x, np.ones((x.shape[0], 1), np.float32)], 1)


@dataclass(frozen=True)
class Ear:
    """A ridge regression from `stacked` features to the normalised (opening, width)."""

    weights: np.ndarray  # (F * len(context) + 1, 2)
    context: tuple[int, ...]
    rest: np.ndarray  # (2,) the training speakers' mean (opening, width) at rest ...
    wide: np.ndarray  # (2,) ... and their 95th percentile: the range a bank maps onto
    meta: dict

    def predict_features(self, feats: np.ndarray) -> np.ndarray:
        """(T, 2) normalised (opening, width) of frame features (T, F), smoothed."""
        return smooth(stacked(feats, self.context) @ self.weights, SMOOTH).astype(np.float32)

    def predict(
        self, samples: np.ndarray, sr: int, fps: float, n_frames: int, apart: bool = False
    ) -> np.ndarray:
        """(n_frames, 2) normalised (opening over rest width, width over rest width - 1)
        of `samples` heard as one utterance."""
        return self.predict_features(frame_features(samples, sr, fps, n_frames, apart))

    def scaled(self, shape: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(T,) opening and (T,) spread as the warp renderer takes them, of `predict`'s
        (T, 2): the opening 0 at rest, 1 at the training speakers' wide opening (clipped
        to [0, 1]); the spread 0 at rest, +1 as wide as they spread (-1: as far the
        other way, rounded; clipped)."""
        span = np.maximum(self.wide - self.rest, 1e-6)
        z = (np.asarray(shape, np.float32) - self.rest) / span
        return np.clip(z[:, 0], 0.0, 1.0), np.clip(z[:, 1], -1.0, 1.0)

    def openness(self, samples: np.ndarray, sr: int, fps: float, n_frames: int) -> np.ndarray:
        """(n_frames,) the opening as the warp renderer takes it (`scaled`)."""
        return self.scaled(self.predict(samples, sr, fps, n_frames))[0]

    def calibrated(self, shape: np.ndarray, presenter: np.ndarray) -> np.ndarray:
        """(T, 2) `predict`'s normalised (opening, width) in the presenter's canonical
        units (`lips.mouth_shape`), by the presenter's own mouths `presenter` (N, 2+),
        e.g. a bank's shapes: the ear says how far the mouth moves relative to its width
        at rest, the presenter's footage says that width and how open the mouth is at
        rest. The ear's motion is kept; the bank only sets its scale and rest."""
        shapes = np.asarray(presenter, np.float32)[:, :2]
        norm, rest_width = normalise(shapes)
        ok = np.isfinite(norm).all(1)
        quiet = ok & (norm[:, 0] <= np.percentile(norm[ok, 0], 20))
        shift = norm[quiet].mean(0) - self.rest  # the presenter's rest, less the ear's
        out = np.asarray(shape, np.float32) + shift
        return np.stack(
            [np.maximum(out[:, 0], 0.0) * rest_width, (out[:, 1] + 1.0) * rest_width], 1
        ).astype(np.float32)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(
            path,
            weights=self.weights.astype(np.float32),
            context=np.asarray(self.context, np.int64),
            rest=self.rest.astype(np.float32),
            wide=self.wide.astype(np.float32),
            meta=np.frombuffer(json.dumps(self.meta, sort_keys=True).encode(), np.uint8),
        )


def load(path: Path | None = None) -> Ear:
    """The ear in `path` (default: the one hotplate ships)."""
    return _load(Path(path or WEIGHTS))


@cache
def _load(path: Path) -> Ear:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the ear's weights are missing; reinstall hotplate, or make them with"
            " `python -m pipeline.mouth.ear train --data DIR`"
        )
    with np.load(path) as z:
        return Ear(
            z["weights"],
            tuple(int(c) for c in z["context"]),
            z["rest"],
            z["wide"],
            json.loads(bytes(z["meta"]).decode()),
        )


# --- training ---------------------------------------------------------------------------


def clips_in(data: Path) -> list[tuple[str, Path]]:
    """(speaker, clip) for each video under `data`: `data/<speaker>/<sentence>.<ext>`."""
    exts = {".mpg", ".mp4", ".mov", ".mkv", ".avi", ".webm"}
    out = sorted(
        (p.parent.name, p) for p in data.glob("*/*") if p.suffix.lower() in exts and p.is_file()
    )
    if not out:
        raise FileNotFoundError(
            f"{data}: no clips; lay them out as {data}/<speaker>/<sentence>.mpg (docs/using.md)"
        )
    return out


def clip_shapes(path: Path) -> tuple[np.ndarray, float, np.ndarray, int]:
    """(frames' mouth shapes (N, 3) by the face mesh, NaN where none; fps; audio; sr) of
    one clip: the face found once (RetinaFace on the first frame), the mesh on each frame
    in that box widened (a sentence's head hardly moves)."""
    import av

    from pipeline.media import make_proxy
    from pipeline.mouth.lips import mouth_shape
    from pipeline.nets.detectors import load_detector
    from pipeline.nets.landmarks import load_landmarker
    from pipeline.render.audio import load_audio

    with av.open(str(path)) as container:
        video = container.streams.video[0]
        fps = float(video.average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video)]
        sr = int(container.streams.audio[0].codec_context.sample_rate)
    audio = load_audio(path, sr)
    shapes = np.full((len(frames), 3), np.nan, np.float32)
    if not frames:
        return shapes, fps, audio, sr
    detector = _nets(load_detector, "retinaface")
    marker = _nets(load_landmarker, "facemesh")
    small, scale = make_proxy(frames[0], 480)
    dets = detector.detect([small])[0]
    if len(dets) == 0:
        return shapes, fps, audio, sr
    box = dets[int(np.argmax(dets[:, 4])), :4] / scale
    for i, image in enumerate(frames):
        lm = np.asarray(marker.predict(image, box), np.float64)
        if np.isfinite(lm).all():
            shapes[i] = mouth_shape(lm)
            # follow the face: the next frame's box is this one's landmarks' box, as wide
            lo, hi = lm.min(0), lm.max(0)
            c, half = (lo + hi) / 2, (hi - lo).max() * 0.6
            box = np.array([c[0] - half, c[1] - half * 0.9, c[0] + half, c[1] + half * 1.1])
    return shapes, fps, audio, sr


_NETS: dict = {}


def _nets(loader, name: str):
    if name not in _NETS:
        _NETS[name] = loader(name, None)
    return _NETS[name]


def extract(path: Path, cache_dir: Path) -> dict[str, np.ndarray]:
    """One clip's frame features and face-mesh shapes, cached in `cache_dir` by the
    clip's bytes."""
    digest = hashlib.blake2b(path.read_bytes(), digest_size=12).hexdigest()
    cached = cache_dir / f"{digest}.npz"
    if cached.is_file():
        with np.load(cached) as z:
            return {k: z[k] for k in z.files}
    shapes, fps, audio, sr = clip_shapes(path)
    n = shapes.shape[0]
    feats = frame_features(audio, sr, fps, n)
    out = {"feats": feats, "shapes": shapes, "fps": np.float32(fps)}
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cached, **out)
    return out


def normalise(shapes: np.ndarray) -> tuple[np.ndarray, float]:
    """(N, 2) one speaker's (opening, width) over the width of the speaker's mouth at
    rest (the median width of the least open fifth of frames), and that width."""
    ok = np.isfinite(shapes).all(1)
    opening, width = shapes[:, 0], shapes[:, 1]
    quiet = ok & (opening <= np.percentile(opening[ok], 20))
    rest_width = float(np.median(width[quiet]))
    return np.stack([opening / rest_width, width / rest_width - 1.0], 1), rest_width


def held_out(name: str) -> bool:
    """Whether a sentence is in the held-out split: by a hash of its name, so the split
    is the same on any machine and whatever else the folder holds."""
    if name in TEST_SENTENCES:
        return True
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest(), "big")
    return h / 2**32 < HOLD_OUT


def ridge(x: np.ndarray, y: np.ndarray, penalty: float) -> np.ndarray:
    """Ridge weights (the last column, the constant, unpenalised)."""
    reg = penalty * np.eye(x.shape[1])
    reg[-1, -1] = 0.0
    return np.linalg.solve(x.T @ x + reg, x.T @ y)


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or a[ok].std() < 1e-9 or b[ok].std() < 1e-9:
        return 0.0
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def train(data: Path, cache_dir: Path, limit: int = 0, log=print) -> tuple[Ear, dict[str, float]]:
    """The ear fitted on every clip under `data` (at most `limit` per speaker), its
    penalty chosen on the training sentences (5 folds by sentence), judged on the
    held-out sentences (`held_out`)."""
    rng = np.random.default_rng(SEED)
    by_speaker: dict[str, list[tuple[str, Path]]] = {}
    for speaker, path in clips_in(data):
        by_speaker.setdefault(speaker, []).append((path.stem, path))
    rows = []  # (speaker, sentence, X, Y)
    started = time.monotonic()
    for speaker, clips in sorted(by_speaker.items()):
        if limit:
            order = rng.permutation(len(clips))[:limit]
            clips = [clips[k] for k in sorted(order)]
        got = []
        for k, (name, path) in enumerate(clips):
            d = extract(path, cache_dir)
            got.append((name, d))
            if (k + 1) % 50 == 0:
                log(f"{speaker}: {k + 1}/{len(clips)} clips ({time.monotonic() - started:.0f} s)")
        shapes = np.concatenate([d["shapes"][:, :2] for _, d in got])
        _, rest_width = normalise(shapes)
        for name, d in got:
            y = np.stack([d["shapes"][:, 0], d["shapes"][:, 1]], 1) / rest_width
            y[:, 1] -= 1.0
            rows.append((speaker, name, stacked(d["feats"]), y))
    train_rows = [r for r in rows if not held_out(r[1])]
    test_rows = [r for r in rows if held_out(r[1])]
    if not train_rows:
        raise ValueError(f"{data}: every clip fell in the held-out split; give it more clips")

    def fit(part: list, penalty: float) -> np.ndarray:
        x = np.concatenate([r[2] for r in part])
        y = np.concatenate([r[3] for r in part])
        ok = np.isfinite(y).all(1)
        return ridge(x[ok], y[ok], penalty)

    def score(part: list, w: np.ndarray) -> float:
        pred = np.concatenate([smooth(r[2] @ w, SMOOTH) for r in part])[:, 0]
        truth = np.concatenate([r[3] for r in part])[:, 0]
        return correlation(pred, truth)

    folds = rng.permutation(len(train_rows)) % 5
    cv = {}
    for penalty in PENALTIES:
        preds = [
            score(
                [r for r, f in zip(train_rows, folds, strict=True) if f == k],
                fit([r for r, f in zip(train_rows, folds, strict=True) if f != k], penalty),
            )
            for k in range(5)
            if (folds == k).any() and (folds != k).any()
        ]
        cv[penalty] = float(np.mean(preds)) if preds else 0.0
    penalty = max(cv, key=cv.get)
    w = fit(train_rows, penalty)
    y = np.concatenate([r[3] for r in train_rows])
    pred = np.concatenate([smooth(r[2] @ w, SMOOTH) for r in train_rows])
    ok = np.isfinite(y).all(1)
    quiet = ok & (y[:, 0] <= np.percentile(y[ok, 0], 20))
    rest = pred[quiet].mean(0)
    wide = np.percentile(pred[ok], 95, axis=0)
    figures = {
        "penalty": penalty,
        "cv_r": cv[penalty],
        "train_frames": int(ok.sum()),
        "train_sentences": len(train_rows),
        "held_out_sentences": len(test_rows),
        "held_out_r_opening": score(test_rows, w) if test_rows else float("nan"),
    }
    if test_rows:
        p = np.concatenate([smooth(r[2] @ w, SMOOTH) for r in test_rows])[:, 1]
        figures["held_out_r_width"] = correlation(
            p, np.concatenate([r[3] for r in test_rows])[:, 1]
        )
    meta = {
        "speakers": sorted(by_speaker),
        "seed": SEED,
        "features": f"{len(PHONES)} phone shares + {N_CEPS} cepstra, frames {CONTEXT[0]}..{CONTEXT[-1]}",
        **figures,
    }
    return Ear(w.astype(np.float32), CONTEXT, rest, wide, meta), figures


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.mouth.ear", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="fit the ear on a folder of clips (docs/using.md)")
    t.add_argument("--data", type=Path, required=True, help="DIR/<speaker>/<sentence>.mpg")
    t.add_argument("--out", type=Path, default=WEIGHTS, help=f"weights (default {WEIGHTS})")
    t.add_argument(
        "--cache", type=Path, default=None, help="features cache (default DATA/.ear-cache)"
    )
    t.add_argument("--limit", type=int, default=0, help="at most N clips per speaker (0: all)")
    args = ap.parse_args(argv)
    try:
        ear, figures = train(args.data, args.cache or args.data / ".ear-cache", args.limit)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    ear.save(args.out)
    print(json.dumps(figures, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

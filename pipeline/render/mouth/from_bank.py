"""Mouths from the persona's bank: the presenter's own footage, chosen for the speech.

For a render with a bank (`pipeline/mouth/bank.py`):

1. the shape the presenter's mouth takes for each frame of the new audio, predicted by
   the model fitted on their own footage, its opening blended with the drive's cue
   (loudness, `drive.py`, or the recognised phones, `visemes.py`) mapped onto the
   presenter's own range, by the cue and share the bank chose on its own footage
   (`bank.drive_share`: on real talking footage loudness barely predicts the lips and
   the phones a little more; on a clip whose mouth loudness opened, loudness does; a
   live render, which cannot recognise phones a frame ahead, takes the model alone
   where the bank chose the phones); in silence (`silence.py`) the presenter's closed
   mouth instead, and for p, b, m where the bank follows loudness;
2. one bank entry per output frame (where the phones are heard while the render runs,
   per piece as it is heard: `visemes.PhoneTrack`), by dynamic programming (Viterbi) over the shape
   distance to that target plus a cost for every jump between two entries that were
   not consecutive frames of the clip, so runs of real footage play as they were shot;
3. each entry's crop, aligned to the canonical frame, warped onto the output frame by
   that frame's canonical similarity (its eyes and nose), its colour matched to the
   frame around the mouth (mean and contrast per channel in the blend's soft edge), and
   blended through a feathered region of the mouth and chin times the stored mask.
"""

from __future__ import annotations

import threading

import numpy as np

from pipeline.assets import AvatarAssets
from pipeline.mouth.bank import CROP, SCALE, MouthBank, crop_from_frame, crop_size, cue_opening
from pipeline.mouth.lips import to_canonical
from pipeline.render.mouth.drive import Drive
from pipeline.render.renderers.base import MouthPatch, fit_mask
from pipeline.render.silence import SilenceParams, speech_weight

SHAPE_WEIGHTS = np.array([1.0, 0.5, 0.5], np.float32)  # opening counts most
CANDIDATES = 12  # entries per frame the search considers (the nearest to its target)
JUMP = 1.5  # cost of a cut to an entry that does not follow the last one in the clip
STAY = 0.4  # cost of showing the same entry again (a frozen mouth)
# The blended region, canonical units: full inside an ellipse over the mouth and chin,
# fading to nothing over FEATHER beyond it (the eyes and nose are never touched).
REGION = (0.0, 1.33, 0.6, 0.55)  # centre x, centre y, radius x, radius y
FEATHER = 0.3  # of the radius
GAIN = (0.85, 1.18)  # bounds of the colour match's contrast per channel
RING_STEP = 4  # the colour match reads every 4th pixel of the soft edge
# stored frames whose patch geometry is kept: a loop of up to 256 frames computes each
# once per render (~2 ms a frame at 1080x1920); its blend weight is kept in float16,
# ~130 KB a frame there (34 MB for 256)
KEEP_GEOMETRIES = 256


def region_mask() -> np.ndarray:
    """(h, w) float32 blend weight over a bank crop."""
    w, h = crop_size()
    cx, cy, rx, ry = REGION
    xs = CROP[0] + (np.arange(w) + 0.5) / SCALE
    ys = CROP[1] + (np.arange(h) + 0.5) / SCALE
    r = np.sqrt(((xs[None, :] - cx) / rx) ** 2 + ((ys[:, None] - cy) / ry) ** 2)
    x = np.clip((1.0 + FEATHER - r) / FEATHER, 0.0, 1.0)
    return (x * x * (3.0 - 2.0 * x)).astype(np.float32)


def select(bank: MouthBank, target: np.ndarray) -> np.ndarray:
    """(T,) bank entry per frame for target shapes (T, 3): the path of least total
    shape distance plus cut and freeze costs (Viterbi over each frame's nearest
    CANDIDATES and the entries that continue the previous frame's best ones)."""
    n_t, n = target.shape[0], bank.size
    if n_t == 0:
        return np.zeros(0, np.int64)
    sigma = bank.shapes.std(0) + 1e-4
    scaled = bank.shapes / sigma
    aim = target / sigma
    k = min(CANDIDATES, n)

    def cost(t: int, js: np.ndarray) -> np.ndarray:
        return (((scaled[js] - aim[t]) ** 2) * SHAPE_WEIGHTS).sum(-1)

    def nearest(t: int) -> np.ndarray:
        c = (((scaled - aim[t]) ** 2) * SHAPE_WEIGHTS).sum(-1)
        return np.argpartition(c, k - 1)[:k] if k < n else np.arange(n)

    order = bank.frame_index
    states = nearest(0)
    total = cost(0, states)
    back: list[tuple[np.ndarray, np.ndarray]] = []
    for t in range(1, n_t):
        best = states[np.argsort(total)[:k]]
        follow = np.minimum(best + 1, n - 1)  # the clip's next frame after each best
        cand = np.unique(np.concatenate([nearest(t), follow]))
        follows = order[cand][None, :] == order[states][:, None] + 1
        same = cand[None, :] == states[:, None]
        trans = np.where(follows, 0.0, np.where(same, STAY, JUMP))
        step = total[:, None] + trans
        arg = step.argmin(0)
        back.append((states, arg))
        total = step[arg, np.arange(cand.size)] + cost(t, cand)
        states = cand
    path = np.zeros(n_t, np.int64)
    j = int(np.argmin(total))
    path[-1] = states[j]
    for t in range(n_t - 1, 0, -1):
        prev_states, arg = back[t - 1]
        j = int(arg[j])
        path[t - 1] = prev_states[j]
    return path


class BankMouths:
    """The bank's mouths for one prepared render: `patch(t, idx, frame)` per frame."""

    def __init__(
        self,
        assets: AvatarAssets,
        bank: MouthBank,
        audio: np.ndarray,
        sr: int,
        fps: float,
        drive: Drive,
        silence: SilenceParams | None,
        geometries: dict[int, tuple | None] | None = None,
        lookahead: int | None = None,
    ) -> None:
        """`geometries`: the patch geometries of the stored frames, kept by the caller
        across prepares of the same assets (live prepares every few frames; each
        geometry costs a warp of the blend mask). `lookahead`: frames of audio past
        each frame the caller has (`MouthBank.predict`; None: the whole file)."""
        # 1. target shapes: the presenter's, closed in silence and for p, b, m
        n = drive.open.size
        target = bank.predict(audio, sr, fps, n, lookahead)
        rest = bank.rest_shape()
        wide = float(np.quantile(bank.shapes[:, 0], 0.95))
        share = bank.drive_share
        if bank.drive_cue == "phones" and lookahead is not None:
            share = 0.0  # live: the phones need the utterance; the model alone
        # the phones a whole-file drive hears while the render runs: the target and the
        # entries piece by piece as they are heard (each piece's own search: the pieces
        # end in pauses), so the first frames wait for the first piece, not the whole
        heard = drive.phones if bank.drive_cue == "phones" and share > 0.0 else None
        if share > 0.0 and heard is None:
            cued = cue_opening(bank.drive_cue, audio, sr, fps, n, drive)
            target[:, 0] = (
                share * (rest[0] + cued * max(wide - rest[0], 0.0)) + (1.0 - share) * target[:, 0]
            )
        weight = np.ones(n, np.float32)
        if silence is not None:
            got = speech_weight(audio, sr, fps, silence)[:n]
            weight[: got.size] = got
        if bank.drive_cue == "loudness" and share > 0.0:
            # the loudness drive's p, b, m (a heuristic of espeak-ng's speech) only where
            # the presenter's mouth was seen to follow loudness: on real speech they shut
            # it at the wrong frames (r of the target against the truth 0.36 -> 0.26 on
            # bench_mouth_real's six clips); the model and the phones close it themselves
            weight = np.where(drive.closed, 0.0, weight)
        weight = weight[:, None]
        self.assets, self.bank = assets, bank
        if heard is None:
            self.target = (weight * target + (1.0 - weight) * rest).astype(np.float32)
            # 2. one entry per frame
            self.entries = select(bank, self.target)
            self._todo: list[tuple[int, int]] = []
        else:
            self.target = np.zeros_like(target, dtype=np.float32)
            self.entries = np.zeros(n, np.int64)
            self._todo = list(heard.pieces)
            self._lock = threading.Lock()
            self._blend = (heard, target, weight, rest, share, max(wide - rest[0], 0.0))
        self.mask = region_mask()
        self._geometries: dict[int, tuple | None] = {} if geometries is None else geometries

    def _ready(self, t: int | None = None) -> None:
        """The target and entries final up to frame t (None: all): the pieces the phones
        are heard in, each blended and searched once it is heard."""
        if not self._todo:
            return
        with self._lock:
            heard, model, weight, rest, share, span = self._blend
            while self._todo and (t is None or self._todo[0][0] <= t):
                a, b = self._todo[0]
                heard.wait(b - 1)
                piece = model[a:b].copy()
                piece[:, 0] = (
                    share * (rest[0] + heard.heard[a:b] * span) + (1.0 - share) * piece[:, 0]
                )
                w = weight[a:b]
                self.target[a:b] = w * piece + (1.0 - w) * rest
                self.entries[a:b] = select(self.bank, self.target[a:b])
                self._todo.pop(0)

    def shapes(self) -> np.ndarray:
        """(T, 3) the shapes of the entries shown."""
        self._ready()
        return self.bank.shapes[self.entries]

    def _geometry(self, idx: int) -> tuple | None:
        """Stored frame idx's patch box, patch -> crop pixel map and blend weight (the
        region warped onto the frame times the stored mask); None: no face there. Kept
        for the stored frames in use (a loop shows each many times)."""
        import cv2

        if idx in self._geometries:
            return self._geometries[idx]
        lm = np.asarray(self.assets.landmarks[idx], np.float64)
        got = None
        if np.isfinite(lm).all():
            a = self.assets
            c = crop_from_frame(to_canonical(lm))
            w, h = crop_size()
            inv = np.linalg.inv(np.vstack([c, [0.0, 0.0, 1.0]]))[:2]
            corners = np.array([[0, 0], [w, 0], [0, h], [w, h]], np.float64)
            corners = corners @ inv[:, :2].T + inv[:, 2]
            mbox = [int(v) for v in a.mask_boxes[idx]]
            x1 = max(int(np.floor(corners[:, 0].min())), mbox[0], 0)
            y1 = max(int(np.floor(corners[:, 1].min())), mbox[1], 0)
            x2 = min(int(np.ceil(corners[:, 0].max())), mbox[2], a.width)
            y2 = min(int(np.ceil(corners[:, 1].max())), mbox[3], a.height)
            if x2 > x1 and y2 > y1:
                m = c.copy()
                m[:, 2] += c[:, :2] @ np.array([x1, y1], np.float64)  # patch px -> crop px
                size = (x2 - x1, y2 - y1)
                flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
                alpha = cv2.warpAffine(self.mask, m, size, flags=flags, borderValue=0.0)
                stored = fit_mask(a.masks[idx], mbox)
                stored = stored[y1 - mbox[1] : y2 - mbox[1], x1 - mbox[0] : x2 - mbox[0]]
                alpha *= stored.astype(np.float32) * (1.0 / 255.0)
                got = ((x1, y1, x2, y2), m, size, alpha.astype(np.float16))
        if len(self._geometries) >= KEEP_GEOMETRIES:
            self._geometries.pop(next(iter(self._geometries)))
        self._geometries[idx] = got
        return got

    def source(self, t: int, idx: int) -> tuple[int, int, int, int] | None:
        """The box `patch(t, idx, frame)` reads and covers, or None when it returns None."""
        geometry = self._geometry(idx)
        return None if geometry is None or t >= self.entries.size else geometry[0]

    # 3. warp, match, blend
    def patch(self, t: int, idx: int, frame: np.ndarray) -> MouthPatch | None:
        import cv2

        geometry = self._geometry(idx)
        if geometry is None or t >= self.entries.size:
            return None
        (x1, y1, x2, y2), m, size, alpha = geometry
        alpha = alpha.astype(np.float32)
        self._ready(t)
        crop = self.bank.crop(int(self.entries[t]))
        flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
        mouth = cv2.warpAffine(crop, m, size, flags=flags, borderMode=cv2.BORDER_REPLICATE)
        under = np.ascontiguousarray(frame[y1:y2, x1:x2])
        gain, offset = colour_match(mouth, under, alpha)
        mouth = cv2.transform(mouth, np.hstack([np.diag(gain), offset[:, None]]))  # saturates
        return MouthPatch((x1, y1, x2, y2), cv2.blendLinear(mouth, under, alpha, 1.0 - alpha))


def colour_match(src: np.ndarray, dst: np.ndarray, alpha: np.ndarray) -> tuple:
    """(gain, offset) per channel that move `src`'s mean and contrast to `dst`'s over the
    blend's soft edge (where alpha is between 0 and 1: skin both show), the gain bounded
    by GAIN; measured on every RING_STEP-th pixel."""
    ring = alpha[::RING_STEP, ::RING_STEP]
    ring = ring * (1.0 - ring)
    total = float(ring.sum())
    if total < 1e-3:
        return np.ones(3, np.float32), np.zeros(3, np.float32)
    wts = (ring / total)[..., None]
    a = src[::RING_STEP, ::RING_STEP].astype(np.float32)
    b = dst[::RING_STEP, ::RING_STEP].astype(np.float32)
    ma, mb = (a * wts).sum((0, 1)), (b * wts).sum((0, 1))
    sa = np.sqrt(((a - ma) ** 2 * wts).sum((0, 1))) + 1e-3
    sb = np.sqrt(((b - mb) ** 2 * wts).sum((0, 1))) + 1e-3
    gain = np.clip(sb / sa, *GAIN).astype(np.float32)
    return gain, (mb - ma * gain).astype(np.float32)

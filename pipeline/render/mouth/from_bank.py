"""Mouths from the persona's bank: the presenter's own footage, chosen for the speech.

For a render with a bank (`pipeline/mouth/bank.py`):

1. the shape the presenter's mouth takes for each frame of the new audio (T, 3:
   opening, width, height, the presenter's canonical units; a plain array, whatever
   asks for it): for a bank whose footage had speech, predicted by the model fitted on
   it, its opening blended with the drive's cue (loudness, `drive.py`, or the
   recognised phones, `visemes.py`) mapped onto the presenter's own range, by the cue
   and share the bank chose on its own footage (`bank.drive_share`: on real talking
   footage loudness barely predicts the lips and the phones a little more; on a clip
   whose mouth loudness opened, loudness does; a live render, which cannot recognise
   phones a frame ahead, takes the model alone where the bank chose the phones); for a
   bank of footage without speech (no model), the shape the drive asks for on the
   presenter's range (`asked_shapes`: its opening from rest to the bank's wide
   mouth, its spread onto the bank's widths); in silence (`silence.py`) the
   presenter's closed mouth instead, and for p, b, m where the bank follows loudness;
   where the speech asks for a wider mouth than the footage holds (the drive's opening
   on the warp's own scale, `speech_span`, from the footage's median mouth, past the
   widest in the bank: `opening_range`), the excess is added to the target: the search
   takes the bank's widest mouths and the renderer opens them further by it (`beyond`,
   `warp.py`), so a presenter who barely opened the mouth in their footage does not
   mumble; at rest and in small shapes the mouths are the presenter's own, untouched;
2. one bank entry per output frame (where the phones are heard while the render runs,
   per piece as it is heard: `visemes.PhoneTrack`), by dynamic programming (Viterbi) over the shape
   distance to that target plus a cost for every jump between two entries that were
   not consecutive frames of the clip, so runs of real footage play as they were shot;
   at a jump the run it leaves plays on under the new one for FADE frames, fading out
   (`fades`), so no mouth pops from one frame to the next; it plays on only while it
   does not open (held where its clip's next frame opens: in a pause a mouth must not);
3. each entry's crop, aligned to the canonical frame, warped onto the output frame by
   that frame's canonical similarity (its eyes and nose: the stored landmarks give each
   frame's head), its colour matched to the frame around the mouth (mean and contrast
   per channel in the blend's soft edge), and blended through a feathered region of the
   mouth and chin times the stored mask: every frame's mouth is the bank's, so a loop's
   own words do not show through.
"""

from __future__ import annotations

import threading

import numpy as np

from pipeline.assets import AvatarAssets
from pipeline.mouth.bank import CROP, SCALE, MouthBank, crop_from_frame, crop_size, cue_opening
from pipeline.mouth.lips import apply, invert, to_canonical
from pipeline.render.mouth.drive import Drive
from pipeline.render.renderers.base import MouthPatch, fit_mask
from pipeline.render.silence import SilenceParams, speech_weight

SHAPE_WEIGHTS = np.array([1.0, 0.5, 0.5], np.float32)  # opening counts most
FADE = 2  # frames over which the run a jump leaves fades out under the new one
MORPH_SIGMA = 0.08  # canonical units: the reach of a point's move in `point_warp` ...
MORPH_STAY = 0.05  # ... and the weight of no move, so the field fades out past ~2 sigma
MORPH_STEP = 4  # px: the grid the field is computed on
WIDE = 0.95  # quantile of the bank's openings the drive's full opening maps onto
BEYOND_RAMP = 0.05  # canonical units past the footage's widest over which the opening
# asked there grows into the procedural mouth's (`BankMouths._excess`)
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


def asked_shapes(bank: MouthBank, opening: np.ndarray, spread: np.ndarray) -> np.ndarray:
    """(T, 3) the shapes, in the presenter's canonical units, that a drive's opening (T,)
    in [0, 1] and spread (T,) in [-1, 1] ask for: the opening from the presenter's
    closed mouth (0) to their wide one (1: the bank's WIDE quantile), the width from
    their rest width towards their widest (+1, spread) or narrowest (-1, rounded)
    (5th and 95th percentiles), and the height the bank's own mouths have at that
    opening and width (a least-squares plane over its entries)."""
    rest = bank.rest_shape()
    opening = np.asarray(opening, np.float32)
    spread = np.asarray(spread, np.float32)
    wide = float(np.quantile(bank.shapes[:, 0], WIDE))
    lo, hi = np.quantile(bank.shapes[:, 1], [0.05, 0.95])
    out = np.empty((opening.size, 3), np.float32)
    out[:, 0] = rest[0] + np.clip(opening, 0.0, 1.0) * max(wide - rest[0], 0.0)
    out[:, 1] = rest[1] + np.where(
        spread >= 0, spread * max(hi - rest[1], 0.0), spread * max(rest[1] - lo, 0.0)
    )
    x = np.column_stack([bank.shapes[:, :2], np.ones(bank.size)]).astype(np.float64)
    plane = np.linalg.lstsq(x, bank.shapes[:, 2].astype(np.float64), rcond=None)[0]
    out[:, 2] = out[:, 0] * plane[0] + out[:, 1] * plane[1] + plane[2]
    return out


def fades(bank: MouthBank, entries: np.ndarray, before: int | None = None) -> tuple:
    """(other, weight), each (T,): at a jump between entries that are not consecutive
    frames of the clip, the run the path leaves plays on under the new entry for FADE
    frames, its weight falling FADE/(FADE+1), ..., 1/(FADE+1); other -1 (weight 0)
    elsewhere. It plays on (its clip's next frames, the last held where the bank ends)
    only while they do not open wider: played on regardless, a run's opening showed in a
    pause (the referee's gap 0.076 in a silence, bound 0.05); always held, the clip's
    own audio reproduced its mouth at r 0.796, played on 0.833, this way 0.847. `before`:
    the entry shown just before entries[0], if any."""
    n = entries.size
    other = np.full(n, -1, np.int64)
    weight = np.zeros(n, np.float32)
    fi = bank.frame_index
    nxt = np.arange(1, bank.size + 1)
    nxt[:-1] = np.where(fi[1:] == fi[:-1] + 1, nxt[:-1], np.arange(bank.size - 1))
    nxt[-1] = bank.size - 1  # the clip's next frame, or the entry itself at a run's end
    for t in range(n):
        prev = int(entries[t - 1]) if t else before
        cur = int(entries[t])
        if prev is None or cur == prev or cur == nxt[prev]:
            continue
        run = prev
        for k in range(min(FADE, n - t)):
            on = int(nxt[run])
            if bank.shapes[on, 0] <= bank.shapes[run, 0]:  # plays on while it does not open
                run = on
            other[t + k], weight[t + k] = run, (FADE - k) / (FADE + 1)
    return other, weight


def morph(bank: MouthBank, a: int, b: int, weight: float) -> np.ndarray:
    """Entries a and b's crops morphed together, a's share `weight`: each warped so its
    lip and jaw points meet their weighted mean (a smooth field of the points' moves,
    `point_warp`), then blended; two mouths of different shapes cross-dissolved as they
    are would show a doubled lip edge."""
    import cv2

    crop_a, crop_b = bank.crop(a), bank.crop(b)
    pa, pb = morph_points(bank, a), morph_points(bank, b)
    mid = weight * pa + (1.0 - weight) * pb
    return cv2.addWeighted(
        point_warp(crop_a, pa, mid), weight, point_warp(crop_b, pb, mid), 1.0 - weight, 0.0
    )


def morph_points(bank: MouthBank, j: int) -> np.ndarray:
    """(P, 2) entry j's lip (and jaw, where the bank has them) points in crop pixels."""
    pts = bank.lips[j] if bank.jaw is None else np.concatenate([bank.lips[j], bank.jaw[j]])
    return (pts - np.array(CROP[:2], np.float32)) * SCALE


def point_warp(image: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """`image` warped so that its points `src` (P, 2, pixels) move to `dst`: each output
    pixel p reads p + D(p), D a normalised Gaussian mean of the points' moves (src - dst,
    placed at dst) with a stay weight, so it fades out away from them; computed on a
    grid of MORPH_STEP pixels and upsampled."""
    import cv2

    h, w = image.shape[:2]
    gx = np.arange(0, w + MORPH_STEP, MORPH_STEP, dtype=np.float32)
    gy = np.arange(0, h + MORPH_STEP, MORPH_STEP, dtype=np.float32)
    grid = np.stack(np.meshgrid(gx, gy), -1).reshape(-1, 2)
    sigma = MORPH_SIGMA * SCALE
    d2 = ((grid[:, None, :] - dst[None, :, :]) ** 2).sum(-1)
    k = np.exp(-d2 / (2.0 * sigma * sigma))
    field = (k @ (src - dst)) / (k.sum(1, keepdims=True) + MORPH_STAY)
    field = field.reshape(gy.size, gx.size, 2).astype(np.float32)
    # grid point (i, j) sits at pixel (j, i) * step: resize to that span, then crop
    big = cv2.resize(
        field, (gx.size * MORPH_STEP, gy.size * MORPH_STEP), interpolation=cv2.INTER_LINEAR
    )
    big = big[MORPH_STEP // 2 :, MORPH_STEP // 2 :][:h, :w]
    map_x = big[..., 0] + np.arange(w, dtype=np.float32)[None, :]
    map_y = big[..., 1] + np.arange(h, dtype=np.float32)[:, None]
    return cv2.remap(image, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


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
        speech_span: float = 0.0,
    ) -> None:
        """`geometries`: the patch geometries of the stored frames, kept by the caller
        across prepares of the same assets (live prepares every few frames; each
        geometry costs a warp of the blend mask). `lookahead`: frames of audio past
        each frame the caller has (`MouthBank.predict`; None: the whole file).
        `speech_span`: canonical units the renderer's own mouth opens at the drive's
        full opening (0: never past the footage's widest mouth)."""
        # 1. target shapes: the presenter's, closed in silence and for p, b, m
        n = drive.open.size
        rest = bank.rest_shape()
        weight = np.ones(n, np.float32)
        if silence is not None:
            got = speech_weight(audio, sr, fps, silence)[:n]
            weight[: got.size] = got
        self.assets, self.bank = assets, bank
        if bank.has_model:
            piece, whole = self._modelled(audio, sr, fps, drive, lookahead)
            if bank.drive_cue == "loudness" and bank.drive_share > 0.0:
                # the loudness drive's p, b, m (a heuristic of espeak-ng's speech) only
                # where the presenter's mouth was seen to follow loudness: on real speech
                # they shut it at the wrong frames (r of the target against the truth 0.36
                # -> 0.26 on bench_mouth_real's six clips); the model and the phones close
                # it themselves
                weight = np.where(drive.closed, 0.0, weight)
        else:
            # footage without speech: the shape the drive asks for (its opening: the
            # phones in a whole file, heard while the render runs; loudness live)
            def piece(a: int, b: int) -> np.ndarray:
                drive.ready(b - 1)
                return asked_shapes(bank, drive.open[a:b], drive.spread[a:b])

            whole = drive.phones is None
        self._piece, self._weight, self._rest = piece, weight[:, None], rest
        self._drive, self._span = drive, float(speech_span)
        self.target = np.zeros((n, 3), np.float32)
        self.excess = np.zeros(n, np.float32)  # opening asked past the footage's widest
        self.beyond_entry = np.zeros(n, np.float32)  # ... that the entry shown lacks
        self.entries = np.zeros(n, np.int64)
        self.other = np.full(n, -1, np.int64)  # the run a jump left, fading out (`fades`)
        self.other_weight = np.zeros(n, np.float32)
        # where the drive hears the phones while the render runs: the target and the
        # entries piece by piece as they are heard (each piece's own search: the pieces
        # end in pauses), so the first frames wait for the first piece, not the whole
        self._todo: list[tuple[int, int]] = (
            [(0, n)] if whole or drive.phones is None else list(drive.phones.pieces)
        )
        self._lock = threading.Lock()
        self.mask = region_mask()
        self._geometries: dict[int, tuple | None] = {} if geometries is None else geometries
        if whole:
            self._ready()

    def _modelled(self, audio, sr, fps, drive: Drive, lookahead: int | None):
        """(piece(a, b) -> target shapes of frames a..b, whether it is known whole now)
        for a bank with a model: the model's prediction, its opening blended with the
        drive's cue by the bank's share."""
        bank = self.bank
        n = drive.open.size
        target = bank.predict(audio, sr, fps, n, lookahead)
        rest = bank.rest_shape()
        span = max(float(np.quantile(bank.shapes[:, 0], WIDE)) - rest[0], 0.0)
        share = bank.drive_share
        if bank.drive_cue == "phones" and lookahead is not None:
            share = 0.0  # live: the phones need the utterance; the model alone
        heard = drive.phones if bank.drive_cue == "phones" and share > 0.0 else None
        if share > 0.0 and heard is None:
            cued = cue_opening(bank.drive_cue, audio, sr, fps, n, drive)
            target[:, 0] = share * (rest[0] + cued * span) + (1.0 - share) * target[:, 0]

        def piece(a: int, b: int) -> np.ndarray:
            got = target[a:b].copy()
            if heard is not None:
                heard.wait(b - 1)
                got[:, 0] = share * (rest[0] + heard.heard[a:b] * span) + (1.0 - share) * got[:, 0]
            return got

        return piece, heard is None

    def _ready(self, t: int | None = None) -> None:
        """The target and entries final up to frame t (None: all): each piece (the
        whole render, or the pieces the phones are heard in) blended and searched once
        it is known."""
        if not self._todo:
            return
        with self._lock:
            while self._todo and (t is None or self._todo[0][0] <= t):
                a, b = self._todo[0]
                w = self._weight[a:b]
                self.target[a:b] = w * self._piece(a, b) + (1.0 - w) * self._rest
                self.excess[a:b] = self._excess(a, b)  # the drive rests in silence itself
                # where speech asks for more than the footage holds, the search asks for
                # the bank's widest mouth and the renderer opens the one it finds the rest
                # of the way to what the speech asks (`beyond`)
                wanted = self.target[a:b].copy()
                top = float(self.bank.shapes[:, 0].max())
                past = self.excess[a:b] > 0.0
                wanted[past, 0] = top
                self.entries[a:b] = select(self.bank, wanted)
                short = top + self.excess[a:b] - self.bank.shapes[self.entries[a:b], 0]
                self.beyond_entry[a:b] = np.where(past, np.maximum(short, 0.0), 0.0)
                before = int(self.entries[a - 1]) if a else None
                self.other[a:b], self.other_weight[a:b] = fades(
                    self.bank, self.entries[a:b], before
                )
                self._todo.pop(0)

    def _excess(self, a: int, b: int) -> np.ndarray:
        """(b - a,) canonical opening frames a..b ask for past the footage's widest
        mouth (0 where they ask no more). The drive's opening o (0 to 1) asks for
        rest + o x span: the presenter's closed mouth opened as the renderer's own
        mouth opens it (`speech_span`, what the procedural mouth adds at 1), so footage
        that opens that wide is never opened further. Past the widest, the excess grows
        over BEYOND_RAMP into o x span, what the procedural mouth adds to a loop frame
        (whose own opening is at most the widest): so a bank opens at least as wide as
        its loop would without it, and without a step where it leaves the footage."""
        if self._span <= 0.0:
            return np.zeros(b - a, np.float32)
        self._drive.ready(b - 1)
        o = self._drive.open[a:b].astype(np.float32)
        rest, top = float(self._rest[0]), float(self.bank.shapes[:, 0].max())
        past = np.maximum(rest + o * self._span - top, 0.0)
        ramp = np.clip(past / BEYOND_RAMP, 0.0, 1.0)
        ramp = ramp * ramp * (3.0 - 2.0 * ramp)
        return (past + ramp * np.maximum(o * self._span - past, 0.0)).astype(np.float32)

    def beyond(self, t: int) -> float:
        """Canonical units output frame t's mouth opens past the bank entry it shows
        (0 but where the speech asks for more than the footage holds)."""
        if t >= self.entries.size:
            return 0.0
        self._ready(t)
        return float(self.beyond_entry[t])

    def shown_landmarks(self, t: int, idx: int) -> np.ndarray | None:
        """(68, 2) stored frame idx's landmarks with the lips and jaw of the mouth shown
        at output frame t (its entry's, morphed as `patch` morphs them), in frame pixels;
        None where the frame has no face."""
        lm = np.asarray(self.assets.landmarks[idx], np.float64)
        if not np.isfinite(lm).all():
            return None
        self._ready(t)
        bank, j = self.bank, int(self.entries[t])
        lips, jaw = bank.lips[j], None if bank.jaw is None else bank.jaw[j]
        if self.other_weight[t] > 0.0:  # a morph: both mouths' points meet halfway
            k, wk = int(self.other[t]), float(self.other_weight[t])
            lips = wk * bank.lips[k] + (1.0 - wk) * lips
            if jaw is not None:
                jaw = wk * bank.jaw[k] + (1.0 - wk) * jaw
        back = invert(to_canonical(lm))
        out = lm.copy()
        out[48:68] = apply(back, lips)
        if jaw is not None:
            out[4:13] = apply(back, jaw)
        return out

    def shapes(self) -> np.ndarray:
        """(T, 3) the shapes of the mouths shown: the entries', opened further where the
        speech asks for more than the footage holds (`beyond`)."""
        self._ready()
        got = self.bank.shapes[self.entries].copy()
        got[:, 0] += self.beyond_entry
        return got

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
        if self.other_weight[t] > 0.0:  # the run a jump left, fading out under it
            crop = morph(self.bank, int(self.other[t]), int(self.entries[t]), self.other_weight[t])
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

"""How far the mouth opens for each sound, from the phones a speech recogniser hears.

Loudness barely predicts a real person's lips (r 0.03 on average against the referee's
lip gap on the six real clips of bench_mouth_real, held out): a loud "ee" is nearly
shut and a quiet "ah" wide. The phones say more (Video Rewrite's visemes): PocketSphinx's
phone recogniser (its US English acoustic model and phone language model ship inside the
`pocketsphinx` wheel, BSD licence; nothing is downloaded) labels every 10 ms, each phone
has an opening (OPENING: open vowels widest, bilabials shut), and each video frame takes
the mean over the 10 ms frames it covers, co-articulated as the loudness drive is
(`audio.coarticulate`); a frame under the loudness drive's gate is shut. On the same six clips this follows the truth at r 0.26 on
average (-0.01 to 0.60 per clip).

The recogniser reads an utterance whole, so a render hears the audio in pieces cut at
pauses (`pieces`): the first, 1 s, before it starts, the rest while it runs, by a
thread that hands them to a worker process (`phone_worker`: the decoder holds the GIL)
up to AHEAD_SECONDS past the frame the render last asked for (`PhoneTrack`; the
recogniser runs at ~17x real time here, so its cost is spread over the render, not
spent in a burst while the first frames are made).
Only whole-file renders (files and streams) use it; a live render has one frame of
look-ahead and keeps to loudness.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

from pipeline.mouth.phone_worker import hear_apart
from pipeline.mouth.recogniser import hear

PHONE_FPS = 100  # the recogniser's frames per second
# ARPAbet phone -> opening of the jaw and lips, 0 shut .. 1 widest, by the phonetics of
# each sound (vowel height for vowels; the place of the closure for consonants)
OPENING = {
    "SIL": 0.0, "P": 0.0, "B": 0.0, "M": 0.0,
    "F": 0.15, "V": 0.15, "W": 0.15,
    "S": 0.2, "Z": 0.2,
    "TH": 0.3, "DH": 0.3, "T": 0.3, "D": 0.3, "N": 0.3, "Y": 0.3, "UW": 0.3,
    "SH": 0.3, "ZH": 0.3, "CH": 0.3, "JH": 0.3,
    "L": 0.35, "R": 0.35, "NG": 0.35,
    "K": 0.4, "G": 0.4, "ER": 0.4, "IY": 0.4, "UH": 0.4,
    "IH": 0.45, "HH": 0.5,
    "EY": 0.6, "OW": 0.6, "OY": 0.6, "EH": 0.65,
    "AH": 0.75, "AE": 0.85, "AO": 0.85, "AW": 0.85, "AY": 0.85, "AA": 0.95,
    "+NSN+": 0.1, "+SPN+": 0.2,  # noise, unknown speech
}  # fmt: skip
OTHER = 0.3  # a label the table lacks
PIECE_LEAST = 1.0  # s: the least audio heard as one utterance (`pieces`) ...
FIRST_PIECE = 1.0  # ... the most of the first, which a render waits for ...
PIECE = 4.0  # ... and of any other
PAUSE = 3  # frames under PAUSE_DB below the speech's median: a pause a piece may end in
PAUSE_DB = 20.0
AHEAD_SECONDS = 1.5  # how far past the frame a render last asked for the thread hears
HEARD = 1024  # pieces whose phones are kept, by their audio (a few hundred bytes each)

_heard: OrderedDict[tuple[bytes, int], tuple[tuple[str, int, int], ...]] = OrderedDict()
_heard_lock = threading.Lock()


def phones(samples: np.ndarray, sr: int, apart: bool = False) -> list[tuple[str, int, int]]:
    """(phone, first, last 10 ms frame) of mono float `samples` at `sr`: heard once per
    content (`HEARD`), since an editor previews the same speech, streams it and exports
    it, and each render cuts it into the same pieces. `apart`: heard by the worker
    process (`phone_worker`), not in this one."""
    samples = np.ascontiguousarray(samples, np.float32)
    key = (hashlib.blake2b(samples.tobytes(), digest_size=16).digest(), sr)
    with _heard_lock:
        if key in _heard:
            _heard.move_to_end(key)
            return list(_heard[key])
    got = hear_apart(samples, sr) if apart else hear(samples, sr)
    with _heard_lock:
        _heard[key] = tuple(got)
        while len(_heard) > HEARD:
            _heard.popitem(last=False)
    return got


def forget() -> None:
    """Drop what `phones` has heard (benches time a first hearing)."""
    with _heard_lock:
        _heard.clear()


def frame_phones(
    samples: np.ndarray, sr: int, fps: float, n_frames: int, apart: bool = False
) -> np.ndarray:
    """(n_frames,) float32: each video frame's mean phone opening over the 10 ms frames
    it covers, of `samples` heard as one utterance; 0 under the loudness gate."""
    from pipeline.render.audio import GATE_DB, frame_rms

    samples = np.asarray(samples, np.float32)
    fine = np.zeros(int(np.ceil(samples.size / sr * PHONE_FPS)) + 2, np.float32)
    if samples.size:
        for phone, first, last in phones(samples, sr, apart):
            fine[first : last + 1] = OPENING.get(phone, OTHER)
    # the 10 ms frames inside each video frame's span, by their centres
    centres = (np.arange(fine.size) + 0.5) / PHONE_FPS
    frame = np.minimum((centres * fps).astype(np.int64), n_frames)
    sums = np.bincount(frame, fine, minlength=n_frames + 1)[:n_frames]
    counts = np.bincount(frame, minlength=n_frames + 1)[:n_frames]
    out = np.where(counts > 0, sums / np.maximum(counts, 1), 0.0).astype(np.float32)
    # below the gate nothing is said, whatever the recogniser makes of the hiss
    rms = np.zeros(n_frames, np.float32)
    got = frame_rms(samples, sr, fps)[:n_frames]
    rms[: got.size] = got
    out[rms <= 10.0 ** (GATE_DB / 20.0)] = 0.0
    return out


def pieces(samples: np.ndarray, sr: int, fps: float, n_frames: int) -> list[tuple[int, int]]:
    """(first, end) frames of the pieces the audio is heard in: cut in the middle of
    pauses (PAUSE quiet frames or more), each at least PIECE_LEAST s long and at most
    PIECE s (FIRST_PIECE s the first; cut at the span's quietest frame where it has no
    pause), so that a render can start once the first is heard and the rest are heard
    while it runs."""
    from pipeline.render.audio import GATE_DB, frame_rms

    rms = np.zeros(n_frames, np.float32)
    got = frame_rms(np.asarray(samples, np.float32), sr, fps)[:n_frames]
    rms[: got.size] = got
    with np.errstate(divide="ignore"):
        db = 20.0 * np.log10(np.maximum(rms, 1e-12))
    loud = db > GATE_DB
    level = float(np.percentile(db[loud], 50)) if loud.any() else 0.0
    quiet = db < level - PAUSE_DB
    # the middle of each run of PAUSE quiet frames or more
    edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    cuts = [(a + b) // 2 for a, b in zip(starts, ends, strict=True) if b - a >= PAUSE]
    out: list[tuple[int, int]] = []
    first, shortest = 0, max(1, int(PIECE_LEAST * fps))
    longest = max(shortest, int(FIRST_PIECE * fps))  # the first: short, a render waits on it
    while first < n_frames:
        if n_frames - first <= longest:
            end = n_frames
        else:
            fits = [c for c in cuts if first + shortest <= c <= first + longest]
            if fits:
                end = int(fits[0])
            else:  # no pause: the quietest frame of the span
                lo = first + shortest
                end = lo + int(np.argmin(db[lo : first + longest + 1]))
        out.append((first, end))
        first, longest = end, max(shortest, int(PIECE * fps))
    return out


class PhoneTrack:
    """The phones' opening of `n_frames` video frames of `samples`, co-articulated
    `lookahead` frames ahead: the first piece (`pieces`) heard when it is made, the rest
    by a thread in order while the caller renders; `wait(t)` returns once frame t is
    final. Every frame's value is what `phone_opening` gives, whenever it is read."""

    def __init__(
        self,
        samples: np.ndarray,
        sr: int,
        fps: float,
        n_frames: int,
        lookahead: int = 3,
        gain: float = 1.0,
        weight: np.ndarray | None = None,
        ear=None,
        spread: np.ndarray | None = None,
    ) -> None:
        """`opening` is `heard` x `gain` (clipped to 1) x `weight` (n_frames,), if given.
        `ear` (`pipeline.mouth.ear.Ear`): `heard` is the ear's opening of each piece
        instead of the phones' table (`gain` unused), and its spread is written into
        `spread` (n_frames,) as each piece is heard."""
        self._ear, self._spread = ear, spread
        self.heard = np.zeros(n_frames, np.float32)  # the co-articulated phones, final ...
        self.opening = np.zeros(n_frames, np.float32)  # ... and scaled, up to `_final`
        self._gain, self._weight = gain, weight
        self._raw = np.zeros(n_frames, np.float32)
        self._final = 0
        self._wanted = 0  # the thread hears the pieces that start before this frame
        self._ahead = int(AHEAD_SECONDS * fps)
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._args = (np.asarray(samples, np.float32), sr, fps, lookahead)
        self.pieces = todo = pieces(samples, sr, fps, n_frames)
        if todo:
            self._hear(todo[0], len(todo) == 1)
        if len(todo) > 1:
            threading.Thread(
                target=self._hear_all, args=(todo[1:],), name="phones", daemon=True
            ).start()

    def _hear(self, piece: tuple[int, int], last: bool, apart: bool = False) -> None:
        from pipeline.render.audio import LOOKBACK, coarticulate

        samples, sr, fps, ahead = self._args
        a, b = piece
        cut = (int(round(a * sr / fps)), int(round(b * sr / fps)))
        if self._ear is not None:  # the ear reads its own window, inside the piece
            got, spread = self._ear.scaled(
                self._ear.predict(samples[cut[0] : cut[1]], sr, fps, b - a, apart)
            )
            scaled = got if self._weight is None else got * self._weight[a:b]
            with self._cond:
                if self._spread is not None:
                    self._spread[a:b] = spread
                self.heard[a:b], self.opening[a:b], self._final = got, scaled, b
                self._cond.notify_all()
            return
        self._raw[a:b] = frame_phones(samples[cut[0] : cut[1]], sr, fps, b - a, apart)
        n = self.opening.size
        done = n if last else max(self._final, b - ahead)  # later frames need the next piece
        lo = max(0, self._final - LOOKBACK)
        smooth = coarticulate(self._raw[lo : min(n, done + ahead)], ahead)
        got = smooth[self._final - lo : done - lo]
        scaled = np.minimum(got * self._gain, 1.0)
        if self._weight is not None:
            scaled = scaled * self._weight[self._final : done]
        with self._cond:
            self.heard[self._final : done] = got
            self.opening[self._final : done] = scaled
            self._final = done
            self._cond.notify_all()

    def _hear_all(self, todo: list[tuple[int, int]]) -> None:
        try:
            for k, piece in enumerate(todo):
                with self._cond:  # no further ahead of the render than it needs
                    self._cond.wait_for(lambda p=piece: p[0] <= self._wanted)
                self._hear(piece, k == len(todo) - 1, apart=True)
        except BaseException as e:  # the render waiting on it raises it
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def wait(self, t: int | None = None) -> np.ndarray:
        """`opening`, once frame t (None: every frame) is final (and `heard` with it)."""
        n = self.opening.size
        need = n if t is None else min(t + 1, n)
        with self._cond:
            if need + self._ahead > self._wanted:
                self._wanted = n if t is None else need + self._ahead
                self._cond.notify_all()
            self._cond.wait_for(lambda: self._final >= need or self._error is not None)
            if self._error is not None and self._final < need:
                raise RuntimeError(f"the phone recogniser failed: {self._error}") from self._error
        return self.opening


def phone_opening(
    samples: np.ndarray, sr: int, fps: float, n_frames: int, lookahead: int = 3
) -> np.ndarray:
    """(n_frames,) float32 in [0, 1]: the opening of each video frame's phones,
    co-articulated `lookahead` frames ahead (`PhoneTrack`, waited for whole)."""
    track = PhoneTrack(samples, sr, fps, n_frames, lookahead)
    track.wait()
    return track.heard

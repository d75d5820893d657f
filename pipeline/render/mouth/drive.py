"""Audio to mouth: how far the mouth opens and how it is shaped, per video frame.

1. loudness opens it (`audio.loudness_envelope`'s mapping: dB under the clip's speech
   level, over a 30 dB range), or, in a whole-file render (`phones`), the phones a
   speech recogniser hears (`pipeline/mouth/visemes.py`: open vowels wide, p, b, m
   shut), heard while the render runs: on real recorded speech loudness barely follows
   the lips (r 0.01 on average against the referee's lip gap on six real clips held
   out, bench_mouth_real's procedural mouth; the phones 0.24), on espeak-ng's the two
   follow them alike;
2. spectral shape widens or rounds it: the energy of the second-formant band (1.2-3.5
   kHz) against the first's (250-1000 Hz), relative to the clip's speech: "ee" puts
   energy high (spread), "oo" and "o" low (rounded);
3. with loudness, the lips close for p, b and m: a nasal murmur (voiced, almost nothing above 500 Hz)
   and a stop's closure (a sharp dip followed by a release) shut the mouth; the frame
   before closes half way (the lips are shut *before* the sound is heard) and the one
   after opens half way;
4. co-articulation: each frame is a weighted mean of its neighbours, from LOOKBACK
   frames back to `lookahead` ahead (the mouth moves towards the next sound before it
   starts: 3 frames in a whole-file render, the one frame a live render has);
5. silence rests the mouth (`pipeline/render/silence.py`).

With the setting `HOTPLATE_EAR=on`, a whole-file render's opening and shape come from
the ear instead (`pipeline/mouth/ear.py`: phones and cepstra to the mouth's opening and
width, trained once on real footage), heard in the same pieces as the phones while the
render runs (`visemes.PhoneTrack`); a render with a bank keeps the phones (its cue).

All of it is array arithmetic over frames: no loop per frame.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.render.audio import (  # the gate and co-articulation are shared with visemes.py
    GATE_DB,
    coarticulate,
    frame_rms,
    frame_spectra,
)
from pipeline.render.silence import DEFAULT as DEFAULT_SILENCE
from pipeline.render.silence import SilenceParams, speech_weight

if TYPE_CHECKING:
    from pipeline.mouth.visemes import PhoneTrack

RANGE_DB = 30.0  # dB of loudness from closed to fully open
LOW_BAND = (250.0, 1000.0)  # Hz: first formant
HIGH_BAND = (1200.0, 3500.0)  # Hz: second and third formants
SPREAD_SPAN = 1.0  # log2 units of high/low band energy from the speech's mean to fully spread
NASAL_CUT = 500.0  # Hz: a nasal murmur has almost nothing above this
NASAL_MARGIN = 1.0  # log10 units of low/high energy above the speech's median
NASAL_DIP_DB = 4.0  # ... and at least this far below the loudest frame near it
STOP_DIP_DB = 15.0  # a stop's closure: this far below the frames around it
STOP_RELEASE_DB = 10.0  # ... and then a release this much louder within two frames
NEAR = 3  # frames either side that "around it" means
LOOKAHEAD = 3  # whole-file renders; live renders have one frame
SHAPE_COARTICULATION = 2.5  # ... for the shape: lips round and spread over a syllable
WIDE_PHONES = 0.85  # the phones' opening that opens the mouth fully (ae, ao, aw, ay)
EAR_SETTING = "HOTPLATE_EAR"  # "on": whole-file renders take the ear's opening and shape


def ear_wanted() -> bool:
    """Whether the setting asks for the ear (`EAR_SETTING`)."""
    return os.environ.get(EAR_SETTING, "off").strip().lower() in ("on", "1", "true", "yes")


@dataclass
class Drive:
    open: np.ndarray  # (T,) float32 in [0, 1]; with `phones`, final once `ready` says
    spread: np.ndarray  # (T,) float32 in [-1, 1]: -1 rounded, +1 spread
    closed: np.ndarray  # (T,) bool: frames whose lips are shut for p, b, m (loudness's)
    loudness: np.ndarray | None = None  # (T,) the loudness opening, where `open` is not
    phones: PhoneTrack | None = None  # what fills `open`, while a render runs

    def ready(self, t: int | None = None) -> np.ndarray:
        """`open`, final up to frame t (None: every frame)."""
        if self.phones is not None:
            self.phones.wait(t)
        return self.open

    @property
    def by_loudness(self) -> np.ndarray:
        """(T,) the loudness opening, whichever cue `open` is."""
        return self.open if self.loudness is None else self.loudness


def band_energy(power: np.ndarray, freqs: np.ndarray, lo: float, hi: float) -> np.ndarray:
    band = (freqs >= lo) & (freqs < hi)
    return power[:, band].sum(1) + 1e-12


def local_max(x: np.ndarray, near: int = NEAR) -> np.ndarray:
    """Each frame's maximum over the `near` frames either side (itself left out)."""
    n = x.size
    pad = np.concatenate([np.full(near, -np.inf), x, np.full(near, -np.inf)])
    shifts = [pad[near + k : near + k + n] for k in range(-near, near + 1) if k]
    return np.max(np.stack(shifts), axis=0) if shifts else x.copy()


def closures(
    db: np.ndarray, power: np.ndarray, freqs: np.ndarray, speech: np.ndarray
) -> np.ndarray:
    """(T,) bool: frames where the lips are shut for a bilabial (m, and the closure of
    p and b). A nasal murmur: a speech frame whose energy is nearly all below NASAL_CUT
    and a little quieter than the vowels near it. A stop: a frame far quieter than its
    neighbours, followed by a release. (n, l, r, j and the closures of t, d, k, g look
    alike to this in espeak-ng's speech: the mouth closes too often, not too rarely.)"""
    n = db.size
    if n == 0 or not speech.any():
        return np.zeros(n, bool)
    low = band_energy(power, freqs, 80.0, NASAL_CUT)
    high = band_energy(power, freqs, NASAL_CUT, 5000.0)
    tilt = np.log10(low / high)
    near_max = local_max(db)
    nasal = (
        speech & (tilt > np.median(tilt[speech]) + NASAL_MARGIN) & (db < near_max - NASAL_DIP_DB)
    )
    nxt = np.maximum(np.append(db[1:], -np.inf), np.append(db[2:], [-np.inf, -np.inf]))
    # inside speech: speech on both sides (an onset after a pause is no closure)
    level = np.percentile(db[speech], 50)
    pad = np.concatenate([np.full(NEAR, -np.inf), db, np.full(NEAR, -np.inf)])
    before = np.max(np.stack([pad[NEAR - k : NEAR - k + n] for k in range(1, NEAR + 1)]), 0)
    after = np.max(np.stack([pad[NEAR + k : NEAR + k + n] for k in range(1, NEAR + 1)]), 0)
    inside = (before > level) & (after > level)
    stop = (db < near_max - STOP_DIP_DB) & (nxt > db + STOP_RELEASE_DB) & inside
    return nasal | stop


def mouth_drive(
    samples: np.ndarray,
    sr: int,
    fps: float,
    n_out: int,
    lookahead: int = LOOKAHEAD,
    silence: SilenceParams | None = DEFAULT_SILENCE,
    phones: bool = False,
    ear: bool | None = None,
) -> Drive:
    """Openness, shape and closures of the mouth for each of `n_out` output frames of
    `samples` (float32 mono at `sr`), looking `lookahead` frames ahead; `phones`: the
    opening from the recognised phones, heard while the caller renders (`Drive.ready`),
    not from loudness (a whole-file render: a live one has one frame ahead); `ear`: with
    `phones`, the opening and shape from the ear instead (None: as the setting says,
    `ear_wanted`; a render with a bank passes False, the bank reads the phones itself)."""
    samples = np.asarray(samples, np.float32)
    power, freqs = frame_spectra(samples, sr, fps)
    rms = frame_rms(samples, sr, fps)
    with np.errstate(divide="ignore"):
        db = 20.0 * np.log10(np.maximum(rms, 1e-12))
    loud = db > GATE_DB
    n = db.size
    opening = np.zeros(n, np.float32)
    spread = np.zeros(n, np.float32)
    speech = np.zeros(n, bool)
    if loud.any():
        # 1. loudness
        ref = float(np.percentile(db[loud], 95))
        opening = np.where(loud, np.clip((db - (ref - RANGE_DB)) / RANGE_DB, 0.0, 1.0), 0.0)
        speech = loud & (db > ref - RANGE_DB)
        # 2. spectral shape, relative to the clip's speech
        ratio = np.log2(
            band_energy(power, freqs, *HIGH_BAND) / band_energy(power, freqs, *LOW_BAND)
        )
        if speech.any():
            centre = float(ratio[speech].mean())
            spread = np.where(speech, np.clip((ratio - centre) / SPREAD_SPAN, -1.0, 1.0), 0.0)
    # 3. lips shut for m, p, b
    shut = closures(db, power, freqs, speech)
    # 4. co-articulation over the shut lips, which stay shut (and half shut the frame
    # before: the lips close before the sound), so the mouth eases out of a closure
    opening = np.where(shut, 0.0, opening).astype(np.float32)
    opening = coarticulate(opening, lookahead)
    spread = coarticulate(spread.astype(np.float32), lookahead, width=SHAPE_COARTICULATION)
    gate = shut.astype(np.float32)
    if n > 1:  # the frame after a closure opens half way: a release takes two frames
        after = 0.5 * np.concatenate([[0.0], gate[:-1]])
        before = 0.5 * np.append(gate[1:], 0.0) if lookahead >= 1 else 0.0
        gate = np.maximum(gate, np.maximum(after, before))
    opening = opening * (1.0 - gate)
    # 5. silence rests
    weight = np.ones(n, np.float32)
    if silence is not None:
        weight = speech_weight(samples, sr, fps, silence)[:n]
        opening = opening * weight

    def fit(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        out = np.full(n_out, fill, x.dtype)
        out[: min(n_out, x.size)] = x[:n_out]
        return out

    loud = fit(opening.astype(np.float32))
    spread, shut = fit(spread.astype(np.float32)), fit(shut)
    if not phones:
        return Drive(loud, spread, shut)
    from pipeline.mouth.visemes import PhoneTrack

    heard = None
    if ear_wanted() if ear is None else ear:  # the ear's opening and spread, per piece
        from pipeline.mouth.ear import load

        heard, spread = load(), np.zeros(n_out, np.float32)
    track = PhoneTrack(
        samples,
        sr,
        fps,
        n_out,
        lookahead,
        1.0 / WIDE_PHONES,
        fit(weight.astype(np.float32)),
        heard,
        spread,
    )
    return Drive(track.opening, spread, shut, loud, track)

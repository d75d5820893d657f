"""Where the mouth rests: silences longer than a threshold, found in the audio.

`speech_weight` gives one value per video frame: 1 where the renderer speaks, 0 where
the mouth rests, with linear fades between. A frame is quiet when its RMS is below
`gate_db` dBFS or more than `silence_db` below the clip's speech level (the 95th
percentile of the voiced frames, as the loudness envelope measures it). A run of quiet
frames at least `min_silence` seconds long rests; shorter gaps between words do not
(a mouth that shuts for every gap looks like chattering). The weight falls to 0 over
`fade` seconds from the start of the run and is back at 1 when speech resumes (the
fade-in happens inside the silence), so speech never starts from a jump: no pop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.render.audio import frame_rms


@dataclass(frozen=True)
class SilenceParams:
    min_silence: float = 0.3  # s: shorter quiet runs keep talking
    silence_db: float = 24.0  # dB below the speech level that counts as quiet
    gate_db: float = -50.0  # dBFS: always quiet below this
    fade: float = 0.12  # s: the weight's ramp at each end of a rest


DEFAULT = SilenceParams()


def quiet_frames(
    samples: np.ndarray, sr: int, fps: float, p: SilenceParams = DEFAULT
) -> np.ndarray:
    """(T,) bool: frames quieter than the thresholds."""
    rms = frame_rms(np.asarray(samples, np.float32), sr, fps)
    with np.errstate(divide="ignore"):
        db = 20.0 * np.log10(rms)
    voiced = db > p.gate_db
    if not voiced.any():
        return np.ones(rms.shape, bool)
    ref = float(np.percentile(db[voiced], 95))
    return ~voiced | (db < ref - p.silence_db)


def speech_weight(
    samples: np.ndarray, sr: int, fps: float, p: SilenceParams = DEFAULT
) -> np.ndarray:
    """(T,) float32 in [0, 1] per video frame: 0 where the mouth rests."""
    quiet = quiet_frames(samples, sr, fps, p)
    return rest_weight(quiet, fps, p)


def quiet_runs(quiet: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of each run of True in a (T,) bool, ends exclusive."""
    edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
    return np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)


def rest_weight(quiet: np.ndarray, fps: float, p: SilenceParams = DEFAULT) -> np.ndarray:
    """The weight for a (T,) bool of quiet frames (see the module's docstring)."""
    quiet = np.asarray(quiet, bool)
    n = quiet.size
    w = np.ones(n, np.float32)
    run_min = max(1, int(round(p.min_silence * fps)))
    ramp = max(1, int(round(p.fade * fps)))
    starts, ends = quiet_runs(quiet)
    long = ends - starts >= run_min
    starts, ends = starts[long], ends[long]
    if starts.size == 0:
        return w
    # each frame of a long run knows its run's start and end
    run_of = np.cumsum(np.isin(np.arange(n), starts)) - 1
    inside = np.zeros(n, bool)
    for s0, e0 in zip(starts.tolist(), ends.tolist(), strict=True):  # one slice per run
        inside[s0:e0] = True
    k = np.flatnonzero(inside)
    t, end = starts[run_of[k]], ends[run_of[k]]
    # down from the run's start, up again to reach 1 at `end` (speech resumes); a run at
    # the clip's start or end has no speech on that side to fade from
    down = np.where(t > 0, np.clip((k - t + 1) / ramp, 0, 1), 1.0)
    up = np.where(end < n, np.clip((end - k) / ramp, 0, 1), 1.0)
    w[k] = (1.0 - np.minimum(down, up)).astype(np.float32)
    return w

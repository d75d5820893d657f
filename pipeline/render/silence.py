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


def rest_weight(quiet: np.ndarray, fps: float, p: SilenceParams = DEFAULT) -> np.ndarray:
    """The weight for a (T,) bool of quiet frames (see the module's docstring)."""
    n = quiet.size
    w = np.ones(n, np.float32)
    run_min = max(1, int(round(p.min_silence * fps)))
    ramp = max(1, int(round(p.fade * fps)))
    t = 0
    while t < n:
        if not quiet[t]:
            t += 1
            continue
        end = t
        while end < n and quiet[end]:
            end += 1
        if end - t >= run_min:
            k = np.arange(t, end)
            # down from the run's start, up again to reach 1 at `end` (speech resumes);
            # a run at the clip's start or end has no speech on that side to fade from
            down = np.clip((k - t + 1) / ramp, 0, 1) if t > 0 else np.ones(k.size)
            up = np.clip((end - k) / ramp, 0, 1) if end < n else np.ones(k.size)
            w[t:end] = (1.0 - np.minimum(down, up)).astype(np.float32)
        t = end
    return w

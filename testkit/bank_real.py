"""Any footage is a bank, measured on real talking footage: `python -m testkit.bank_real [FRAMES] [CLIP ...]`.

For each clip of testkit/footage/ (every one by default), a presenter loop of its first
FRAMES frames (100: 4 s) with the sound stripped, put in a personas folder and
precompiled as the watcher does it (its avatar, and its bank: the loop's own mouths),
then rendered (`lip_sync`, whole file) speaking new words (espeak-ng, not the clip's).
The referee's lip gap (dlib, testkit/referee.py) on every 2nd output frame is
correlated with the opening the new speech asks for (`asked_opening`, the measure of
tests/pipeline/test_mouth_footage_bank.py) and with the loop's own lip gap on the stored
frame under each output frame (its own words: near 0 when they are gone). Also printed:
how closely the entries shown follow the target (face mesh's openings), and how many
frames a jump between runs morphs. One line a clip; docs/notebook/mouth.md quotes them.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

# the words the loops are made to say (tests/pipeline/test_mouth_footage_bank.py's)
NEW_WORDS = (
    "Peter Piper picked a peck of pickled peppers. How much wood would a woodchuck chuck. "
    "She sells sea shells by the sea shore."
)


def measure(name: str, frames: int, wav: Path, tmp: Path) -> dict:
    """The figures of clip `name`'s first `frames` frames as a silent loop with its bank."""
    from cachestore.store import forget_store, open_store
    from hotplate.demo_data import write_loop_video
    from pipeline.hot import load_assets, load_bank
    from pipeline.lip_sync import LipSyncRequest, lip_sync
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile_source
    from pipeline.render.audio import load_audio
    from pipeline.render.renderers.warp import WarpRenderer
    from pipeline.render.schedule import schedule
    from testkit import footage
    from testkit.mouth_fixtures import asked_opening, correlation, referee_gaps, video_frames

    clip = footage.load(name)
    shot = list(clip.frames[:frames])
    (tmp / "personas" / name).mkdir(parents=True)
    loop = write_loop_video(tmp / "personas" / name / "talk.mp4", shot, fps=clip.fps)
    store = open_store(tmp / f"store_{name}")
    try:
        _, bank = precompile_source(loop, Recipe(), store)
        out = tmp / f"{name}.mp4"
        got = lip_sync(store, tmp / "personas", Recipe(), LipSyncRequest(name, "talk", wav, out))
        rendered = video_frames(out)
        n = len(rendered)
        assets = load_assets(store, got.avatar)
        gaps = referee_gaps(rendered, 2)
        asked = asked_opening(assets, wav, n)
        own = referee_gaps(shot)[schedule(n, len(shot), "pingpong")]
        # the search on its own: the entries' openings against the target's
        assets.bank = load_bank(store, got.bank)
        r = WarpRenderer()
        r.prepare(assets, load_audio(wav, r.sample_rate), r.sample_rate, n, clip.fps)
        mouths = r._bank
        shown = mouths.shapes()[:, 0]
        return {
            "bank": bank is not None and got.bank == bank.avatar,
            "entries": assets.bank.size,
            "new": correlation(asked[::2], gaps),
            "own": correlation(own[::2], gaps),
            "search": correlation(shown, mouths.target[:, 0]),
            "morphed": int(np.sum(mouths.other_weight > 0)),
            "frames": n,
        }
    finally:
        forget_store(tmp / f"store_{name}")


def main(argv: list[str]) -> None:
    from testkit import footage
    from testkit.mouth_fixtures import espeak

    frames = int(argv[0]) if argv else 100
    names = argv[1:] or [c.name for c in footage.presenters()]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        wav = espeak(NEW_WORDS, tmp / "new.wav")
        for name in names:
            got = measure(name, frames, wav, tmp)
            print(
                f"{name}: a {frames}-frame loop, no sound, its own bank ({got['entries']} "
                f"mouths, used: {got['bank']}): r = {got['new']:.3f} against the new speech, "
                f"{got['own']:.3f} against its own words; the search follows its target at "
                f"{got['search']:.3f}; {got['morphed']} of {got['frames']} frames morphed",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])

"""Stilling measured on real talking footage: `python -m testkit.still_real [FRAMES] [CLIP ...]`.

For each clip of testkit/footage/ (every one by default), a presenter loop of its first FRAMES
frames (100: 4 s) with the sound stripped, precompiled with the still stage and without it
(`Recipe(still="off")`), each rendered by the warp renderer speaking new words (espeak-ng,
not the clip's), and the referee's lip gap (dlib, testkit/referee.py) correlated with the
opening the new speech asks for (`asked_opening`; the measure of
tests/pipeline/test_mouth_still.py) and, as it was measured while loudness opened the
mouth, with the speech's loudness envelope. Prints one line a clip; docs/notebook/stilling.md
quotes them.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

# the words the loops are made to say (tests/pipeline/test_mouth_still.py's NEW_WORDS)
NEW_WORDS = (
    "Peter Piper picked a peck of pickled peppers. How much wood would a woodchuck chuck. "
    "She sells sea shells by the sea shore."
)
FPS = 25.0


def measure(name: str, frames: int, wav: Path, tmp: Path) -> dict:
    """r stilled and as shot for clip `name`'s first `frames` frames, and the stage's meta."""
    from cachestore.store import forget_store, open_store
    from hotplate.demo_data import write_loop_video
    from pipeline.hot import load_assets
    from pipeline.precompile.recipe import Recipe
    from pipeline.precompile.run import precompile
    from pipeline.render.audio import load_audio, loudness_envelope
    from pipeline.render.video import render_video
    from testkit import footage
    from testkit.mouth_fixtures import asked_opening, correlation, referee_gaps, video_frames

    env = loudness_envelope(load_audio(wav, 16000), 16000, FPS)
    clip = footage.load(name)
    video = write_loop_video(tmp / f"{name}.mp4", list(clip.frames[:frames]), fps=clip.fps)
    store = open_store(tmp / f"store_{name}")
    out: dict = {}
    try:
        for label, recipe in (("stilled", Recipe()), ("as shot", Recipe(still="off"))):
            assets = load_assets(store, precompile(video, recipe, store).avatar)
            if label == "stilled":
                out["meta"] = store.get_stage(store.get_avatar(assets.key)["stages"]["still"]).meta
            rendered = video_frames(render_video(assets, wav, tmp / f"{name}_{label}.mp4").out_path)
            gaps = referee_gaps(rendered, 2)
            out[label] = correlation(asked_opening(assets, wav, len(rendered), FPS)[::2], gaps)
            out[f"{label}, envelope"] = correlation(env[: len(rendered) : 2], gaps)
    finally:
        forget_store(tmp / f"store_{name}")
    return out


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
            meta = got["meta"]
            print(
                f"{name}: {frames} frames, {meta['reason']}, spread {meta.get('spread')}, "
                f"{meta['stilled']} stilled: r = {got['stilled']:.3f} stilled, "
                f"{got['as shot']:.3f} as shot (against the envelope: "
                f"{got['stilled, envelope']:.3f}, {got['as shot, envelope']:.3f})",
                flush=True,
            )


if __name__ == "__main__":
    main(sys.argv[1:])

"""The real talking footage (testkit/footage/): each clip is listed with where it came
from and its licence, is the file the list names, and decodes to a face speaking with
its own sound (what bench/bench_mouth_real.py holds out against)."""

from __future__ import annotations

import re

import numpy as np

from pipeline.mouth.bank import speech_frames
from testkit import footage
from testkit.referee import referee_points

SOURCE = re.compile(r"^[\w.-]+/[\w.-]+@[0-9a-f]{40}:\S+$")  # owner/repo@commit:path


def test_every_clip_is_listed_with_its_source_and_licence():
    clips = footage.clips()
    names = [c.name for c in clips]
    assert len(names) == len(set(names)) >= 3
    assert len({c.person for c in clips}) == len(clips)  # different people
    for c in clips:
        assert SOURCE.match(c.source), f"{c.name}: source {c.source!r} is not repo@commit:path"
        assert c.licence and c.rights and c.origin and c.person, c.name
        assert c.path.is_file(), f"{c.name}: {c.path} is not committed"
        assert c.path.stat().st_size <= 4_000_000, f"{c.name} is over 4 MB"
        assert c.digest() == c.sha256, f"{c.name}: {c.path} is not the file the manifest lists"


def test_every_clip_decodes_to_a_face_speaking_with_its_own_sound():
    for c in footage.clips():
        got = footage.load(c.name)
        n = got.frames.shape[0]
        assert n >= 100 and got.frames.shape[3] == 3, c.name
        seconds = got.audio.size / got.sr
        assert abs(seconds - n / got.fps) < 0.1, f"{c.name}: {seconds} s of sound, {n} frames"
        # sound, and mostly speech by the mouth bank's own measure (a talking clip)
        assert float(np.sqrt(np.mean(got.audio**2))) > 0.01, c.name
        assert speech_frames(got.audio, got.sr, got.fps, n).mean() > 0.5, c.name
        for t in (0, n // 2, n - 1):
            assert referee_points(got.frames[t]) is not None, f"{c.name}: no face at frame {t}"


def test_a_piece_of_a_clip_written_back_keeps_its_frames_and_sound_in_step(tmp_path):
    """`write_clip` is how the held-out bench makes a persona's speech.mp4: the piece
    decodes to the same number of frames at the same rate, its sound the same samples
    from the same start (AAC's priming is trimmed; its
    last frame's padding is silence), the picture close to the source."""
    from pipeline.render.audio import load_audio
    from testkit.mouth_fixtures import psnr, video_frames

    got = footage.load("katie_hill")
    cut = 60
    path = footage.write_clip(
        tmp_path / "speech.mp4", got.frames[:cut], got.audio[: got.samples_at(cut)], got.sr, got.fps
    )
    from pipeline.media import probe

    frames = video_frames(path)
    assert len(frames) == cut and probe(path).fps == got.fps
    assert min(psnr(a, b) for a, b in zip(frames, got.frames[:cut], strict=True)) > 35.0
    sound = load_audio(path, got.sr)
    n = got.samples_at(cut)
    # AAC pads its last 1024-sample frame with silence: less than one video frame more
    assert 0 <= sound.size - n < got.sr / got.fps, (sound.size, n)
    m = min(sound.size, n) - 2048
    assert np.corrcoef(sound[1024:m], got.audio[1024:m])[0, 1] > 0.99  # in step, not shifted

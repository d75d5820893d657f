import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hotplate.demo_data import write_wav
from pipeline.render.audio import AudioError, load_audio, loudness_envelope
from pipeline.render.encode import Mp4Writer
from pipeline.render.renderers import load_renderer
from pipeline.render.renderers.base import Renderer, blend
from pipeline.render.renderers.warp import WarpRenderer
from pipeline.render.schedule import schedule
from pipeline.render.video import render_video
from testkit.render_fixtures import FULL, build_assets, full_mask, read_video, speech

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return 10 * np.log10(255**2 / mse) if mse > 0 else np.inf


def leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


# -- blend ------------------------------------------------------------------------
def test_blend_is_bit_exact_outside_the_mask_and_clips_to_the_frame():
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    frame.flags.writeable = False
    region = rng.integers(0, 256, (30, 30, 3), dtype=np.uint8)
    box = [-10, -10, 20, 20]  # the square hangs off the top-left corner
    mask = np.zeros((30, 30), np.uint8)
    mask[15:, 15:] = 255  # frame pixels [5, 20)
    mask[10:15, 10:15] = 128  # frame pixels [0, 5)
    out = blend(frame, region, box, mask, box)
    keep = np.ones((40, 50), bool)
    keep[0:10, 0:10] = False
    keep[0:5, 0:5] = False  # mask 0 at [0:5, 5:10] etc. stays too
    assert np.array_equal(out[5:20, 5:20], region[15:30, 15:30])
    assert (
        np.abs(
            out[0:5, 0:5].astype(int) - (frame[0:5, 0:5].astype(int) + region[10:15, 10:15]) / 2
        ).max()
        <= 1
    )
    changed = np.any(out != frame, axis=-1)
    assert not changed[20:, :].any() and not changed[:, 20:].any()
    assert not changed[0:5, 5:10].any() and not changed[5:10, 0:5].any()


def test_blend_resizes_mask_and_region():
    frame = np.full((64, 64, 3), 10, np.uint8)
    region = np.full((8, 8, 3), 200, np.uint8)  # covers [16, 48) once resized
    mask = np.full((4, 4), 255, np.uint8)  # covers [8, 56) once resized
    out = blend(frame, region, [16, 16, 48, 48], mask, [8, 8, 56, 56])
    assert (out[16:48, 16:48] == 200).all()
    assert (out[8:16] == 10).all() and (out[:, 48:] == 10).all()  # mask > 0 but no region
    target = frame.copy()
    assert (
        blend(frame, region, [100, 100, 108, 108], mask, [100, 100, 104, 104], out=target) is target
    )


def test_load_renderer():
    assert isinstance(load_renderer("warp"), Renderer)
    with pytest.raises(ValueError, match="'dance' is not one of warp, musetalk"):
        load_renderer("dance")


# -- warp on its own --------------------------------------------------------------
def test_warp_opens_the_mouth_inside_the_mask_only():
    assets = build_assets()
    r = WarpRenderer()
    audio = np.concatenate([np.zeros(48000, np.float32), speech(1.0, 48000)])
    r.prepare(assets, audio, 48000, 50, 25.0)
    frame = assets.load_frame(2)
    closed = r.render_batch([0], [2], [frame])[0]
    assert np.array_equal(closed, frame)  # silence: the stored frame, untouched
    t = int(np.argmax(r.openness()))
    opened = r.render(t, 2, frame)
    outside = full_mask(assets, 2) == 0
    assert np.array_equal(opened[outside], frame[outside])
    x1, y1, x2, y2 = assets.crop_boxes[2]
    mouth = np.abs(opened[y1:y2, x1:x2].astype(int) - frame[y1:y2, x1:x2]).mean()
    assert mouth > 2.0
    # The opened gap (below the teeth the smile shows) gets darker than it was.
    plan = r._plan(2)
    moved = plan.moved_inner(float(r.openness()[t]), float(r.shape()[t]))
    cx = int(round(moved[[2, 6], 0].mean()))
    cy = int(round(0.3 * moved[2, 1] + 0.7 * moved[6, 1]))
    patch = np.s_[cy - 1 : cy + 2, cx - 2 : cx + 3]
    assert opened[patch].mean() < frame[patch].mean() - 10


# -- render_video -----------------------------------------------------------------
def check_video(path, assets, seconds, fps):
    frames, info = read_video(path)
    assert info["video_codec"] == "h264" and info["audio_codec"] == "aac"
    assert (info["width"], info["height"]) == (assets.width, assets.height)
    assert abs(len(frames) - round(seconds * fps)) <= 1
    assert abs(info["audio_seconds"] - seconds) < 1 / fps
    return frames


def test_render_follows_the_audio_and_leaves_the_rest(tmp_path):
    assets = build_assets(6)
    seconds, fps = 6.0, 25.0
    wav = write_wav(tmp_path / "speech.wav", speech(seconds, 16000, seed=3), 16000)
    calls = []
    report = render_video(
        assets, wav, tmp_path / "out.mp4", progress=lambda d, n: calls.append((d, n))
    )
    assert report.frames == 150 and report.fps == 25.0 and report.backend == "warp"
    assert report.out_path == tmp_path / "out.mp4" and report.audio_seconds == pytest.approx(6.0)
    assert 0 < report.first_frame_seconds <= report.wall_seconds and report.render_fps > 0
    assert calls[-1] == (150, 150) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    frames = check_video(report.out_path, assets, seconds, fps)
    assert leftovers(tmp_path) == []

    idxs = schedule(len(frames), assets.n_frames, "pingpong")
    env = loudness_envelope(load_audio(wav, 48000), 48000, fps)[: len(frames)]
    change, outside_err, outside_psnr = [], [], []
    for t, (got, i) in enumerate(zip(frames, idxs, strict=True)):
        stored = assets.load_frame(i)
        x1, y1, x2, y2 = assets.crop_boxes[i]
        change.append(np.abs(got[y1:y2, x1:x2].astype(int) - stored[y1:y2, x1:x2]).mean())
        if t % 10 == 0:
            out = full_mask(assets, i) == 0
            outside_err.append(np.abs(got[out].astype(int) - stored[out]).mean())
            outside_psnr.append(psnr(got[out], stored[out]))
    r = np.corrcoef(change, env)[0, 1]
    assert r >= 0.5, f"mouth change vs loudness: Pearson {r:.2f}"
    # Outside the mask: the stored frame up to codec error. The codec's own error is
    # measured on the same stored frames encoded without any rendering.
    baseline = tmp_path / "baseline.mp4"
    with Mp4Writer(
        baseline, assets.width, assets.height, fps, audio=np.zeros(1600, np.float32)
    ) as w:
        for i in idxs[::10]:
            w.write(assets.load_frame(i))
    codec_err = []
    for got, i in zip(read_video(baseline)[0], idxs[::10], strict=True):
        out = full_mask(assets, i) == 0
        codec_err.append(np.abs(got[out].astype(int) - assets.load_frame(i)[out]).mean())
    assert max(outside_err) < 3 and min(outside_psnr) > 35
    assert np.mean(outside_err) < np.mean(codec_err) + 0.3


def test_cycle_mode_shows_t_mod_n(tmp_path):
    assets = build_assets(6)
    wav = write_wav(tmp_path / "a.wav", speech(1.0, 16000), 16000)
    report = render_video(assets, wav, tmp_path / "cycle.mp4", loop="cycle", fps=10)
    frames = check_video(report.out_path, assets, 1.0, 10)
    stored = [assets.load_frame(i) for i in range(assets.n_frames)]
    outside = [full_mask(assets, i) == 0 for i in range(assets.n_frames)]
    for t, got in enumerate(frames):
        err = [
            np.abs(got[outside[i]].astype(int) - s[outside[i]]).mean() for i, s in enumerate(stored)
        ]
        # The synthetic loop is seamless (frame 5 == frame 0), so allow ties.
        assert err[t % 6] <= min(err) + 0.05 and err[t % 6] < 3
        assert err[(t + 2) % 6] > 10


@pytest.mark.slow
def test_full_hd_render(tmp_path):
    assets = build_assets(4, FULL)
    seconds = 1.6
    wav = write_wav(tmp_path / "a.wav", speech(seconds, 16000, seed=2), 16000)
    report = render_video(assets, wav, tmp_path / "hd.mp4")
    frames = check_video(report.out_path, assets, seconds, 25)
    idxs = schedule(len(frames), 4)
    for t in (0, len(frames) // 2, len(frames) - 1):
        stored = assets.load_frame(idxs[t])
        out = full_mask(assets, idxs[t]) == 0
        assert np.abs(frames[t][out].astype(int) - stored[out]).mean() < 3


def test_interrupted_render_leaves_nothing(tmp_path):
    assets = build_assets(6)
    wav = write_wav(tmp_path / "a.wav", speech(3.0, 16000), 16000)
    (tmp_path / "keep.mp4").write_bytes(b"old")

    def stop_midway(done, total):
        if done >= total // 2:
            raise KeyboardInterrupt

    for name in ("new.mp4", "keep.mp4"):
        with pytest.raises(KeyboardInterrupt):
            render_video(assets, wav, tmp_path / name, progress=stop_midway)
    assert not (tmp_path / "new.mp4").exists()
    assert (tmp_path / "keep.mp4").read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_bad_inputs_fail_before_any_work(tmp_path):
    assets = build_assets(6)
    calls = []
    # The audio does not exist either: the directory must be reported first.
    with pytest.raises(ValueError, match="output directory .*missing.* does not exist") as err:
        render_video(
            assets, tmp_path / "no.wav", tmp_path / "missing" / "o.mp4", progress=calls.append
        )
    assert not isinstance(err.value, AudioError) and calls == []
    with pytest.raises(ValueError, match="loop='bounce'"):
        render_video(assets, tmp_path / "no.wav", tmp_path / "o.mp4", loop="bounce")
    with pytest.raises(ValueError, match="backend='dance'"):
        render_video(assets, tmp_path / "no.wav", tmp_path / "o.mp4", backend="dance")
    with pytest.raises(ValueError, match="is a directory"):
        render_video(assets, tmp_path / "no.wav", tmp_path)
    with pytest.raises(AudioError, match="no.wav"):
        render_video(assets, tmp_path / "no.wav", tmp_path / "o.mp4")
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"RIFF nonsense" * 100)
    with pytest.raises(AudioError, match="garbage.wav"):
        render_video(assets, garbage, tmp_path / "o.mp4")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.wav"]


MEMORY_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from pipeline.render.video import render_video
    from hotplate.demo_data import write_wav
    from testkit.render_fixtures import build_assets, speech
    seconds, out = float(sys.argv[1]), sys.argv[2]
    assets = build_assets(6, (240, 426))
    wav = write_wav(out + ".wav", speech(seconds, 16000), 16000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    report = render_video(assets, wav, out)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(before, after, report.frames)
    """
)


@pytest.mark.slow
def test_memory_does_not_grow_with_audio_length(tmp_path):
    peaks = {}
    for seconds in (10, 60):
        res = subprocess.run(
            [sys.executable, "-c", MEMORY_SCRIPT, str(seconds), str(tmp_path / f"{seconds}.mp4")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        before, after, frames = (int(v) for v in res.stdout.split()[-3:])
        assert frames == seconds * 25
        peaks[seconds] = after  # KiB on Linux
    growth_mb = (peaks[60] - peaks[10]) / 1024
    # 50 more seconds of 240x426 frames would be ~380 MB if anything kept them; the
    # audio itself (48 kHz float32) is ~10 MB more.
    assert growth_mb < 40, f"peak RSS grew {growth_mb:.0f} MB from 10 s to 60 s of audio"

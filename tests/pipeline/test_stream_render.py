"""Fragmented MP4 as it is made: the writer's segments, render_video with a sink, the
frame cache of the hot path, and the live renderer fed PCM in chunks."""

import io
import itertools
import struct

import numpy as np
import pytest

from hotplate.demo_data import write_wav
from pipeline.frames import ScheduledFrames
from pipeline.render.audio import n_video_frames
from pipeline.render.fmp4 import FragmentWriter, fragment_frames, fragment_starts
from pipeline.render.live import live_render
from pipeline.render.schedule import schedule
from pipeline.render.video import render_video
from testkit.render_fixtures import build_assets, speech, threads_down_to

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

FPS = 25.0


def boxes(data: bytes) -> list[tuple[str, bytes]]:
    out, at = [], 0
    while at < len(data):
        size = struct.unpack(">I", data[at : at + 4])[0]
        out.append((data[at + 4 : at + 8].decode(), data[at : at + size]))
        at += size
    return out


def video_facts(data: bytes) -> dict:
    import av

    with av.open(io.BytesIO(data)) as c:
        v = c.streams.video[0]
        keys, frames = [], []
        for k, p in enumerate(p for p in c.demux(v) if p.pts is not None):
            if p.is_keyframe:
                keys.append(k)
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    with av.open(io.BytesIO(data)) as c:
        a = c.streams.audio[0]
        samples = sum(f.samples for f in c.decode(a))
        rate = a.rate
    return {"keys": keys, "frames": frames, "audio_seconds": samples / rate}


def test_fragment_writer_sends_init_then_keyframe_fragments():
    segs = []
    audio = speech(2.0, 48000)
    with FragmentWriter(lambda k, b: segs.append((k, b)), 64, 48, FPS, audio, 48000) as w:
        for t in range(50):
            w.write(np.full((48, 64, 3), 4 * t, np.uint8))
    kinds = [k for k, _ in segs]
    assert kinds[0] == "init" and set(kinds[1:]) == {"fragment"}
    assert [b for b, _ in boxes(segs[0][1])] == ["ftyp", "moov"]
    for _, frag in segs[1:]:
        assert [b for b, _ in boxes(frag)] == ["moof", "mdat"]
    starts = list(itertools.takewhile(lambda t: t < 50, fragment_starts(fragment_frames(FPS))))
    assert len(segs) - 1 == len(starts)
    facts = video_facts(b"".join(b for _, b in segs))
    assert len(facts["frames"]) == 50 and facts["keys"] == starts
    assert np.diff([*starts, 50]).max() == fragment_frames(FPS) == 12  # <= 0.5 s
    assert abs(facts["audio_seconds"] - 2.0) < 0.05


@pytest.mark.parametrize("profile", ["preview", "export"])
def test_a_stream_holds_the_same_pictures_as_a_file_of_its_profile(tmp_path, profile):
    # The stream and the file of one encoder profile: the same x264 settings and
    # keyframes, so the decoded pictures are equal byte for byte; only the container
    # differs (fragmented or not).
    assets = build_assets(6)
    wav = write_wav(tmp_path / "a.wav", speech(3.0, 16000), 16000)
    segs = []
    rep = render_video(
        assets, wav, tmp_path / "s.mp4", sink=lambda k, b: segs.append(b), profile=profile
    )
    assert (tmp_path / "s.mp4").read_bytes() == b"".join(segs)  # the file is the stream
    whole = render_video(assets, wav, tmp_path / "w.mp4", profile=profile)
    assert rep.profile == whole.profile == profile
    assert rep.frames == whole.frames == n_video_frames(3.0, FPS)
    streamed = video_facts(b"".join(segs))
    filed = video_facts((tmp_path / "w.mp4").read_bytes())
    assert len(streamed["frames"]) == len(filed["frames"]) == rep.frames
    assert streamed["keys"] == filed["keys"]
    for t, (fa, fb) in enumerate(zip(streamed["frames"], filed["frames"], strict=True)):
        assert np.array_equal(fa, fb), f"frame {t} differs between the stream and the file"


def test_streams_default_to_preview_and_files_to_export_within_34_db(tmp_path):
    assets = build_assets(6)
    wav = write_wav(tmp_path / "a.wav", speech(3.0, 16000), 16000)
    rep = render_video(assets, wav, tmp_path / "s.mp4", sink=lambda k, b: None)
    whole = render_video(assets, wav, tmp_path / "w.mp4")
    assert (rep.profile, whole.profile) == ("preview", "export")
    a = video_facts((tmp_path / "s.mp4").read_bytes())["frames"]
    b = video_facts((tmp_path / "w.mp4").read_bytes())["frames"]
    # the preview's pictures stay within 34 dB of the export's (issue 32's bound; the
    # bench measures it at 1080x1920, where both are closer still)
    ps = [psnr(fa, fb.astype(np.float32)) for fa, fb in zip(a, b, strict=True)]
    assert min(ps) >= 34.0, (min(ps), np.mean(ps))
    assert rep.timings.keys() >= {"read", "mouth", "compose", "encode", "mux"}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float32) - b) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255**2 / mse)


def test_a_failed_stream_leaves_no_file(tmp_path):
    wav = write_wav(tmp_path / "a.wav", speech(2.0, 16000), 16000)

    def stop(done, total):
        if done > 10:
            raise RuntimeError("client went away")

    got = []
    with pytest.raises(RuntimeError, match="went away"):
        render_video(
            build_assets(6), wav, tmp_path / "s.mp4", progress=stop, sink=lambda k, b: got.append(b)
        )
    assert not (tmp_path / "s.mp4").exists()


def test_a_finished_stream_frees_its_encoder_at_once(tmp_path):
    """Found by bench_load's soak: each streamed render kept its x264 encoder (8 threads,
    ~2.5 MB) until the cyclic garbage collector ran; under PyAV 18.1.1 each kept its
    audio resampler's threads so (one per CPU). With the collector off, a server's worker
    after four streams runs no more threads than after one."""
    import gc
    import os

    assets = build_assets(6)
    wav = write_wav(tmp_path / "a.wav", speech(1.0, 16000), 16000)

    gc.collect()
    gc.disable()
    try:
        render_video(assets, wav, tmp_path / "s0.mp4", sink=lambda k, b: None)
        first = len(os.listdir("/proc/self/task"))
        for i in range(1, 4):
            render_video(assets, wav, tmp_path / f"s{i}.mp4", sink=lambda k, b: None)
        last = threads_down_to(first)  # the render's own threads are joined, maybe exiting
    finally:
        gc.enable()
    assert last <= first, (first, last)


def test_scheduled_frames_decode_each_stored_frame_once_when_they_fit():
    calls = []

    def load(i):
        calls.append(i)
        return np.full((4, 4, 3), i, np.uint8)

    load.fresh = True
    idxs = schedule(100, 10)  # ping-pong: each frame comes back
    got = list(ScheduledFrames(load, idxs, budget=10 * 48))
    assert [int(f[0, 0, 0]) for _, _, f, _ in got] == idxs.tolist()
    assert sorted(calls) == list(range(10))
    calls.clear()
    small = list(ScheduledFrames(load, idxs, budget=3 * 48))  # Belady within 3 frames
    assert [int(f[0, 0, 0]) for _, _, f, _ in small] == idxs.tolist()
    assert 10 < len(calls) < 100
    # frames the cache keeps are shared, read-only; the others are the caller's
    for _, _, f, owned in small:
        assert owned == f.flags.writeable
    # a loader that hands out shared arrays never gives one to write into
    shared = [np.zeros((4, 4, 3), np.uint8) for _ in range(10)]
    assert not any(o for *_, o in ScheduledFrames(shared.__getitem__, idxs, budget=0))


def test_scheduled_frames_share_only_frames_that_come_back_from_the_cache():
    """A loop longer than the budget: a frame is kept (shared, read-only) only when it is
    still kept when it is shown again; every other one is the caller's to write into, and
    the decodes are as few as Belady's rule gives."""
    calls = []

    def load(i):
        calls.append(i)
        return np.full((4, 4, 3), i, np.uint8)

    load.fresh = True
    idxs = schedule(300, 25).tolist()
    frames = ScheduledFrames(load, idxs, budget=6 * 48)
    decoded, owned = [], []
    for _, i, f, o in frames:
        decoded.append(len(calls) > sum(decoded))  # a decode during this step
        owned.append(o)
        assert int(f[0, 0, 0]) == i
    for t, o in enumerate(owned):
        later = [u for u in range(t + 1, len(idxs)) if idxs[u] == idxs[t]]
        if decoded[t] and not o and later:  # decoded, then kept rather than handed over
            assert not decoded[later[0]], f"frame {idxs[t]} kept at step {t}, decoded again"
    assert sum(owned) > len(idxs) // 2  # most of a long loop's frames are never shown kept
    # Belady's hits, counted apart: the optimal cache of 6 frames, bypass allowed
    kept, hits = {}, 0
    for t, i in enumerate(idxs):
        nxt = next((u for u in range(t + 1, len(idxs)) if idxs[u] == i), None)
        hits += kept.pop(i, None) is not None
        if nxt is None:
            continue
        if len(kept) >= 6:
            far = max(kept, key=kept.get)
            if kept[far] <= nxt:
                continue
            del kept[far]
        kept[i] = nxt
    assert len(calls) == len(idxs) - hits


def test_live_render_sends_fragments_while_chunks_arrive():
    assets = build_assets(6)
    seconds = 3.0
    pcm = (speech(seconds, 22050) * 32767).astype("<i2")
    stereo = np.repeat(pcm[:, None], 2, axis=1).tobytes()
    consumed = [0]
    at_first_fragment = []

    def chunks():
        for i in range(0, len(stereo), 1001):  # odd sizes: samples split across chunks
            consumed[0] += 1
            yield stereo[i : i + 1001]

    segs = []

    def sink(kind, data):
        if kind == "fragment" and not at_first_fragment:
            at_first_fragment.append(consumed[0])
        segs.append(data)

    rep = live_render(assets, chunks(), 22050, 2, sink)
    total_chunks = -(-len(stereo) // 1001)
    assert at_first_fragment[0] < total_chunks / 4  # long before the input ended
    assert rep.frames == n_video_frames(seconds, FPS)
    facts = video_facts(b"".join(segs))
    assert len(facts["frames"]) == rep.frames
    assert abs(facts["audio_seconds"] - rep.frames / FPS) <= 1 / FPS + 0.03  # AAC priming


def test_live_render_refuses_an_empty_input():
    with pytest.raises(ValueError, match="before any audio"):
        live_render(build_assets(6), iter([]), 16000, 1, lambda k, b: None)

"""Precompile end to end on real media: stage keys, hits, and bad inputs."""

import os
import subprocess
import sys
from itertools import cycle, islice

import numpy as np
import pytest

from cachestore.stats import store_stats
from cachestore.store import forget_store, open_store
from cachestore.verify import verify
from hotplate.demo_data import iter_loop_frames, write_loop_video, write_still
from pipeline.catalog import plan_for
from pipeline.media import MediaError
from pipeline.nets.models import ModelMissingError
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.precompile.tracking import NoFaceError

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

SMALL = (540, 960)


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store")
    yield s
    forget_store(tmp_path / "store")


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    return write_loop_video(
        tmp_path_factory.mktemp("media") / "loop.mp4", n_frames=12, size=SMALL, motion="gentle"
    )


def manifests(store):
    stats = store_stats(store)
    return stats.entries["stage"] + stats.entries["avatar"]


def misses(report):
    return [s.name for s in report.stages if not s.hit]


def test_second_precompile_is_a_hit_that_does_no_work(store, loop):
    first = precompile(loop, Recipe(), store)
    assert misses(first) == ["decode", "track", "landmarks", "crops", "masks", "still"]
    assert first.counts["frames"] == 12 and first.counts["keyframes"] >= 4
    before = store_stats(store)
    second = precompile(loop, Recipe(), store)
    assert second.hit and second.avatar == first.avatar
    after = store_stats(store)
    assert all(after.entries[db] == before.entries[db] for db in ("blob", "stage", "avatar"))
    assert after.counters["hits"] == 1
    assert verify(store) == (7, [])


def test_mask_parameter_recomputes_only_masks(store, loop):
    precompile(loop, Recipe(), store)
    changed = precompile(loop, Recipe(mask_feather=0.2), store)
    assert misses(changed) == ["masks"]


def test_track_parameter_recomputes_from_track_down(store, loop):
    precompile(loop, Recipe(), store)
    assert misses(precompile(loop, Recipe(stride=2), store)) == [
        "track",
        "landmarks",
        "crops",
        "masks",
        "still",
    ]
    assert misses(precompile(loop, Recipe(bbox_shift=6), store)) == ["crops", "masks"]


def test_detector_change_moves_every_key_from_track_down(tmp_path, loop):
    models = tmp_path / "models"
    models.mkdir()
    (models / "s3fd-619a316812.pth").write_bytes(b"weights-a")
    a = plan_for(None, loop, Recipe())
    b = plan_for(None, loop, Recipe(detector="s3fd", models_dir=models))
    assert a.stages["decode"] == b.stages["decode"]
    assert all(a.stages[s] != b.stages[s] for s in ("track", "landmarks", "crops", "masks"))
    (models / "s3fd-619a316812.pth").write_bytes(b"weights-b")  # a retrained model is a new key
    assert (
        plan_for(None, loop, Recipe(detector="s3fd", models_dir=models)).stages["track"]
        != b.stages["track"]
    )


def test_identical_file_under_another_name_reuses_everything(store, loop, tmp_path):
    first = precompile(loop, Recipe(), store)
    copy = tmp_path / "renamed-copy.mp4"
    copy.write_bytes(loop.read_bytes())
    again = precompile(copy, Recipe(), store)
    assert again.hit and again.avatar == first.avatar


def test_force_recomputes(store, loop):
    precompile(loop, Recipe(), store)
    assert misses(precompile(loop, Recipe(), store, force=True)) == [
        "decode",
        "track",
        "landmarks",
        "crops",
        "masks",
        "still",
    ]


def test_stills_4k_landscape_and_one_frame_video(store, tmp_path):
    for name, size in (
        ("portrait.png", (1080, 1920)),
        ("uhd.jpg", (2160, 3840)),
        ("landscape.png", (1920, 1080)),
    ):
        truth = write_still(tmp_path / name, size=size)
        report = precompile(tmp_path / name, Recipe(), store)
        boxes = store.load_arrays(report.stages[1].key)["boxes"]
        assert boxes.shape == (1, 4)
        assert np.abs(boxes[0] - truth).max() < 0.25 * (truth[2] - truth[0]), name
    one = write_loop_video(tmp_path / "one.mp4", n_frames=1, size=SMALL)
    assert precompile(one, Recipe(), store).counts["frames"] == 1


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda p: p.write_bytes(os.urandom(50_000)), MediaError),
        (lambda p: p.write_bytes(b""), ValueError),
        (lambda p: p.write_bytes(b"\x00" * 10), MediaError),
    ],
    ids=["random-bytes", "empty", "tiny-garbage"],
)
def test_bad_files_fail_clearly_and_leave_no_manifest(store, tmp_path, make, error):
    bad = tmp_path / "bad.mp4"
    make(bad)
    with pytest.raises(error, match="bad.mp4"):
        precompile(bad, Recipe(), store)
    assert manifests(store) == 0


def test_truncated_video_keeps_what_decoded(store, tmp_path, loop):
    cut = tmp_path / "cut.mp4"
    data = loop.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    try:
        report = precompile(cut, Recipe(), store)
    except MediaError as exc:  # the moov atom may be lost entirely: then it is a clear error
        assert "cut.mp4" in str(exc)
        assert manifests(store) == 0
    else:
        assert 1 <= report.counts["frames"] <= 12


def test_video_without_a_face_names_the_file_and_leaves_no_manifest(store, tmp_path):
    frames = [np.full((640, 360, 3), 40 + 10 * i, np.uint8) for i in range(6)]
    blank = write_loop_video(tmp_path / "noface.mp4", frames=frames)
    with pytest.raises(NoFaceError, match="noface.mp4"):
        precompile(blank, Recipe(), store)
    assert manifests(store) == 0


def test_face_in_only_some_frames_is_healed(store, tmp_path):
    from hotplate.demo_data import iter_loop_frames

    frames = list(iter_loop_frames(12, SMALL))
    for i in (4, 5, 6):
        frames[i] = np.full_like(frames[i], 90)
    video = write_loop_video(tmp_path / "partial.mp4", frames=frames)
    report = precompile(video, Recipe(), store)
    assert report.counts["healed"] >= 1
    boxes = store.load_arrays(report.stages[1].key)["boxes"]
    assert np.isfinite(boxes).all() and (boxes[:, 2] > boxes[:, 0]).all()


def test_missing_weights_name_the_file_and_doctor(store, tmp_path, loop):
    with pytest.raises(
        ModelMissingError, match=r"s3fd-619a316812\.pth.*hotplate doctor|hotplate doctor.*s3fd"
    ):
        precompile(loop, Recipe(detector="s3fd", models_dir=tmp_path / "empty-models"), store)
    assert manifests(store) == 0


@pytest.mark.slow
def test_ten_minute_video_memory_is_bounded(tmp_path):
    """600 s at 25 fps: decode stops at max_frames and streams, so memory stays flat."""
    # the first 250 frames of the 15000-frame loop, then those again to 600 s: precompile
    # reads only the first 250 (what it read before), and drawing the other 14750 took
    # most of this test's time
    first = list(islice(iter_loop_frames(n_frames=15000, size=(180, 320)), 250))
    video = write_loop_video(
        tmp_path / "long.mp4", islice(cycle(first), 15000), fps=25, preset="ultrafast"
    )
    # VmHWM is this process image's own peak: ru_maxrss can carry the parent's (the
    # pytest process's) peak across the fork and exec that started the child
    script = (
        "import re; from pathlib import Path\n"
        "from cachestore.store import open_store; from pipeline.precompile.run import precompile; from pipeline.precompile.recipe import Recipe\n"
        "hwm = lambda: int(re.search(r'VmHWM:\\s+(\\d+)', Path('/proc/self/status').read_text())[1])\n"
        "base = hwm()\n"
        f"r = precompile(Path({str(video)!r}), Recipe(max_frames=250), open_store({str(tmp_path / 's')!r}))\n"
        "print(r.counts['frames'], hwm() - base, hwm())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout.split()
    frames, grown_kib, peak_kib = int(out[0]), int(out[1]), int(out[2])
    assert frames == 250
    assert grown_kib < 600 * 1024, f"peak RSS grew {grown_kib} KiB"
    assert peak_kib < 2 * 1024 * 1024, f"peak RSS {peak_kib} KiB"


def test_the_lock_taken_without_waiting_still_reads_a_hit_made_meanwhile(store, loop):
    """The window between precompile's first look and its lock: another process made the
    avatar and released the lock in between, so the lock is taken without waiting. The
    look under the lock must find the hit (before, it looked again only after a wait,
    and built the avatar a second time)."""
    from cachestore.leases import Lease
    from pipeline.precompile.run import PrecompileReport, _build_in_flight

    made = precompile(loop, Recipe(), store)  # "the other process", done and released
    misses = store_stats(store).counters.get("misses", 0)
    keys = plan_for(store, loop, Recipe())
    with Lease(store.path, [keys.avatar]) as lease:
        report = _build_in_flight(
            loop,
            Recipe(),
            store,
            keys,
            PrecompileReport(loop, keys.source_digest, keys.avatar),
            False,
            lambda *a: None,
            lease,
            None,
            10.0,
        )
    assert report.hit and report.avatar == made.avatar
    assert store_stats(store).counters.get("misses", 0) == misses  # nothing built again


def test_an_avatar_made_before_the_still_stage_serves_until_rebuilt(store, loop):
    """An avatar without the still stage (as a hotplate before it made them) is what a
    render plans while it is the only one; once precompile has made today's, that one."""
    older = precompile(loop, Recipe(still="off"), store)
    assert "still" not in store.get_avatar(older.avatar)["stages"]
    assert plan_for(store, loop, Recipe()).avatar == older.avatar
    today = precompile(loop, Recipe(), store)
    assert misses(today) == ["still"]  # every other stage is the older avatar's
    assert plan_for(store, loop, Recipe()).avatar == today.avatar != older.avatar

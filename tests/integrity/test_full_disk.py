"""A full disk: the cache on a size-limited tmpfs, filled while a precompile writes.

One line names the cache, the space needed and the space free; the store stays
readable and verifies clean; an avatar made before still renders; once space is
freed the same precompile succeeds."""

from __future__ import annotations

import os
import subprocess

import av
import pytest

from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from testkit.preconditions import require
from tests.integrity import cli

SIZE = (540, 960)
DISK_MB = 40


@pytest.fixture
def disk(tmp_path):
    """A DISK_MB tmpfs of our own, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    require(done.returncode == 0, f"cannot mount a tmpfs here ({done.stderr.strip()}); run as root")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


def hotplate(world, cache, *args):
    return cli.hotplate(world, cache, *args)


def render_old(world, cache, out):
    return cli.render(world, cache, "old", out, "--no-jit")


def fill(disk, leave: int):
    """Fill the tmpfs until `leave` bytes are free; returns the filler file."""
    filler = disk / "filler"
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_full_disk_mid_precompile_is_one_line_and_leaves_the_store_whole(disk, tmp_path):
    world, cache = tmp_path, disk / "cache"
    for name in ("old", "new"):
        (world / "personas" / name).mkdir(parents=True)
    write_loop_video(world / "personas" / "old" / "studio.mp4", n_frames=6, size=SIZE)
    # a still scene: a tiny H.264 file whose stored JPEG frames take megabytes
    new = write_loop_video(
        world / "personas" / "new" / "studio.mp4", n_frames=60, size=SIZE, motion="still"
    )
    write_wav(world / "speech.wav", make_speech_audio(1.0), 16000)
    made = hotplate(world, cache, "precompile", str(world / "personas" / "old" / "studio.mp4"))
    assert made.returncode == 0, made.stderr

    # no room even for the snapshot of the new source: the copy fails, in one line
    filler = fill(disk, leave=new.stat().st_size // 2)
    no_copy = hotplate(world, cache, "precompile", str(new))
    assert no_copy.returncode == 1
    assert no_copy.stderr.count("\n") == 1 and "no space left for the cache" in no_copy.stderr
    assert not list((cache / "snapshots").iterdir()), "a partial snapshot was left behind"
    filler.unlink()

    # room for the snapshot of the new source, not for its frames
    filler = fill(disk, leave=new.stat().st_size + (1 << 20))
    full = hotplate(world, cache, "precompile", str(new))
    assert full.returncode == 1
    lines = full.stderr.strip().splitlines()
    assert len(lines) == 1, full.stderr
    assert lines[0].startswith(f"error: no space left for the cache in {cache}")
    assert "needs about" in lines[0] and "is free" in lines[0]

    checked = hotplate(world, cache, "verify")
    assert checked.returncode == 0 and "0 problems" in checked.stdout, checked.stdout
    old = render_old(world, cache, world / "old.mp4")
    assert old.returncode == 0, old.stderr
    with av.open(str(world / "old.mp4")) as c:
        assert sum(1 for _ in c.decode(video=0)) == 25

    filler.unlink()
    again = hotplate(world, cache, "precompile", str(new))
    assert again.returncode == 0, again.stderr
    assert "now hot" in again.stdout
    checked = hotplate(world, cache, "verify")
    assert checked.returncode == 0 and "0 problems" in checked.stdout
    assert not list((cache / "snapshots").iterdir())


def test_map_growth_stops_at_what_the_disk_holds(disk):
    """A map that must grow past the free space is refused in one line, before LMDB
    is promised more than the disk holds; what was written before stays readable."""
    import numpy as np

    from cachestore.errors import StoreFullError
    from cachestore.store import Store
    from cachestore.verify import verify

    store = Store(disk / "cache", map_size=256 << 10)
    try:
        store.put_stage("small", "track", {"a": np.arange(1000)}, {})
        fill(disk, leave=4 << 20)
        with pytest.raises(StoreFullError, match=f"no space left for the cache in {disk}"):
            for i in range(20):
                store.put_stage(f"big-{i}", "masks", {"a": np.full(1 << 20, i, np.uint8)}, {})
        assert store.env.info()["map_size"] <= os.path.getsize(disk / "cache" / "data.mdb") + (
            4 << 20
        )
        assert verify(store)[1] == [] and store.load_arrays("small") is not None
    finally:
        store.close()

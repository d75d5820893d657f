"""The bytes hashed are the bytes decoded: a source rewritten in place by another
process while precompile runs never leaves frames under a digest they don't belong to."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from cachestore.keys import hash_file
from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.media import encode_frame, iter_frames
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile

SMALL = (540, 960)
FRAMES = 24

# A second process that rewrites the source in place (same inode, as rsync --inplace
# or an editor re-exporting does) when told to, and says when it is done.
REWRITER = """
import os, sys
source, new = sys.argv[1], sys.argv[2]
data = open(new, "rb").read()
print("ready", flush=True)
sys.stdin.readline()
with open(source, "r+b") as f:
    f.write(data)
    f.truncate()
    f.flush()
    os.fsync(f.fileno())
print("rewritten", flush=True)
"""


@pytest.fixture
def store(tmp_path):
    yield open_store(tmp_path / "cache")
    forget_store(tmp_path / "cache")


def expected_frames(path):
    """The frame blobs the decode stage must store for this content."""
    return [encode_frame(f) for f in iter_frames(path, FRAMES)]


def test_source_rewritten_in_place_mid_precompile_never_files_wrong_frames(store, tmp_path):
    old = write_loop_video(tmp_path / "old.mp4", n_frames=FRAMES, size=SMALL, seed=0)
    new = write_loop_video(tmp_path / "new.mp4", n_frames=FRAMES, size=SMALL, seed=7, motion="jump")
    contents = {hash_file(p)[0]: expected_frames(p) for p in (old, new)}
    assert len(contents) == 2 and list(contents.values())[0] != list(contents.values())[1]
    source = tmp_path / "loop.mp4"
    shutil.copy(old, source)

    rewriter = subprocess.Popen(
        [sys.executable, "-c", REWRITER, str(source), str(new)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert rewriter.stdout.readline().strip() == "ready"
    rewrites = []

    def progress(stage: str, done: int, total: int) -> None:
        # decode has started reading: have the other process rewrite the file now, and
        # wait until it has (an event, not a sleep)
        if stage == "decode" and not rewrites:
            rewriter.stdin.write("go\n")
            rewriter.stdin.flush()
            rewrites.append(rewriter.stdout.readline().strip())

    recipe = Recipe(max_frames=FRAMES)
    first = precompile(source, recipe, store, progress=progress)
    assert rewrites == ["rewritten"] and rewriter.wait(timeout=60) == 0
    second = precompile(source, recipe, store)  # the new content: its own digest and frames
    assert {first.digest, second.digest} == set(contents)

    avatars = store.items("avatar")
    assert len(avatars) == 2
    for _, avatar in avatars:
        blobs = store.read_value("stage", avatar["stages"]["decode"])["blobs"]
        with store.read() as r:
            stored = [bytes(r.array(blobs[n])) for n in sorted(blobs)]
        want = contents[avatar["source_digest"]]
        assert len(stored) == len(want)
        same = [a == b for a, b in zip(stored, want, strict=True)]
        assert all(same), f"frames {[i for i, s in enumerate(same) if not s]} are another content's"
    assert not list((store.path / "snapshots").iterdir()), "the snapshot was not removed"

"""Damage found at read time (issue 48): a frame the warm hit check trusted (it lay where
the value it hashed lay) but whose bytes changed is refused by the frame read; the render
then rebuilds the avatar and answers 200, never a 4xx. A real server whose worker is warm;
the bytes changed under LMDB, in the store's file, as a flipped copy landing on freed pages
or the disk's own rot would leave them."""

from __future__ import annotations

import os

import pytest

from cachestore import codec
from cachestore.store import forget_store, open_store
from testkit.serve_helpers import Server, make_world, post_render, speech

pytestmark = pytest.mark.slow


def flip_frames_in_the_file(cache) -> int:
    """Flip one payload byte of every stored frame, in data.mdb itself (LMDB does not see
    a write: every value stays where it was); returns how many."""
    store = open_store(cache, readonly=True)
    try:
        # the loop's avatar (its bank record, empty for a quiet loop, sits beside it in the
        # same table and holds no frames)
        [avatar] = [r for _, r in store.items("avatar") if r.get("kind") != "bank"]
        frames = store.get_stage(avatar["stages"]["decode"]).blobs.values()
        with store.read() as r:
            values = [bytes(r.txn.get(d.encode(), db=store.dbs["blob"])) for d in frames]
    finally:
        forget_store(cache)
    data = (cache / "data.mdb").read_bytes()
    fd = os.open(cache / "data.mdb", os.O_RDWR)
    try:
        for value in values:
            head = codec.read_header(value)
            at = data.find(value[head.offset : head.offset + 4096]) + head.nbytes // 2
            assert at > 0 and data.count(value[head.offset : head.offset + 4096]) == 1
            os.pwrite(fd, bytes([data[at] ^ 0x10]), at)
    finally:
        os.close(fd)
    return len(values)


def test_a_frame_damaged_after_the_warm_check_is_rebuilt_not_a_422(tmp_path):
    world = make_world(tmp_path)
    speech(world / "one.wav", 1.0)
    with Server(world, "--workers", "1") as server, server.client() as client:
        first = post_render(client, "/v1/lip-sync", world / "one.wav")
        assert first.status_code == 200, first.text  # the worker hashed every blob once
        warm = post_render(client, "/v1/lip-sync", world / "one.wav")
        assert warm.headers["X-Hotplate-Cache"] == "hit"
        assert flip_frames_in_the_file(world / "cache") > 0
        answer = post_render(client, "/v1/lip-sync", world / "one.wav")
        assert answer.status_code == 200, answer.text
        assert answer.headers["X-Hotplate-Cache"] == "jit"  # found damaged, and rebuilt
        again = post_render(client, "/v1/lip-sync", world / "one.wav")
        assert again.status_code == 200 and again.headers["X-Hotplate-Cache"] == "hit"

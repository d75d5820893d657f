"""Every flipped byte of a real avatar's blobs is damage, wherever it lands.

The blobs come from a real precompile into a real LMDB store. Each byte of a blob's
header (and of its payload) is flipped in turn: the codec must answer CodecError or give
back the original array, never a TypeError or KeyError, and with the blob's digest (as
the store always reads it) every flip is a CodecError. Then the flipped values are
written into the store under their digest and every reader that promises to find
damage finds it: the hit check, load_arrays, verify and the pull's blob check."""

from __future__ import annotations

import numpy as np
import pytest

from cachestore import codec
from cachestore.remote.pull import check_blob
from cachestore.remote.tier import RemoteDamagedError, sha256
from cachestore.store import forget_store, open_store
from cachestore.verify import verify
from hotplate.demo_data import write_loop_video
from pipeline.hot import hot_check
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile

# (stage, array name prefix): a few kinds of real blob, small and large
PICKED = [("track", "boxes"), ("landmarks", "landmarks"), ("masks", "mask_boxes")]
PICKED += [("decode", "frame/"), ("masks", "masks")]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A store holding one real avatar; yields (cache, avatar key, {name: (digest, value)})."""
    root = tmp_path_factory.mktemp("flips")
    source = write_loop_video(root / "studio.mp4", n_frames=4, size=(540, 960))
    cache = root / "cache"
    store = open_store(cache)
    avatar = precompile(source, Recipe(), store).avatar
    picked = {}
    with store.read() as r:
        stages = r.get("avatar", avatar)["stages"]
        for stage, prefix in PICKED:
            blobs = r.get("stage", stages[stage])["blobs"]
            name = next(n for n in sorted(blobs) if n.startswith(prefix))
            digest = blobs[name]
            picked[f"{stage}:{name}"] = (
                digest,
                bytes(r.txn.get(digest.encode(), db=store.dbs["blob"])),
            )
    yield cache, avatar, picked
    forget_store(cache)


def same(array: np.ndarray, original: np.ndarray) -> bool:
    return (
        array.dtype == original.dtype
        and array.shape == original.shape
        and array.tobytes() == original.tobytes()
    )


def put(store, digest: str, value: bytes) -> None:
    """Write `value` under the blob key `digest`, as damage on disk would leave it."""
    store.write(lambda txn: txn.put(digest.encode(), value, db=store.dbs["blob"]))


def test_every_flipped_byte_is_a_codec_error_or_the_original_array(made):
    _, _, picked = made
    for name, (digest, value) in picked.items():
        original = codec.decode(value, digest=digest)[1].copy()
        offset = codec.read_header(value).offset
        buf = bytearray(value)
        escaped = []
        for i in range(len(buf)):
            # every value a header byte can take; payload bytes inverted (the checksum
            # covers them whole, and a frame has 10^5 of them)
            for mask in range(1, 256) if i < offset else (0xFF,):
                buf[i] ^= mask
                try:
                    with pytest.raises(codec.CodecError):
                        codec.decode(buf, digest=digest)  # as the store reads it
                    try:
                        _, array = codec.decode(buf)  # the codec alone: its own checksum
                    except codec.CodecError:
                        continue
                    single_bit = mask & (mask - 1) == 0 or mask == 0xFF
                    if single_bit and not same(array, original):
                        escaped.append((i, mask))
                finally:
                    buf[i] ^= mask
        assert buf == value
        # a single-bit flip or an inverted byte never passes the codec alone as another
        # array (a multi-bit flip can turn "<f4" into "<i4": only the digest sees that)
        assert escaped == [], f"{name}: flips at {escaped[:5]} read as another array"


def test_flipped_header_bytes_are_damage_to_every_reader_of_the_store(made, tmp_path):
    cache, avatar, picked = made
    store = open_store(cache)
    stages = store.read_value("avatar", avatar)["stages"]
    where = {d: f"stage:{stages[n.split(':')[0]]}" for n, (d, _) in picked.items()}
    for name, (digest, value) in picked.items():
        offset = codec.read_header(value).offset
        stage_key = stages[name.split(":")[0]]
        positions = [*range(offset), offset, len(value) // 2, len(value) - 1]
        for i in positions:
            damaged = bytearray(value)
            damaged[i] ^= 0xFF
            put(store, digest, bytes(damaged))
            try:
                with store.read() as r:
                    assert not r.blob_ok(digest), (name, i)
                assert store.load_arrays(stage_key) is None, (name, i)
                problems = verify(store)[1]
                assert [p.kind for p in problems] == ["bad-blob"], (name, i, problems)
                assert problems[0].where == where[digest]
                with pytest.raises(RemoteDamagedError):
                    check_blob(bytes(damaged), digest, sha256(bytes(damaged)), len(value), "x")
                found, damaged_stages = hot_check(store, avatar)
                assert found is not None and name.split(":")[0] in damaged_stages, (name, i)
                # found once, it is gone: every later check (ls's too) sees it
                with store.read() as r:
                    assert r.txn.get(digest.encode(), db=store.dbs["blob"]) is None
                assert store.avatar_bytes(avatar) is None
            finally:
                put(store, digest, value)
    assert verify(store)[1] == [] and hot_check(store, avatar)[1] == []

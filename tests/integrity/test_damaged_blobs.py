"""A damaged or missing blob is found on the hit path and rebuilt, for every blob kind.

Real LMDB, real processes: the damage is written into data.mdb through LMDB (one
payload byte flipped, or the blob deleted), then the real CLI renders."""

from __future__ import annotations

import json
import shutil

import av
import pytest

from cachestore import codec
from cachestore.store import forget_store, open_store
from cachestore.verify import verify
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from tests.integrity import cli

SIZE = (540, 960)
# manifests verify checks in a store where the loop is hot: its 6 stages and its avatar
# record, and its mouth bank's stage and record (every loop's build judges whether it
# talks; this quiet loop gets an empty bank whose record says why)
MANIFESTS = 9


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """personas, speech and a cache where the loop is hot, made once by the real CLI."""
    root = tmp_path_factory.mktemp("made")
    (root / "personas" / "astro").mkdir(parents=True)
    write_loop_video(root / "personas" / "astro" / "studio.mp4", n_frames=8, size=SIZE)
    write_wav(root / "speech.wav", make_speech_audio(1.0), 16000)
    result = hotplate(root, "precompile", str(root / "personas" / "astro" / "studio.mp4"))
    assert result.returncode == 0, result.stderr
    return root


@pytest.fixture
def world(made, tmp_path):
    """A private copy of `made` (the store too) that a test may damage."""
    for name in ("personas", "cache"):
        shutil.copytree(made / name, tmp_path / name)
    shutil.copy(made / "speech.wav", tmp_path)
    return tmp_path


def hotplate(world, *args):
    return cli.hotplate(world, world / "cache", *args)


def render(world, out, *extra):
    return cli.render(world, world / "cache", "astro", out, *extra)


def damage(cache, stage: str, array: str, how: str = "flip") -> str:
    """Flip one payload byte ("flip") or one header byte ("header") of the blob holding
    `array` of the only avatar that has `stage`, or delete it; returns its digest."""
    store = open_store(cache)
    try:
        avatar = next(a for _, a in store.items("avatar") if stage in a["stages"])
        blobs = store.read_value("stage", avatar["stages"][stage])["blobs"]
        digest = blobs[next(n for n in sorted(blobs) if n.startswith(array))]
        db = store.dbs["blob"]

        def txn_fn(txn):
            value = bytearray(txn.get(digest.encode(), db=db))
            if how == "delete":
                txn.delete(digest.encode(), db=db)
                return
            head = codec.read_header(value)
            value[12 if how == "header" else head.offset + head.nbytes // 2] ^= 0x10
            txn.put(digest.encode(), bytes(value), db=db)

        store.write(txn_fn)
        assert verify(store)[1], "the damage was not written"
    finally:
        forget_store(cache)
    return digest


def created_times(store, avatar: str) -> dict[str, float]:
    """Stage name -> when its manifest was written, for this avatar."""
    keys = store.read_value("avatar", avatar)["stages"]
    return {n: store.read_value("stage", k)["created"] for n, k in keys.items()}


def frames_of(path):
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


def test_flipped_masks_byte_fails_no_jit_in_one_line_then_render_rebuilds(world):
    damage(world / "cache", "masks", "masks")
    resolved = hotplate(world, "resolve", "--persona", "astro", "--attire", "studio")
    assert "cold" in resolved.stdout and "masks are damaged" in resolved.stdout, resolved.stdout

    refused = render(world, world / "nojit.mp4", "--no-jit")
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: avatar "), refused.stderr
    assert "damaged" in lines[0] and "masks" in lines[0] and "`hotplate --" in lines[0]
    assert " precompile " in lines[0]

    fixed = render(world, world / "fixed.mp4")
    assert fixed.returncode == 0, fixed.stderr
    assert "JIT precompile" in fixed.stdout
    assert frames_of(world / "fixed.mp4") == 25
    assert verify(open_store(world / "cache", readonly=True)) == (MANIFESTS, [])
    forget_store(world / "cache")


@pytest.mark.parametrize(
    "stage, array, how",
    [
        ("decode", "frame/", "flip"),
        ("track", "boxes", "flip"),
        ("landmarks", "landmarks", "flip"),
        ("crops", "crops", "flip"),
        ("masks", "mask_boxes", "flip"),
        ("decode", "frame/", "delete"),
    ],
)
def test_any_damaged_blob_is_rebuilt_by_precompile_and_the_render_is_valid(
    world, stage, array, how
):
    damage(world / "cache", stage, array, how)

    again = hotplate(world, "precompile", str(world / "personas" / "astro" / "studio.mp4"))
    assert again.returncode == 0, again.stderr
    assert f"rebuilt damaged {stage}" in again.stdout
    assert verify(open_store(world / "cache", readonly=True)) == (MANIFESTS, [])
    forget_store(world / "cache")

    out = render(world, world / "out.mp4", "--no-jit")
    assert out.returncode == 0, out.stderr
    assert "cache hit" in out.stdout and frames_of(world / "out.mp4") == 25


def test_damaged_latents_are_rebuilt_alone_and_musetalk_renders(world):
    """Latents exist only with a VAE: made, damaged, then a musetalk render rebuilds
    them just in time (latents alone) and its video is valid."""
    from testkit.render_fixtures import save_tiny_musetalk_models

    models = world / "models"
    save_tiny_musetalk_models(models)
    source = world / "personas" / "astro" / "studio.mp4"
    recipe = Recipe(vae="sd-vae-ft-mse", models_dir=models)
    try:
        avatar = precompile(source, recipe, open_store(world / "cache")).avatar
        before = created_times(open_store(world / "cache"), avatar)
    finally:
        forget_store(world / "cache")
    damage(world / "cache", "latents", "latents")

    # musetalk implies upstream's recipe (S3FD, DWPose, BiSeNet, v1.5 crops); these flags
    # keep the recipe the avatar above was made with, so only the damage is rebuilt
    same_recipe = (
        *("--detector", "retinaface", "--landmarks", "facemesh", "--mask", "landmarks"),
        *("--still", "auto"),
    )
    out = cli.render(
        world,
        world / "cache",
        "astro",
        world / "out.mp4",
        "--backend",
        "musetalk",
        *same_recipe,
        "--crop-rules",
        "hotplate",
        models=models,
    )
    assert out.returncode == 0, out.stderr
    assert "JIT precompile" in out.stdout and frames_of(world / "out.mp4") == 25
    store = open_store(world / "cache")
    try:
        # and latents' stage and the musetalk avatar's record; the bank is shared: one
        assert verify(store) == (MANIFESTS + 2, [])
        assert precompile(source, recipe, store).hit
        after = created_times(store, avatar)
        assert [n for n in after if after[n] != before[n]] == ["latents"]  # rebuilt alone
    finally:
        forget_store(world / "cache")


def test_verify_repair_rebuilds_from_the_source_and_names_a_gone_one(made, tmp_path):
    source = tmp_path / "personas" / "solo" / "take.mp4"
    source.parent.mkdir(parents=True)
    shutil.copy(made / "personas" / "astro" / "studio.mp4", source)
    shutil.copy(made / "speech.wav", tmp_path)
    assert hotplate(tmp_path, "precompile", str(source)).returncode == 0
    damage(tmp_path / "cache", "masks", "masks")
    assert hotplate(tmp_path, "verify").returncode == 1

    repaired = hotplate(tmp_path, "verify", "--repair")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert repaired.stdout.startswith("rebuilt\tavatar:") and "stages masks" in repaired.stdout
    assert "0 problems" in repaired.stdout
    out = cli.render(
        tmp_path, tmp_path / "cache", "solo", tmp_path / "out.mp4", "--attire", "take", "--no-jit"
    )
    assert out.returncode == 0, out.stderr

    damage(tmp_path / "cache", "decode", "frame/")
    source.unlink()
    gone = hotplate(tmp_path, "verify", "--repair")
    assert gone.returncode == 1
    assert "source-gone" in gone.stdout and "bad-blob" in gone.stdout
    assert (
        gone.stderr.strip().splitlines()
        == [line for line in gone.stderr.strip().splitlines() if str(source) in line]
        and gone.stderr.strip()
    )


def listed_states(world) -> tuple[str, str]:
    """The avatar's state in `hotplate ls` (the real CLI) and in the service's catalog."""
    from hotplate.serve.catalog import list_catalog

    listed = hotplate(world, "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["sources"]
    try:
        (entry,) = list_catalog(open_store(world / "cache"), world / "personas", Recipe())
    finally:
        forget_store(world / "cache")
    return row["state"], entry["state"]


def test_ls_and_the_catalog_call_hot_only_what_the_hit_check_calls_hot(world):
    assert listed_states(world) == ("hot", "hot")
    damage(world / "cache", "masks", "mask_boxes", "header")  # seen without hashing
    assert listed_states(world) == ("cold", "cold")
    fixed = hotplate(world, "precompile", str(world / "personas" / "astro" / "studio.mp4"))
    assert "rebuilt damaged masks" in fixed.stdout, fixed.stdout
    assert listed_states(world) == ("hot", "hot")

    damage(world / "cache", "crops", "crops")  # a payload byte: only the hash sees it
    resolved = hotplate(world, "resolve", "--persona", "astro", "--attire", "studio")
    assert "crops are damaged" in resolved.stdout, resolved.stdout
    # found once by the hit check, it is damage to the listings too
    assert listed_states(world) == ("cold", "cold")
    assert render(world, world / "out.mp4").returncode == 0
    assert listed_states(world) == ("hot", "hot")

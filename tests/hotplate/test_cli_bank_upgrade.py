"""A store from before the bank stage's last version bump keeps its hot avatars, but not
their loops' banks: the bank record's key names the bank stage's version, so after an
upgrade none is found under it. A render of such a hot avatar builds its loop's bank just
in time (as a cold render does), `resolve` says the bank is not yet built until then, and
`verify` and `gc` treat the rebuilt record like the others. Before, such a render took
the painted mouth and `resolve` said neither a bank nor why, until the next precompile.

The version bump is made as the new code meets it: the bank record under this version's
key is deleted from the store (the old version's record sits under another key, which no
render asks for). Whole processes (the CLI), a real LMDB store; a small talking loop
(grace_hopper at 256 px speaking espeak-ng's speech, `talking_frames`)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from cachestore.store import forget_store, open_store
from testkit import faces
from testkit.cli_run import hotplate_alone
from testkit.mouth_fixtures import TALKING_RATE, espeak, talking_frames

pytestmark = pytest.mark.slow  # end to end: a talking loop, whole processes, a real store

SIZE = 256  # px: the face image's side: a small loop, fast to build and render
NOT_BUILT = "not yet built for this version: run hotplate precompile or render once"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The loop, the new speech, and a store in which `hotplate precompile` made the
    loop's avatar and bank (each test takes a copy of the store)."""
    import cv2

    from testkit.footage import write_clip

    root = tmp_path_factory.mktemp("bank_upgrade")
    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    face = cv2.resize(face, (SIZE, SIZE), interpolation=cv2.INTER_AREA)
    words = espeak("Peter Piper picked a peck of pickled peppers.", root / "own.wav")
    frames, audio = talking_frames(face, words, TALKING_RATE)
    (root / "personas" / "grace").mkdir(parents=True)
    write_clip(root / "personas" / "grace" / "talk.mp4", frames, audio, TALKING_RATE, 25.0)
    espeak("Bob bought a blue balloon.", root / "new.wav")
    hotplate(root, "precompile", str(root / "personas" / "grace" / "talk.mp4"))
    return root


@pytest.fixture
def root(built, tmp_path) -> Path:
    """A copy of `built`: its loop, speech and store, for one test to change."""
    for name in ("personas", "cache"):
        shutil.copytree(built / name, tmp_path / name)
    shutil.copy(built / "new.wav", tmp_path / "new.wav")
    return tmp_path


def hotplate(root: Path, *args: str) -> subprocess.CompletedProcess:
    return hotplate_alone(root, root / "cache", *args)


def resolved(root: Path) -> dict:
    args = ("resolve", "--persona", "grace", "--attire", "talk", "--json")
    return json.loads(hotplate(root, *args).stdout)


def render(root: Path, *flags: str) -> str:
    args = ("--persona", "grace", "--attire", "talk", "--audio", str(root / "new.wav"))
    return hotplate(root, "render", *args, "-o", str(root / "out.mp4"), *flags).stdout


def bump_the_bank_version(root: Path, key: str) -> None:
    """The store as an upgrade finds it: no bank record under this version's key."""
    store = open_store(root / "cache")
    try:
        assert store.get_avatar(key)["kind"] == "bank"
        assert store.delete("avatar", key)
    finally:
        forget_store(root / "cache")


def test_a_hot_avatar_without_its_bank_builds_it_at_render(root):
    before = resolved(root)
    assert before["state"] == "hot" and before["bank_state"] == "built", before
    key = before["bank"]["key"]
    assert before["bank"]["entries"] > 0 and before["mouth"]["kind"] == "bank", before
    bump_the_bank_version(root, key)

    # resolve says the bank is missing and how to build it; the avatar is still hot
    upgraded = resolved(root)
    assert upgraded["state"] == "hot" and upgraded["bank"] is None, upgraded
    assert upgraded["bank_state"] == "not built" and upgraded["no_bank"] is None, upgraded
    text = hotplate(root, "resolve", "--persona", "grace", "--attire", "talk").stdout
    assert f"bank     none: {NOT_BUILT}" in text, text

    # --no-jit builds nothing: the painted mouth, and a line saying why
    args = ("--persona", "grace", "--attire", "talk", "--audio", str(root / "new.wav"))
    held = hotplate(root, "render", *args, "-o", str(root / "held.mp4"), "--no-jit")
    assert "cache hit;" in held.stdout and "mouths from bank" not in held.stdout, held.stdout
    assert "not built for this version and --no-jit was given" in held.stderr, held.stderr
    assert resolved(root)["bank_state"] == "not built"

    # a render builds it just in time and takes it
    line = render(root)
    assert "JIT mouth bank of talk.mp4" in line and f"mouths from bank {key[:12]}" in line, line
    after = resolved(root)
    assert after["bank_state"] == "built" and after["bank"]["key"] == key, after
    assert after["bank"]["entries"] == before["bank"]["entries"], after
    assert after["mouth"]["kind"] == "bank", after
    again = render(root)  # built once: the next render is a hit through the same bank
    assert "JIT" not in again and f"mouths from bank {key[:12]}" in again, again

    # verify checks it and gc keeps it, like the records precompile made
    checked = hotplate(root, "verify")
    assert "0 problems" in checked.stdout, checked.stdout
    hotplate(root, "gc", "--grace", "0")
    kept = resolved(root)
    assert kept["state"] == "hot" and kept["bank"]["key"] == key, kept
    rows = json.loads(hotplate(root, "ls", "--json").stdout)["sources"]
    (row,) = [r for r in rows if r["persona"] == "grace"]
    assert row["bank"]["state"] == "hot" and row["bank"]["key"] == key, row


def test_the_services_render_builds_it_too(root):
    """The HTTP service's render goes through the same steps (`pipeline.lip_sync`): its
    no-jit warm-up builds nothing, the first request builds the bank and says `jit`."""
    from testkit.serve_helpers import Server, post_render

    key = resolved(root)["bank"]["key"]
    bump_the_bank_version(root, key)
    with Server(root, "--workers", "1") as server, server.client() as client:
        assert resolved(root)["bank_state"] == "not built"  # the warm-up built nothing
        first = post_render(
            client, "/v1/lip-sync", root / "new.wav", persona="grace", attire="talk"
        )
        assert first.status_code == 200, first.text
        assert first.headers["X-Hotplate-Cache"] == "jit", dict(first.headers)
        after = resolved(root)
        assert after["bank_state"] == "built" and after["bank"]["key"] == key, after
        again = post_render(
            client, "/v1/lip-sync", root / "new.wav", persona="grace", attire="talk"
        )
        assert again.status_code == 200 and again.headers["X-Hotplate-Cache"] == "hit"

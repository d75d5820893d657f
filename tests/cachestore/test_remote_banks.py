"""A pulled avatar renders the face its source store renders: a loop shot while speaking
(with its mouth bank), a loop without one and a still go through `hotplate push` and
`hotplate pull` (real CLI processes, two stores) over a real nginx and a real SeaweedFS,
and the second store's `hotplate render` decodes to the first one's frames. A render
whose avatar the tier hands it just in time asks the tier for the bank too. And a bank's
metadata on the tier cannot be changed alone: a pull refuses the manifest."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from cachestore.keys import canonical
from cachestore.remote.tier import ENV, ac_path, sha256
from cachestore.store import forget_store
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from tests.cachestore.test_remote import frames_of
from tests.integrity import cli

pytestmark = pytest.mark.slow  # a talking clip precompiled once, then whole CLI processes

# persona -> the attire a render names: a loop with a bank, a loop without one, a still
CASES = {"talker": "studio", "quiet": "studio", "grace": "default"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """personas, speech, a store `a` where every file is hot (`hotplate precompile`, as a
    studio's first machine has it) and `a`'s render of each case, made once."""
    import cv2

    from testkit import faces
    from testkit.mouth_fixtures import espeak, talking_clip

    root = tmp_path_factory.mktemp("banks")
    personas = root / "personas"
    for name in CASES:
        (personas / name).mkdir(parents=True)
    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    wav = espeak("Peter Piper picked a peck of pickled peppers.", root / "said.wav")
    talking_clip(face, wav, personas / "talker" / "studio.mp4")
    write_loop_video(personas / "quiet" / "studio.mp4", n_frames=8, size=(540, 960))
    cv2.imwrite(str(personas / "grace" / "portrait.png"), cv2.cvtColor(face, cv2.COLOR_RGB2BGR))
    write_wav(root / "speech.wav", make_speech_audio(1.0), 16000)
    files = [str(p) for p in sorted(personas.glob("*/*"))]
    made = cli.hotplate(root, root / "a", "precompile", *files)
    assert made.returncode == 0, made.stdout + made.stderr
    banks = {p: resolved(root, root / "a", p)["bank"] for p in CASES}
    assert banks["talker"] is not None and banks["talker"]["entries"] > 0, banks
    assert banks["quiet"] is None and banks["grace"] is None, banks
    for persona in CASES:
        render(root, root / "a", persona, root / f"a-{persona}.mp4")
    forget_store(root / "a")
    return root, banks, bank_records(root / "a")


def bank_records(cache) -> int:
    """The bank records in a store, empty ones (a loop judged not talking) included."""
    from cachestore.store import open_store

    store = open_store(cache, readonly=True)
    try:
        return sum(r.get("kind") == "bank" for _, r in store.items("avatar"))
    finally:
        forget_store(cache)


def resolved(root, cache, persona: str) -> dict:
    attire = CASES[persona]
    out = cli.hotplate(root, cache, "resolve", "--persona", persona, "--attire", attire, "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


def render(root, cache, persona: str, out) -> str:
    done = cli.render(root, cache, persona, out, "--attire", CASES[persona])
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def same_frames(root, persona: str, pulled) -> None:
    want, got = frames_of(root / f"a-{persona}.mp4"), frames_of(pulled)
    assert len(want) == len(got) > 0, persona
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True)), persona


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory):
    from testkit.seaweed import serving

    with serving(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


class Hands:
    """The test's own read and write of a tier's objects, as an attacker with write
    access would do them: files under nginx's root, or S3 objects."""

    def __init__(self, url: str, get, put) -> None:
        self.url, self.get, self.put = url, get, put


@pytest.fixture(params=["nginx", "seaweed"])
def tier(request, tmp_path):
    if request.param == "nginx":
        from testkit.nginx import Nginx

        server = Nginx(tmp_path / "nginx").start()

        def put(path: str, data: bytes) -> None:
            (server.data / path).parent.mkdir(parents=True, exist_ok=True)
            (server.data / path).write_bytes(data)

        yield Hands(server.url, lambda path: (server.data / path).read_bytes(), put)
        server.stop()
        return
    s3 = request.getfixturevalue("seaweed")
    under = s3.under("banks/" + re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name))
    yield Hands(under.url, under.get, under.put)


@pytest.fixture
def world(source, tmp_path, monkeypatch):
    """A private copy of the source store `a`, beside the shared personas and speech."""
    root, banks, records = source
    shutil.copytree(root / "a", tmp_path / "a")
    monkeypatch.delenv(ENV, raising=False)
    return root, banks, records, tmp_path


def test_a_pulled_avatar_renders_its_source_stores_frames_bank_and_all(world, tier):
    root, banks, records, here = world
    pushed = cli.hotplate(root, here / "a", "push", "--remote", tier.url)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    pulled = cli.hotplate(root, here / "b", "pull", "--remote", tier.url)
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    for persona in CASES:
        said = render(root, here / "b", persona, here / f"b-{persona}.mp4")
        assert "JIT" not in said, said  # nothing built: all of it came from the tier
        same_frames(root, persona, here / f"b-{persona}.mp4")
    assert resolved(root, here / "b", "talker")["bank"] == banks["talker"]
    assert f"3 avatars on {tier.url} with {records} mouth banks" in pushed.stdout, pushed.stdout
    assert f"3 pulled, 0 hot already, {records} mouth banks" in pulled.stdout, pulled.stdout
    assert bank_records(here / "b") == records
    # the pulled bank is a record like the others: verify checks it, gc keeps it
    checked = cli.hotplate(root, here / "b", "verify")
    assert checked.returncode == 0 and " 0 problems" in checked.stdout, checked.stdout
    kept = cli.hotplate(root, here / "b", "gc", "--grace", "0")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert resolved(root, here / "b", "talker")["bank"] == banks["talker"]


def test_a_render_that_pulls_its_avatar_pulls_its_bank(world, tier, monkeypatch):
    """No `hotplate pull`: the render's own miss asks the tier for the avatar, then for
    the bank its source store renders with."""
    root, banks, _, here = world
    pushed = cli.hotplate(root, here / "a", "push", "--remote", tier.url, "--persona", "talker")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    monkeypatch.setenv(ENV, tier.url)
    said = render(root, here / "c", "talker", here / "c-talker.mp4")
    same_frames(root, "talker", here / "c-talker.mp4")
    assert said.count("pulled avatar") == 2, said  # the loop's avatar, then its bank
    assert resolved(root, here / "c", "talker")["bank"] == banks["talker"]
    assert "with 1 mouth banks" in pushed.stdout, pushed.stdout


def _record(field: str, value):
    def change(body: dict, bank_stage: str) -> None:
        body["record"][field] = value(body["record"][field])

    return change


def _meta(field: str, value, record: bool = False):
    """A change of the bank stage's meta (and of the record's copy, as a careful forger
    keeps them agreeing)."""

    def change(body: dict, bank_stage: str) -> None:
        meta = body["stages"][bank_stage]["meta"]
        meta[field] = value(meta[field])
        if record:
            body["record"][field] = meta[field]

    return change


# each field a render reads of a bank, changed as a forger with write access would
FORGERIES = {
    "record.entries": _record("entries", lambda n: n - 1),
    "record.sound_late": _record("sound_late", lambda s: {**s, "late": 2, "ms": 80}),
    "meta.fps": _meta("fps", lambda f: f * 2, record=True),
    "meta.drive_share": _meta("drive_share", lambda s: round(1.0 - s, 3)),
    "meta.drive_cue": _meta("drive_cue", lambda c: "drive" if c != "drive" else "loudness"),
    "meta.opening_gain": _meta("opening_gain", lambda g: 3.0 if g != 3.0 else 1.0),
    "meta.entries": _meta("entries", lambda n: n - 1, record=True),
}


def test_a_banks_fields_changed_on_the_tier_are_refused(world, tier):
    """Without remote_key: the bank's manifest rewritten (its checksum made again), every
    object it names untouched; each pull refuses it in one line naming the field, and
    writes no bank; the manifest put back, the bank is pulled."""
    root, banks, _, here = world
    pushed = cli.hotplate(root, here / "a", "push", "--remote", tier.url, "--persona", "talker")
    assert pushed.returncode == 0 and "with 1 mouth banks" in pushed.stdout, pushed.stdout
    path = ac_path("avatar", banks["talker"]["key"])
    good = tier.get(path)
    accepted = {}
    for name, change in FORGERIES.items():
        outer = json.loads(good)
        body = outer["body"]
        (bank_stage,) = body["record"]["stages"].values()
        change(body, bank_stage)
        outer["sha256"] = sha256(canonical(body))
        tier.put(path, json.dumps(outer).encode())
        pulled = cli.hotplate(root, here / "b", "pull", "--remote", tier.url, "--persona", "talker")
        if pulled.returncode == 0:  # every forgery is tried, so a failure lists them all
            accepted[name] = pulled.stdout.splitlines()[-1]
            forget_bank(root, here / "b", banks["talker"]["key"])
            continue
        assert pulled.returncode == 1, (name, pulled.stdout, pulled.stderr)
        refused = [line for line in pulled.stderr.splitlines() if line.startswith("refused")]
        assert len(refused) == 1 and "(mouth bank)" in refused[0], (name, pulled.stderr)
        assert name.split(".")[1] in refused[0], (name, refused)
        assert resolved(root, here / "b", "talker")["bank"] is None, name  # nothing written
    assert not accepted, accepted
    tier.put(path, good)
    again = cli.hotplate(root, here / "b", "pull", "--remote", tier.url, "--persona", "talker")
    assert again.returncode == 0 and "1 mouth banks pulled" in again.stdout, again.stdout
    assert resolved(root, here / "b", "talker")["bank"] == banks["talker"]


def forget_bank(root, cache, key: str) -> None:
    """Drop a pulled bank's record (a forgery the old code took), so the next is pulled."""
    from cachestore.store import open_store

    store = open_store(cache)
    try:
        store.delete("avatar", key)
    finally:
        forget_store(cache)

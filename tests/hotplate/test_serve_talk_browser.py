"""The page's Talk mode in a real browser: Playwright drives Debian's chromium (never
downloaded), its microphone a fake device playing a speech file, against a real
`hotplate serve`; the session's video is read back from the <video> element frame by
frame and the mouth judged from the pixels (testkit/mouth_reader.py). Figures (latency)
are bench_webrtc's; this asserts the behaviour."""

from __future__ import annotations

import re
import shutil
import time

import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from hotplate.demo_data import make_speech_audio, write_wav
from pipeline.hot import load_assets
from testkit import page_frames
from testkit.mouth_reader import MouthReader
from testkit.preconditions import require
from testkit.serve_helpers import Server, make_world, speech, wait_state

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
AT_REST = 7.0  # mean luma difference in the mouth's rectangle (idle: ~3 to 5 here)
OPEN = 12.0
SILENCE, SPOKEN = 1.0, 2.0  # the fake microphone's file: silence, speech, then silence
TAIL = 4.0

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    require(CHROMIUM, "needs Debian's chromium (just setup installs it)")
    root = make_world(tmp_path_factory.mktemp("talk"))
    rate = 48000
    said = make_speech_audio(SPOKEN, rate, seed=4)
    quiet = np.zeros(int(SILENCE * rate), np.float32)
    tail = np.zeros(int(TAIL * rate), np.float32)
    write_wav(root / "microphone.wav", np.concatenate([quiet, said, tail]), rate)
    speech(root / "clip.wav", 8.0, seed=5)
    return root


@pytest.fixture(scope="module")
def server(world):
    with Server(world, "--workers", "1") as srv:
        with srv.client() as c:
            job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"}).json()
            srv.avatar = wait_state(c, job["id"], ("done", "failed"))["avatar"]
        yield srv


def drain(page, reader: MouthReader) -> list[tuple[float, int, float]]:
    """(page time in s, stored frame shown, mouth score) of each picture grabbed since."""
    return [(p.shown, p.index, p.mouth) for p in page_frames.drain(page, reader)]


def test_talk_mode_connects_listens_talks_and_is_interrupted(server, world, tmp_path):
    from playwright.sync_api import sync_playwright

    store = open_store(world / "cache")
    reader = MouthReader(load_assets(store, server.avatar))
    forget_store(world / "cache")
    args = page_frames.talk_args(world / "microphone.wav")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        page = browser.new_page(viewport={"width": 1360, "height": 980})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.get_by_test_id("card-astro-studio").click()
        page_frames.start(page, reader)
        page.click("#talk")
        page.wait_for_function(
            "() => document.getElementById('player').readyState >= 2 && window.hotplateTalk.connected",
            timeout=60_000,
        )
        assert page.evaluate("document.getElementById('player').videoWidth") == 270

        # the fake microphone loops its file: silence, speech, silence; watch two rounds
        seen: list = []
        end = time.monotonic() + 2 * (SILENCE + SPOKEN + TAIL)
        while time.monotonic() < end:
            page.wait_for_timeout(500)
            seen += drain(page, reader)
        assert len(seen) > 150, len(seen)  # the video plays on (25 fps: 350)
        scores = np.array([s for _, _, s in seen])
        assert scores.max() > OPEN  # the microphone's speech opens the mouth
        # the avatar keeps moving through the silences: long runs at rest, its loop going on
        rest_runs = runs(scores < AT_REST)
        longest = max(rest_runs, key=lambda r: r[1] - r[0])
        assert longest[1] - longest[0] >= 50, rest_runs  # >= 2 s at rest
        shown = {idx for _, idx, _ in seen[longest[0] : longest[1]]}
        assert len(shown) >= 6, shown  # it breathes: the loop's frames go by
        # the page holds the pictures to their sound itself: the answer's video in a media
        # stream of its own (out of chromium's lip sync), both tracks in the player, and a
        # wait asked from the sound's delay, after which the page reads the pictures
        # leading their sound by less than the 45 ms
        sdp = page.evaluate("talk.pc.remoteDescription.sdp")
        streams = {m.split()[0]: re.search(r"a=msid:(\S+)", m)[1] for m in sdp.split("\nm=")[1:3]}
        assert streams["video"] != streams["audio"], streams
        kinds = page.evaluate(
            "document.getElementById('player').srcObject.getTracks().map((t) => t.kind)"
        )
        assert sorted(kinds) == ["audio", "video"], kinds
        page.wait_for_function("() => window.hotplateTalk.pictureWaitMs !== null", timeout=30_000)
        wait = page.evaluate("window.hotplateTalk.pictureWaitMs")
        asked = page.evaluate(
            "talk.pc.getReceivers().find((r) => r.track.kind === 'video').jitterBufferTarget"
        )
        assert 0 <= wait <= 500 and asked == wait, (wait, asked)
        page.wait_for_function(
            "() => Math.abs(window.hotplateTalk.timing.lead) < 45", timeout=30_000
        )

        # muted, the microphone queues nothing: a muted track's sound, through Opus, is
        # +-1, not zeros, and taken for speech it delayed a clip said next by 0.3 s
        page.click("#mic")
        speaking = []
        for pictures in (13, 50):  # what was queued before the mute plays out; then 2 s
            got = 0
            while got < pictures:
                page.wait_for_timeout(200)
                got += len(drain(page, reader))
            session = f"/v1/sessions/{page.evaluate('window.hotplateTalk.id')}"
            with server.client() as c:
                figures = c.get(session).json()
                speaking.append(figures["speaking_frames"])
        assert speaking[1] == speaking[0], speaking
        # chromium's offer carries H.264 (after VP8): the server chose it, the cheaper encode
        assert figures["codec"] == "H264", figures["codec"]
        video = next(m for m in sdp.split("\nm=") if m.startswith("video"))
        assert f"a=rtpmap:{video.split()[3]} H264/90000" in video, video  # the answer's first

        # the clip said over the speech socket (the microphone muted), then interrupted
        page.set_input_files("#audio", str(world / "clip.wav"))
        page.click("#say")
        page.wait_for_timeout(300)
        drain(page, reader)
        deadline = time.monotonic() + 30
        opened = False
        while not opened:
            assert time.monotonic() < deadline, "the clip never opened the mouth"
            page.wait_for_timeout(100)
            opened = any(s > OPEN for _, _, s in drain(page, reader))
        with server.client() as c:
            spoken = c.get(session).json()["speaking_frames"]
        page.click("#interrupt")
        # The mouth comes to rest and stays so: a second of pictures at rest in a row,
        # judged in the order they arrive, not by when (on a busy machine pictures
        # rendered before the click still arrive after it; the latency is
        # bench_webrtc's); and the reply was cut: the 8 s clip is 200 speaking frames.
        still, scores = 0, []
        deadline = time.monotonic() + 30
        while still < 25:
            assert time.monotonic() < deadline, ("never at rest after the interrupt", scores)
            page.wait_for_timeout(200)
            for _, _, score in drain(page, reader):
                still = still + 1 if score < AT_REST else 0
                scores.append(round(score, 1))
        with server.client() as c:
            cut = c.get(session).json()["speaking_frames"] - spoken
        assert cut < 100, (cut, scores)
        page.screenshot(path=str(tmp_path / "talk.png"), full_page=True)

        page.click("#talk")  # ends the session
        page.wait_for_function("() => window.hotplateTalk.state === 'idle'", timeout=30_000)
        browser.close()
    assert errors == []
    with server.client() as c:  # the worker is free again: a render runs
        deadline = time.monotonic() + 30
        while c.get("/readyz").json().get("running", 0):
            assert time.monotonic() < deadline
            time.sleep(0.2)


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    out, start = [], None
    for i, f in enumerate([*flags, False]):
        if f and start is None:
            start = i
        elif not f and start is not None:
            out.append((start, i))
            start = None
    return out

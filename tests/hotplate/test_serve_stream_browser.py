"""The page's streaming in a real browser: Playwright drives Debian's chromium (never
downloaded) against a real `hotplate serve`. A render plays through Media Source
Extensions while it is made; live mode sends a (fake) microphone fed from a WAV over
/v1/live and plays what comes back. Screenshots land in the test's tmp dir."""

import base64
import os
import shutil

import numpy as np
import pytest

from testkit.serve_helpers import Server, make_world, speech, wait_state

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chromium():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("Debian's chromium is missing; CI must have it (just setup installs it)")
        pytest.skip("needs Debian's chromium (just setup installs it)")
    return CHROMIUM


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("stream-browser"))
    with Server(root, "--workers", "1") as srv:
        with srv.client() as c:
            job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"}).json()
            assert wait_state(c, job["id"], ("done", "failed"))["state"] == "done"
        yield srv


def launch(p, chromium, *extra):
    args = ["--autoplay-policy=no-user-gesture-required", *extra]
    if os.geteuid() == 0:
        args.append("--no-sandbox")
    return p.chromium.launch(executable_path=chromium, args=args, headless=True)


SAVED = """() => {
  const parts = window.hotplateStream.saved;
  let n = 0; for (const p of parts) n += p.length;
  const all = new Uint8Array(n); let at = 0;
  for (const p of parts) { all.set(p, at); at += p.length; }
  let s = ""; for (let i = 0; i < all.length; i += 8192) s += String.fromCharCode(...all.subarray(i, i + 8192));
  return btoa(s);
}"""


def test_a_render_plays_through_mse_while_it_is_made(server, chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    from testkit.stream_helpers import decode_facts

    seconds = 20.0  # long enough that playback starts well before the render ends
    wav = speech(tmp_path / "line.wav", seconds)
    with sync_playwright() as p:
        browser = launch(p, chromium)
        page = browser.new_page(viewport={"width": 1360, "height": 980})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.get_by_test_id("card-astro-studio").click()
        assert page.is_checked("#stream")
        page.set_input_files("#audio", str(wav))
        page.click("#render")
        # currentTime advanced: when it first did, had the response (which ends only
        # once the job has finished) ended yet?
        page.wait_for_function("window.hotplateStream.playingBeforeEnd !== null", timeout=240_000)
        page.screenshot(path=str(tmp_path / "streaming.png"), full_page=True)
        assert page.evaluate("window.hotplateStream.playingBeforeEnd") is True
        assert page.evaluate("window.hotplateStream.kind") == "render"
        page.wait_for_function("window.hotplateStream.ended", timeout=240_000)
        page.wait_for_selector("#renders tr .pill.done", timeout=60_000)
        assert page.inner_text("#progress-pct") == "100%"
        data = base64.b64decode(page.evaluate(SAVED))
        page.wait_for_function(
            "() => { const v = document.getElementById('player');"
            " return v.buffered.length && v.buffered.end(0) > 19.9; }",
            timeout=60_000,
        )
        browser.close()
    assert errors == []
    facts = decode_facts(data, tmp_path / "page.mp4")
    assert facts["frames"] == 500
    assert (tmp_path / "streaming.png").stat().st_size > 10_000


def test_live_mode_plays_frames_made_from_the_microphone(server, chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    from testkit.stream_helpers import decode_facts

    wav = speech(tmp_path / "mic.wav", 4.0, seed=7)
    fake = [
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-audio-capture={wav}",
    ]
    with sync_playwright() as p:
        browser = launch(p, chromium, *fake)
        context = browser.new_context(viewport={"width": 1360, "height": 980})
        context.grant_permissions(["microphone"], origin=server.url)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.get_by_test_id("card-astro-studio").click()
        page.click("#live")
        # fragments come back while the microphone is still on, and the video plays them
        page.wait_for_function("window.hotplateStream.fragments >= 8", timeout=120_000)
        page.wait_for_function(
            "document.getElementById('player').currentTime > 0.5", timeout=120_000
        )
        page.screenshot(path=str(tmp_path / "live.png"), full_page=True)
        assert page.evaluate("window.hotplateStream.kind") == "live"
        page.click("#live")  # stop: the end message
        page.wait_for_function("window.hotplateStream.final !== null", timeout=120_000)
        final = page.evaluate("window.hotplateStream.final")
        data = base64.b64decode(page.evaluate(SAVED))
        browser.close()
    assert errors == []
    assert final["type"] == "done", final
    facts = decode_facts(data, tmp_path / "live.mp4")
    assert facts["frames"] == final["frames"] > 0
    assert abs(facts["audio_seconds"] - facts["video_seconds"]) <= 1 / 25
    # the frames were made from the WAV's speech: the output's audio is not silence
    import av

    with av.open(str(tmp_path / "live.mp4")) as c:
        pcm = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(c.streams.audio[0])])
    assert float(np.sqrt(np.mean(pcm**2))) > 0.01
    assert (tmp_path / "live.png").stat().st_size > 10_000

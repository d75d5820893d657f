"""The page in a real browser: Playwright drives Debian's chromium (never downloaded)
against a real `hotplate serve`: pick a persona, upload a WAV, watch the video play."""

import os
import shutil

import pytest

from testkit.preconditions import require
from testkit.serve_helpers import Server, make_world, speech, wait_state

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
AUDIO_SECONDS = 2.0

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    require(CHROMIUM, "needs Debian's chromium (just setup installs it)")
    root = make_world(tmp_path_factory.mktemp("browser"), attires=("studio", "navy"))
    with Server(root, "--workers", "1") as srv:
        with srv.client() as c:  # one attire hot ahead of time: the gallery shows its frame 0
            job = c.post("/v1/precompile", data={"persona": "astro", "attire": "navy"}).json()
            assert wait_state(c, job["id"], ("done", "failed"))["state"] == "done"
        yield srv


def test_pick_a_persona_upload_a_wav_and_the_video_plays(server, tmp_path):
    from playwright.sync_api import sync_playwright

    wav = speech(tmp_path / "line.wav", AUDIO_SECONDS)
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        page = browser.new_page(viewport={"width": 1360, "height": 980})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        hot_card = page.get_by_test_id("card-astro-navy")
        hot_card.wait_for(timeout=60_000)
        assert hot_card.locator(".badge").inner_text().lower() == "hot"
        page.wait_for_function(
            "() => { const i = document.querySelector('[data-testid=card-astro-navy] img');"
            " return i && i.complete && i.naturalWidth > 0; }",
            timeout=60_000,
        )
        assert (
            page.get_by_test_id("card-astro-studio").locator(".badge").inner_text().lower()
            == "cold"
        )

        page.get_by_test_id("card-astro-studio").click()  # cold: the render precompiles first
        page.set_input_files("#audio", str(wav))
        page.uncheck("#stream")  # the whole file (streaming: test_serve_stream_browser.py)
        page.click("#render")
        page.wait_for_function(
            "() => document.getElementById('player').readyState >= 2", timeout=240_000
        )
        duration = page.evaluate("document.getElementById('player').duration")
        assert abs(duration - AUDIO_SECONDS) <= 0.1, duration
        assert page.inner_text("#progress-pct") == "100%"
        page.wait_for_selector("#renders tr .pill.done", timeout=30_000)
        page.get_by_test_id("card-astro-studio").locator(".badge").filter(has_text="hot").wait_for(
            timeout=30_000
        )
        page.screenshot(path=str(tmp_path / "studio.png"), full_page=True)
        browser.close()
    assert errors == []
    assert (tmp_path / "studio.png").stat().st_size > 10_000


@pytest.mark.parametrize("streamed", [False, True], ids=["whole file", "streamed"])
def test_a_busy_server_shows_retry_in_n_s_and_the_page_retries_by_itself(
    server, tmp_path, streamed
):
    from playwright.sync_api import sync_playwright

    root = server.root
    wav = speech(tmp_path / "line.wav", AUDIO_SECONDS)
    long = speech(tmp_path / "long.wav", 60.0, seed=1)  # about 10 s on a worker, unloaded
    args = ("--workers", "1", "--max-wait", "0.5s", "--data", str(tmp_path / "jobs"))
    with Server(root, *args) as busy, busy.client() as c:
        chromium = ["--no-sandbox"] if os.geteuid() == 0 else []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium, headless=True)
            page = browser.new_page(viewport={"width": 1360, "height": 980})
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(busy.url + "/")
            page.get_by_test_id("card-astro-navy").click()
            page.set_input_files("#audio", str(wav))
            if not streamed:
                page.uncheck("#stream")
            # The worker is taken only now, with the page ready to send: a 30 s clip rendered
            # in about 6 s here (warp, 270x480), and with the browser's start between
            # "running" and the click (tens of seconds at load 12) the held job was done,
            # or within --max-wait of done, before the page asked: admitted, never busy.
            with open(long, "rb") as f:
                held = c.post(
                    "/v1/renders",
                    data={"persona": "astro", "attire": "navy"},
                    files={"audio": ("long.wav", f, "audio/wav")},
                ).json()
            wait_state(c, held["id"], ("running",))
            page.click("#render")
            page.wait_for_function(
                "() => /^busy, retry in \\d+ s$/.test(document.getElementById('busy').textContent)",
                timeout=120_000,
            )
            assert c.delete(f"/v1/renders/{held['id']}").status_code == 200  # the worker frees
            page.wait_for_function(  # the page sent it again by itself, and it was admitted
                "() => document.getElementById('player').readyState >= 2", timeout=240_000
            )
            assert page.is_hidden("#busy") and page.inner_text("#error") == ""
            kind = "stream" if streamed else "render"
            if streamed:  # it plays from its first fragments: let it finish before closing
                (job,) = [r for r in c.get("/v1/renders").json()["renders"] if r["kind"] == kind]
                wait_state(c, job["id"], ("done",))
            browser.close()
        assert errors == []
        kinds = [(r["kind"], r["state"]) for r in c.get("/v1/renders").json()["renders"]]
        assert kinds.count((kind, "done")) == 1  # the refusal made no job, the retry one

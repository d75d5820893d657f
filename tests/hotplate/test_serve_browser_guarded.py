"""The guarded server in a real browser (Debian's chromium driven by Playwright, nothing
downloaded): /docs renders with every non-loopback request aborted, and the page asks for
the token once, then shows thumbnails, the job list and plays a video without a header."""

import os
import shutil
from urllib.parse import urlsplit

import pytest

from testkit.serve_helpers import Server, make_world, post_render, speech, wait_state

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "token-for-the-browser"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chromium():
    if CHROMIUM is None:
        reason = "needs Debian's chromium (just setup installs it)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must have it")
        pytest.skip(reason)
    return CHROMIUM


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("guarded-browser"), attires=("studio",))
    speech(root / "two.wav", 2.0)
    with Server(root, "--workers", "1", env={"HOTPLATE_TOKEN": TOKEN}) as srv:
        with srv.client(headers={"Authorization": f"Bearer {TOKEN}"}) as c:
            made = post_render(c, "/v1/lip-sync", root / "two.wav")  # hot, with one video
            assert made.status_code == 200, made.text
            wait_state(c, made.headers["x-hotplate-job"], ("done",))
        yield srv


def launch(p, chromium):
    args = ["--no-sandbox"] if os.geteuid() == 0 else []
    return p.chromium.launch(executable_path=chromium, args=args, headless=True)


def offline(page) -> list[str]:
    """Abort every request that would leave loopback; returns the list of those tried."""
    foreign: list[str] = []

    def route(r):
        if urlsplit(r.request.url).hostname in ("127.0.0.1", "localhost"):
            r.continue_()
        else:
            foreign.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    return foreign


def test_docs_render_with_the_network_blocked(server, chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p, chromium)
        page = browser.new_page()
        foreign = offline(page)
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/docs")
        page.locator("#swagger-ui .information-container .title").wait_for(timeout=60_000)
        assert "hotplate" in page.locator("#swagger-ui .title").first.inner_text()
        page.locator("#swagger-ui .opblock").first.wait_for(timeout=60_000)
        assert page.locator("#swagger-ui .opblock").count() >= 8  # one per operation
        browser.close()
    assert foreign == [] and errors == []


def test_the_page_asks_for_the_token_once_and_plays_a_signed_video(server, chromium, tmp_path):
    from playwright.sync_api import sync_playwright

    wav = speech(tmp_path / "line.wav", 1.0)
    with sync_playwright() as p:
        browser = launch(p, chromium)
        page = browser.new_page(viewport={"width": 1360, "height": 980})
        foreign = offline(page)
        prompts = []

        def answer(dialog):
            prompts.append(dialog.message)
            dialog.accept(TOKEN)

        page.on("dialog", answer)
        page.goto(server.url + "/")
        card = page.get_by_test_id("card-astro-studio")
        card.wait_for(timeout=60_000)
        page.wait_for_function(  # the thumbnail came through fetch + a blob URL
            "() => { const i = document.querySelector('[data-testid=card-astro-studio] img');"
            " return i && i.complete && i.naturalWidth > 0 && i.src.startsWith('blob:'); }",
            timeout=60_000,
        )
        page.locator("#renders tr a", has_text="Play").first.click()
        page.wait_for_function(
            "() => document.getElementById('player').readyState >= 2", timeout=60_000
        )
        src = page.evaluate("document.getElementById('player').src")
        assert "sig=" in src and TOKEN not in src
        assert page.evaluate("sessionStorage.getItem('hotplate-token')") == TOKEN
        assert page.evaluate("localStorage.length") == 0
        page.reload()  # the same tab keeps it: no second prompt
        card.wait_for(timeout=60_000)
        page.locator("#renders tr a", has_text="Play").first.wait_for(timeout=60_000)

        # a render from the page: the POST with the header, progress over a signed EventSource
        card.click()
        page.set_input_files("#audio", str(wav))
        page.click("#render")
        page.wait_for_function(
            "() => document.getElementById('progress-pct').textContent === '100%'",
            timeout=240_000,
        )
        page.wait_for_function(
            "() => document.getElementById('player').readyState >= 2", timeout=60_000
        )
        assert page.inner_text("#error") == ""
        browser.close()
    assert len(prompts) == 1 and "token" in prompts[0]
    assert foreign == []

"""`flight_wait` (HOTPLATE_FLIGHT_WAIT, --flight-wait) bounds every wait for another
process building the same avatar: the server's render, precompile and live jobs and the
watcher's, each against a real precompile holding the avatar's build lock (they used to
wait the 900 s default whatever the setting said). The Ray cluster's wait is
tests/hotplate/test_ray.py's."""

import json

import pytest

from testkit.serve_helpers import (
    Server,
    assert_problem,
    make_world,
    post_render,
    speech,
    wait_state,
)
from testkit.stream_helpers import live_connect
from tests.hotplate.many_processes import hotplate, start_holder

pytestmark = pytest.mark.slow
WAIT = {"HOTPLATE_FLIGHT_WAIT": "1"}


@pytest.fixture
def world(tmp_path):
    root = make_world(tmp_path)
    speech(root / "one.wav", 1.0)
    return root


@pytest.fixture
def holder(world):
    proc = start_holder(world)  # a precompile of astro/studio, holding its lock
    yield proc
    proc.kill()
    proc.wait(timeout=60)


def test_the_servers_jobs_give_up_after_flight_wait(world, holder):
    with Server(world, "--workers", "1", env=WAIT) as srv, srv.client(timeout=120) as c:
        answer = post_render(c, "/v1/lip-sync", world / "one.wav")
        assert_problem(answer, 503, "gave up after 1 s", f"pid {holder.pid}", "flight_wait")
        job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"}).json()
        failed = wait_state(c, job["id"], ("done", "failed"), timeout=120)
        assert failed["state"] == "failed" and "gave up after 1 s" in failed["error"]
        with live_connect(srv.url) as ws:
            start = {"persona": "astro", "attire": "studio", "sample_rate": 16000}
            ws.send(json.dumps(start))
            ws.send(bytes(32000))
            error = None
            while error is None:
                message = ws.recv(timeout=120)
                if isinstance(message, str):
                    error = json.loads(message)
        assert error["type"] == "error" and "gave up after 1 s" in error["detail"], error


def test_the_watcher_gives_up_after_flight_wait(world, holder):
    result = hotplate(world, "sync", "--retries", "1", env=WAIT, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gave up after 1 s" in result.stdout + result.stderr

"""`hotplate serve` reliability: tokens, a full queue, kill -9 mid-job then restart, and
the loopback rule (retention: test_serve_retention.py). Real processes throughout."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testkit.serve_helpers import (
    Server,
    assert_problem,
    make_world,
    post_render,
    speech,
    wait_state,
    worker_pids,
)

pytestmark = pytest.mark.slow
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("restart"), attires=("studio", "navy", "gala"))
    speech(root / "two.wav", 2.0)
    speech(root / "long.wav", 6.0, seed=1)
    return root


def test_tokens_guard_post_and_delete_and_a_full_queue_gets_503(world):
    env = {"HOTPLATE_TOKEN": TOKEN}
    args = ("--workers", "1", "--queue-size", "1")
    with Server(world, *args, env=env) as srv, srv.client() as c:
        assert c.get("/healthz").json()["token_required"] is True
        missing = post_render(c, "/v1/lip-sync", world / "two.wav")
        assert_problem(missing, 401, "Bearer")
        assert missing.headers["www-authenticate"] == "Bearer"
        wrong = {"Authorization": "Bearer not-it"}
        assert_problem(post_render(c, "/v1/renders", world / "two.wav", headers=wrong), 403)
        assert_problem(c.post("/v1/precompile", data={"persona": "astro"}), 401)
        assert_problem(c.post("/v1/precompile", data={"persona": "astro"}, headers=wrong), 403)
        assert_problem(c.delete("/v1/renders/feedbeef", headers=wrong), 403)
        assert_problem(c.get("/v1/personas"), 401)  # reading needs the token too
        good = {"Authorization": f"Bearer {TOKEN}"}
        c.headers.update(good)
        assert c.get("/v1/renders").json()["renders"] == []  # nothing was queued
        assert c.get("/v1/personas").status_code == 200

        # one worker, one queue slot, a cold attire: the third or fourth request is refused
        answers = [
            post_render(c, "/v1/renders", world / "long.wav", headers=good) for _ in range(4)
        ]
        refused = [a for a in answers if a.status_code == 503]
        accepted = [a.json()["id"] for a in answers if a.status_code == 202]
        assert refused and len(accepted) + len(refused) == 4 and len(accepted) >= 1
        for answer in refused:
            assert_problem(answer, 503, "queue is full")
            assert int(answer.headers["retry-after"]) >= 1
        for job_id in accepted:
            assert wait_state(c, job_id, ("done", "failed"))["state"] == "done"
        assert c.delete(f"/v1/renders/{accepted[0]}", headers=good).json()["deleted"] is True


def test_kill_9_mid_job_then_restart_marks_the_job_failed_with_the_reason(world):
    srv = Server(world, "--workers", "1").start()
    try:
        with srv.client() as c:
            finished = post_render(c, "/v1/lip-sync", world / "two.wav", attire="navy")
            assert finished.status_code == 200
            done_id = finished.headers["x-hotplate-job"]
            job = post_render(c, "/v1/renders", world / "long.wav", attire="gala").json()
            wait_state(c, job["id"], ("running",))
            pids = worker_pids(srv.proc.pid)
        srv.kill9()
    finally:
        srv.stop()
    deadline = time.monotonic() + 30  # the workers die with the server (no orphan renders)
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, f"worker {pids} outlived the server"
        time.sleep(0.1)

    with Server(world, "--workers", "1") as again, again.client() as c:
        failed = c.get(job["status_url"]).json()
        assert failed["state"] == "failed" and failed["status"] == 503
        assert "server stopped while this job was running" in failed["error"]
        assert "\n" not in failed["error"]
        assert c.get(f"/v1/renders/{done_id}").json()["state"] == "done"  # past jobs kept
        assert c.get(f"/v1/renders/{done_id}/video").status_code == 200
        listed = {r["id"]: r["state"] for r in c.get("/v1/renders").json()["renders"]}
        assert listed[job["id"]] == "failed" and listed[done_id] == "done"
        assert not list((world / "cache-serve" / "uploads").iterdir())
        assert not (world / "cache-serve" / "videos" / f"{job['id']}.mp4").exists()
        # the store survived the kill: the interrupted attire renders now
        retry = post_render(c, "/v1/lip-sync", world / "two.wav", attire="gala")
        assert retry.status_code == 200


def test_a_non_loopback_host_needs_a_token(world):
    cmd = [sys.executable, "-m", "hotplate.cli", "--personas", str(world / "personas")]
    result = subprocess.run(
        [*cmd, "serve", "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "HOTPLATE_TOKEN"},
        timeout=60,
    )
    assert result.returncode == 2 and "HOTPLATE_TOKEN" in result.stderr
    assert "Traceback" not in result.stderr

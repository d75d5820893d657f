"""A render worker that dies while idle (issue 48): the server replaces it by itself, so
/readyz is 200 again with no job to wake it, and the next render is served, not a 500.
A real server process; its worker killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import time

import pytest

from testkit.serve_helpers import Server, make_world, post_render, speech, worker_pids

pytestmark = pytest.mark.slow


def test_a_worker_killed_while_idle_is_replaced_and_the_next_render_served(tmp_path):
    world = make_world(tmp_path)
    speech(world / "one.wav", 1.0)
    with Server(world, "--workers", "1") as server, server.client() as client:
        assert post_render(client, "/v1/lip-sync", world / "one.wav").status_code == 200
        [dead] = worker_pids(server.proc.pid)
        os.kill(dead, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while True:  # replaced with no request to find it dead
            pids = worker_pids(server.proc.pid)
            ready = client.get("/readyz")
            if ready.status_code == 200 and pids and dead not in pids:
                break
            assert time.monotonic() < deadline, (ready.text, pids, server.log_text())
            time.sleep(0.2)
        answer = post_render(client, "/v1/lip-sync", world / "one.wav")
        assert answer.status_code == 200, answer.text
        assert "died while idle" in server.log_text()


def test_a_render_sent_to_a_worker_just_killed_goes_to_a_fresh_one(tmp_path):
    """Killed an instant before the job is sent (before the idle check can see it): the
    send fails, and the job goes to a fresh worker instead of failing with a 500."""
    world = make_world(tmp_path)
    speech(world / "one.wav", 1.0)
    with Server(world, "--workers", "1") as server, server.client() as client:
        assert post_render(client, "/v1/lip-sync", world / "one.wav").status_code == 200
        for _ in range(3):  # whichever of the two paths finds it dead, the render is served
            [worker] = worker_pids(server.proc.pid)
            os.kill(worker, signal.SIGKILL)
            answer = post_render(client, "/v1/lip-sync", world / "one.wav")
            assert answer.status_code == 200, answer.text
        assert "gone before job" in server.log_text() or "died while idle" in server.log_text()

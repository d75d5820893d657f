"""Precompiles are background work (issue 48): a burst of them on a cold one-worker server
is all accepted and all become hot with no client retry, a render posted meanwhile goes
first, a full background queue answers 503 and loses nothing it holds, a restart reports
every job it did not finish, and a drain starts nothing queued. Real server processes."""

from __future__ import annotations

import signal
import threading

import pytest

from testkit.serve_helpers import (
    Server,
    assert_problem,
    make_world,
    post_render,
    speech,
    wait_state,
)

pytestmark = pytest.mark.slow
ATTIRES = ("studio", "navy", "gala", "beach", "dusk", "noon")
# a --max-wait far below what five precompiles take on one worker: they were refused by it
ARGS = ("--workers", "1", "--max-wait", "1s")


@pytest.fixture
def world(tmp_path):
    root = make_world(tmp_path, attires=ATTIRES, n_frames=24)
    speech(root / "one.wav", 1.0)
    speech(root / "long.wav", 6.0, seed=1)
    return root


def precompile(client, attire: str):
    return client.post("/v1/precompile", data={"persona": "astro", "attire": attire})


def test_a_burst_of_precompiles_is_all_accepted_and_a_render_goes_first(world):
    with Server(world, *ARGS) as server, server.client() as client:
        first = client.post(
            "/v1/lip-sync",
            data={"persona": "astro", "attire": "studio"},
            files={"audio": ("one.wav", (world / "one.wav").read_bytes(), "audio/wav")},
        )
        assert first.status_code == 200, first.text  # studio hot, the service times seeded
        posted = [precompile(client, a) for a in ATTIRES[1:]]
        assert [r.status_code for r in posted] == [202] * 5, [r.text for r in posted]
        jobs = [r.json()["id"] for r in posted]
        listing = client.get("/v1/precompile").json()
        assert listing["max_queued"] == 64
        assert {j["id"] for j in listing["precompiles"]} == set(jobs)
        waiting = [j["id"] for j in listing["precompiles"] if j["state"] == "queued"]
        assert [j["place"] for j in listing["precompiles"] if j["state"] == "queued"] == list(
            range(1, len(waiting) + 1)
        )
        render = post_render(client, "/v1/renders", world / "one.wav")
        assert render.status_code == 202 and render.json()["place"] == 1, render.text
        done = wait_state(client, render.json()["id"], ("done", "failed"))
        assert done["state"] == "done", done
        finished = {j: wait_state(client, j, ("done", "failed")) for j in jobs}
        assert all(f["state"] == "done" for f in finished.values()), finished
        # the render started before every precompile still waiting when it was posted
        assert all(done["started"] <= finished[j]["started"] for j in waiting), (done, finished)
        rows = client.get("/v1/personas").json()["personas"]
        states = {r["attire"]: r["state"] for r in rows if r["kind"] != "still"}
        assert states == dict.fromkeys(ATTIRES, "hot"), states


def test_a_full_precompile_queue_answers_503_and_loses_nothing_it_holds(world):
    args = (*ARGS, "--max-queued-precompiles", "2")
    with Server(world, *args) as server, server.client() as client:
        posted = [precompile(client, a) for a in ATTIRES]
        accepted = [r.json()["id"] for r in posted if r.status_code == 202]
        refused = [r for r in posted if r.status_code != 202]
        assert refused and 2 <= len(accepted) <= 3, [r.status_code for r in posted]
        for r in refused:
            assert_problem(r, 503, "precompile queue is full", "--max-queued-precompiles")
            assert int(r.headers["Retry-After"]) >= 1
        for job in accepted:
            assert wait_state(client, job, ("done", "failed", "interrupted"))["state"] == "done"


def test_a_restart_mid_queue_reports_every_job_it_did_not_finish(world):
    server = Server(world, *ARGS).start()
    with server.client() as client:
        jobs = [precompile(client, a).json()["id"] for a in ATTIRES]
    server.kill9()
    with Server(world, *ARGS) as again, again.client() as client:
        for job in jobs:
            record = client.get(f"/v1/renders/{job}").json()
            assert record["state"] in ("done", "failed"), record
            if record["state"] == "failed":
                assert "submit it again" in record["error"], record


def test_a_drain_starts_nothing_queued_and_answers_a_blocked_lip_sync_503(world):
    server = Server(world, *ARGS, "--max-wait", "off").start()
    with server.client() as client:
        long = post_render(client, "/v1/renders", world / "long.wav", attire="navy")
        assert long.status_code == 202, long.text
        wait_state(client, long.json()["id"], ("running",))
        answer: dict = {}

        def blocked() -> None:
            with server.client() as c:
                answer["r"] = post_render(c, "/v1/lip-sync", world / "one.wav", attire="gala")

        thread = threading.Thread(target=blocked)
        thread.start()
        queued = precompile(client, "beach").json()["id"]  # behind the running render
        assert client.get(f"/v1/renders/{queued}").json()["state"] == "queued"
        server.proc.send_signal(signal.SIGTERM)
        thread.join(timeout=300)
        assert_problem(answer["r"], 503, "shutting down")
        assert server.proc.wait(timeout=300) == 0, server.log_text()
    with Server(world, *ARGS) as again, again.client() as client:
        assert client.get(f"/v1/renders/{long.json()['id']}").json()["state"] == "done"
        record = client.get(f"/v1/renders/{queued}").json()
        assert record["state"] == "interrupted" and record["started"] is None, record


def gala_behind_a_render(client, world) -> tuple[str, str]:
    """(a precompile of gala, a render of gala) queued behind a running render of navy:
    the render goes first (an editor's) and builds gala just in time."""
    busy = post_render(client, "/v1/renders", world / "long.wav", attire="navy")
    assert busy.status_code == 202, busy.text
    wait_state(client, busy.json()["id"], ("running",))
    queued = precompile(client, "gala").json()["id"]
    render = post_render(client, "/v1/renders", world / "one.wav", attire="gala")
    assert render.status_code == 202 and render.json()["place"] == 1, render.text
    return queued, render.json()["id"]


def test_a_render_that_builds_a_queued_avatar_takes_its_precompile_out_of_the_queue(world):
    """Its just-in-time build makes the queued precompile done, with the render's avatar,
    and no worker runs the precompile itself."""
    with Server(world, *ARGS, "--max-wait", "off") as server, server.client() as client:
        queued, render = gala_behind_a_render(client, world)
        done = wait_state(client, render, ("done", "failed"))
        assert done["state"] == "done" and done["jit"] is True, done
        record = wait_state(client, queued, ("done", "failed"))
        assert record["state"] == "done" and record["avatar"] == done["avatar"], record
        assert record["step"] == f"built by render job {render}", record
        assert client.get("/v1/precompile").json()["precompiles"] == []


def test_a_precompile_whose_render_is_cancelled_mid_build_queues_again_and_builds(world):
    """The render that took it is cancelled while it builds: the precompile goes back to
    the queue, a worker runs it, and the avatar is hot."""
    with Server(world, *ARGS, "--max-wait", "off") as server, server.client() as client:
        queued, render = gala_behind_a_render(client, world)
        riding = wait_state(client, queued, ("running",))
        assert riding["step"] == f"built by render job {render}", riding
        assert client.delete(f"/v1/renders/{render}").status_code in (200, 204)
        record = wait_state(client, queued, ("done", "failed"))
        assert record["state"] == "done" and record["jit"] is True, record
        assert not record["step"].startswith("built by"), record
        rows = client.get("/v1/personas").json()["personas"]
        assert {r["attire"]: r["state"] for r in rows if r["kind"] != "still"}["gala"] == "hot"

"""`hotplate serve --watch` (issue 48): the watcher's precompiles are background jobs in
the server's one queue: listed with the API's, bounded by its --max-queued-precompiles,
behind a render posted meanwhile, and every file hot in the end, the folder's scan at
start and a real copy after it alike. Real server processes, real watchdog events."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from hotplate.cli.common import invocation
from hotplate.demo_data import write_loop_video
from testkit.serve_helpers import SIZE, Server, make_world, post_render, speech, wait_state

pytestmark = pytest.mark.slow
ATTIRES = ("studio", "navy", "gala", "beach")


def watcher_jobs(
    client, at_least: int = 1, route: str = "/v1/precompile", **match: str
) -> list[dict]:
    """The watcher's jobs that `route` lists (the queue; "/v1/renders": the records),
    once at least `at_least` match."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        listing = client.get(route).json()
        jobs = [
            j
            for j in listing["precompiles" if "precompiles" in listing else "renders"]
            if j["owner"] == "watcher" and all(j[k] == v for k, v in match.items())
        ]
        if len(jobs) >= at_least:
            return jobs
        time.sleep(0.1)
    raise AssertionError(f"the queue never listed {at_least} watcher job(s) {match}")


def hot_states(client) -> dict[str, str]:
    rows = client.get("/v1/personas").json()["personas"]
    return {f"{r['attire']}/{r['kind']}": r["state"] for r in rows}


def wait_hot(client, want: dict[str, str], timeout: float = 300.0) -> dict[str, str]:
    """The catalog's states once `want`'s entries are all as wanted (or the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = hot_states(client)
        if {k: states.get(k) for k in want} == want:
            break
        time.sleep(0.2)
    return {k: states.get(k) for k in want}


def test_the_folder_s_precompiles_queue_behind_a_render_and_all_become_hot(tmp_path):
    world = make_world(tmp_path, attires=ATTIRES, n_frames=24)
    (world / "personas" / "astro" / "broken.mp4").write_bytes(b"not a video at all" * 100)
    speech(world / "one.wav", 1.0)
    args = ("--workers", "1", "--watch", "--max-queued-precompiles", "3")
    with Server(world, *args) as server, server.client() as client:
        # the scan at start: six files, three places; one runs, two wait, three in the watcher
        watcher_jobs(client, state="queued", at_least=2)
        assert client.get("/v1/precompile").json()["queued"] <= 3
        render = post_render(client, "/v1/renders", world / "one.wav", attire="studio")
        queued_by = time.time()  # the server's clock: this machine's
        assert render.status_code == 202 and render.json()["place"] == 1, render.text
        done = wait_state(client, render.json()["id"], ("done", "failed"))
        assert done["state"] == "done", done
        # no precompile the worker took once the render was queued went before it
        after = watcher_jobs(client, route="/v1/renders", at_least=5, state="done")
        later = [j for j in after if j["started"] > queued_by]
        times = [(j["attire"], j["created"], j["started"]) for j in after]
        assert later and all(j["started"] >= done["started"] for j in later), (done, times)
        # a real copy after the scan: a watchdog event, settled, queued, built
        shot = write_loop_video(tmp_path / "dusk.mp4", n_frames=24, size=SIZE, seed=9)
        shutil.copy(shot, world / "personas" / "astro" / "dusk.mp4")
        # `hotplate sync` builds nothing itself: it waits on the server's queue, then
        # reports as a sync does (the broken file failed, in one line naming it)
        cmd = invocation(world / "personas", world / "cache", "sync")
        synced = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert synced.returncode == 1, synced.stdout + synced.stderr
        assert "hotplate serve --watch (pid" in synced.stderr, synced.stderr
        (failed,) = [line for line in synced.stderr.splitlines() if line.startswith("failed ")]
        assert "astro/broken.mp4" in failed and "re-encode it" in failed, synced.stderr
        want = {f"{a}/loop": "hot" for a in (*ATTIRES, "dusk")} | {"default/still": "hot"}
        assert wait_hot(client, want) == want, server.log_text()
        broken = watcher_jobs(client, route="/v1/renders", attire="broken", state="failed")[0]
        assert "broken.mp4" in broken["error"] and "\n" not in broken["error"], broken
        # one queue per store: a second watcher on it is refused in one line
        cmd = invocation(world / "personas", world / "cache", "watch")
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert second.returncode != 0
        assert second.stderr.strip().count("\n") == 0, second.stderr
        assert "hotplate serve --watch" in second.stderr and "already uses" in second.stderr
    assert server.proc.returncode == 0, server.log_text()  # SIGTERM: the watcher, then the drain
    assert "jobs done, 1 failed" in server.log_text()  # the watcher's last line: it stopped first


def test_a_server_killed_mid_queue_builds_every_file_after_its_restart(tmp_path):
    """kill -9 with the watcher's precompiles queued: the server's records report them
    (failed, submit it again) and the restarted server's watcher queues them again."""
    world = make_world(tmp_path, attires=ATTIRES, n_frames=96)
    want = {f"{a}/loop": "hot" for a in ATTIRES} | {"default/still": "hot"}
    server = Server(world, "--workers", "1", "--watch").start()
    with server.client() as client:
        first = watcher_jobs(client, route="/v1/renders", state="done")[0]  # one built
        states = hot_states(client)
        assert list(states.values()).count("hot") < len(want), states
        listed = [j["id"] for j in client.get("/v1/precompile").json()["precompiles"]]
        assert listed, states
    server.kill9()
    with Server(world, "--workers", "1", "--watch") as again, again.client() as client:
        for job in listed:  # what the killed server held: reported, never silently gone
            record = client.get(f"/v1/renders/{job}").json()
            assert record["state"] in ("done", "failed"), record
            if record["state"] == "failed":
                assert "submit it again" in record["error"], record
        assert client.get(f"/v1/renders/{first['id']}").json()["state"] == "done"
        assert wait_hot(client, want) == want, again.log_text()


CANCELS = 4  # one more than the watcher's attempts per file (its --retries, 3)


def next_watcher_job(client, server, attire: str, seen: list[str]) -> dict:
    """The watcher's next job for `attire` (one not in `seen`), queued or running, once
    the queue lists it; an AssertionError naming the log's line if the watcher gives up
    on the file instead."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        listed = client.get("/v1/precompile").json()["precompiles"]
        for job in listed:
            if job["owner"] == "watcher" and job["attire"] == attire and job["id"] not in seen:
                return job
        gave_up = [
            line
            for line in server.log_text(None).splitlines()
            if "job-failed" in line and f"{attire}.mp4" in line
        ]
        assert not gave_up, f"after {len(seen)} cancels: {gave_up[0]}"
        time.sleep(0.1)
    raise AssertionError(f"the watcher queued no job for {attire} after {len(seen)} cancels")


def test_a_watcher_job_cancelled_more_often_than_its_retries_still_makes_the_file_hot(
    tmp_path,
):
    """A cancel (a DELETE with the admin token), like a refusal or a drain, says
    nothing about the file: the watcher runs it again and does not count the attempt
    (issue 64: three cancels left the file failed until it changed). A real copy into
    the folder, its job cancelled 4 times, then `hotplate sync` (which waits on the
    server's queue) reports it hot."""
    world = make_world(tmp_path, attires=("studio",), n_frames=96)
    shot = write_loop_video(tmp_path / "dusk.mp4", n_frames=24, size=SIZE, seed=9)
    (world / "admin").write_text("the-admin-token\n")  # the watcher's jobs are nobody's
    args = ("--workers", "1", "--watch", "--admin-token-file", str(world / "admin"))
    admin = {"Authorization": "Bearer the-admin-token"}
    with Server(world, *args) as server, server.client(headers=admin) as client:
        # the scan's precompile of studio keeps the worker busy, so the copy's job is
        # mostly cancelled queued (one cancelled running costs a worker's restart)
        shutil.copy(shot, world / "personas" / "astro" / "dusk.mp4")
        cancelled: list[str] = []
        for _ in range(CANCELS):
            job = next_watcher_job(client, server, "dusk", cancelled)
            answer = client.delete(f"/v1/renders/{job['id']}")
            assert answer.status_code == 200 and answer.json()["state"] == "cancelled", answer.text
            cancelled.append(job["id"])
        cmd = invocation(world / "personas", world / "cache", "sync")
        synced = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert synced.returncode == 0, synced.stdout + synced.stderr + server.log_text()
        want = {"dusk/loop": "hot", "studio/loop": "hot"}
        assert wait_hot(client, want) == want, server.log_text()
        retries = [
            line
            for line in server.log_text(None).splitlines()
            if "job-retry" in line and "dusk.mp4" in line
        ]
        assert len(retries) == CANCELS and all("not a failed attempt" in r for r in retries), (
            retries
        )

"""Nothing a cancelled, failed or killed render wrote is left behind; one server per data
dir; outputs honour the umask (issue 15). A real `hotplate serve`, real kills."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from testkit.serve_helpers import (
    Server,
    make_world,
    post_render,
    speech,
    wait_state,
    worker_pids,
)
from tests.hotplate.test_render_leases import wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("orphans"), attires=("studio",))
    speech(root / "long.wav", 30.0, seed=2)  # 750 frames: a render long enough to cut
    speech(root / "short.wav", 1.0)
    with Server(root, "--workers", "1") as srv, srv.client() as c:  # make it hot once
        job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"}).json()
        assert wait_state(c, job["id"], ("done", "failed"))["state"] == "done"
    return root


def videos(world: Path) -> Path:
    return world / "cache-serve" / "videos"


def left_by(world: Path, job_id: str) -> list[str]:
    """Every file of this job under the data dir: its video, partial videos, its upload."""
    data = world / "cache-serve"
    return sorted(
        p.name for sub in ("videos", "uploads") for p in (data / sub).iterdir() if job_id in p.name
    )


def start_mid_render(srv: Server, c, world: Path) -> str:
    """A long render, returned once its partial MP4 is on disk (frames being encoded)."""
    job = post_render(c, "/v1/renders", world / "long.wav").json()
    wait_for(
        lambda: (
            any(videos(world).glob(f".{job['id']}.mp4.tmp-*"))
            or c.get(job["status_url"]).json()["state"] != "running"
        ),
        300,
        "the render's partial MP4",
    )
    assert c.get(job["status_url"]).json()["state"] == "running", "the render ended too soon"
    return job["id"]


def test_cancel_mid_render_leaves_no_file(world):
    with Server(world, "--workers", "1") as srv, srv.client() as c:
        job_id = start_mid_render(srv, c, world)
        assert c.delete(f"/v1/renders/{job_id}").json()["state"] == "cancelled"
        assert left_by(world, job_id) == []
        # the replaced worker serves the next render, whose output is readable by others
        done = post_render(c, "/v1/lip-sync", world / "short.wav")
        assert done.status_code == 200


def test_a_worker_killed_mid_render_leaves_no_file(world):
    with Server(world, "--workers", "1") as srv, srv.client() as c:
        job_id = start_mid_render(srv, c, world)
        (pid,) = worker_pids(srv.proc.pid)
        os.kill(pid, signal.SIGKILL)
        failed = wait_state(c, job_id, ("failed", "done"))
        assert failed["state"] == "failed" and "worker died" in failed["error"]
        assert left_by(world, job_id) == []


def test_a_server_killed_mid_render_leaves_nothing_after_its_restart(world):
    srv = Server(world, "--workers", "1").start()
    with srv.client() as c:
        job_id = start_mid_render(srv, c, world)
        workers = worker_pids(srv.proc.pid)
    srv.kill9()  # its workers get SIGKILL too (PR_SET_PDEATHSIG)
    wait_for(lambda: not any(Path(f"/proc/{p}").exists() for p in workers), 60, "workers")
    srv.stop()
    assert left_by(world, job_id), "the kill left no partial file to sweep"
    with Server(world, "--workers", "1") as again, again.client() as c:
        assert c.get(f"/v1/renders/{job_id}").json()["state"] == "failed"
        assert left_by(world, job_id) == []


def test_a_second_server_on_one_data_dir_refuses_naming_the_first(world):
    with Server(world, "--workers", "1") as first:
        second = Server(world, "--workers", "1")
        with pytest.raises(AssertionError, match="server exited 1"):
            second.start()
        second.stop()
        lines = [ln for ln in second.log_text().splitlines() if ln.strip()]
        assert lines[-1].startswith("error: another hotplate serve (pid ")
        assert f"pid {first.proc.pid} " in lines[-1] and "--data" in lines[-1]
        with first.client() as c:
            assert c.get("/readyz").status_code == 200  # the first is untouched


def test_outputs_honour_the_umask(world, tmp_path):
    from cachestore.atomic import atomic_write_bytes, temp_beside

    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "a", b"x")
        assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o644
        os.umask(0o077)
        assert stat.S_IMODE(temp_beside(tmp_path / "b").stat().st_mode) == 0o600
    finally:
        os.umask(old)
    with Server(world, "--workers", "1") as srv, srv.client() as c:
        job = post_render(c, "/v1/renders", world / "short.wav").json()
        assert wait_state(c, job["id"], ("done", "failed"))["state"] == "done"
        mode = stat.S_IMODE((videos(world) / f"{job['id']}.mp4").stat().st_mode)
        assert mode == 0o666 & ~old, oct(mode)  # the server's umask is the test's

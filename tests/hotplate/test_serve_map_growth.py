"""A real server on a 1 MiB map stays up while another process grows it (issue 15).

The server reads from a thread pool (catalog, thumbnails, metrics) while its workers and
other processes write; every request must be answered, none with a 5xx, and the server
must still be running at the end.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from testkit.serve_helpers import Server, make_world, wait_state
from tests.cachestore.test_map_growth import ROOT, WRITER

pytestmark = pytest.mark.slow


def test_server_answers_every_read_while_the_map_grows(tmp_path):
    root = make_world(tmp_path, attires=("studio",))
    with Server(root, "--workers", "1", env={"HOTPLATE_MAP_SIZE": "1M"}) as srv:
        with srv.client() as c:
            job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"}).json()
            assert wait_state(c, job["id"], ("done", "failed"))["state"] == "done"
        stop, answers, bad = threading.Event(), [], []

        def reader() -> None:
            with srv.client(timeout=120) as c:
                while not stop.is_set():
                    for url in (
                        "/v1/personas",
                        "/v1/personas/astro/studio/thumbnail.jpg?motion=default",
                        "/metrics",
                    ):
                        r = c.get(url)
                        answers.append(r.status_code)
                        if r.status_code != 200:
                            bad.append((url, r.status_code, r.text[:300]))

        pool = [threading.Thread(target=reader) for _ in range(4)]
        for t in pool:
            t.start()
        try:
            for _ in range(3):  # each writer starts from the server's map and grows it
                done = subprocess.run(
                    [sys.executable, "-c", WRITER, str(root / "cache"), "150"],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    timeout=300,
                )
                assert done.returncode == 0, done.stderr[-2000:]
        finally:
            stop.set()
            for t in pool:
                t.join(timeout=300)
        assert srv.proc.poll() is None, srv.log_text()
        assert answers and not bad, bad[:3]
        with srv.client() as c:
            assert c.get("/readyz").status_code == 200

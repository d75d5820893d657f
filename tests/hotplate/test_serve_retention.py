"""Nothing the server writes grows: videos expire by age (--keep-videos) and, oldest
first, by the data dir's size (--max-data-size); their records go after them. A real
server on loopback; the waits are for the server's own sweep, never a fixed sleep."""

import time

import pytest

from testkit.serve_helpers import Server, assert_problem, make_world, post_render, speech

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("retention"))
    speech(root / "two.wav", 2.0)
    return root


def until(check, timeout: float = 60.0):
    """Poll `check` until it returns something true (the sweep runs every 0.2 s here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.1)
    raise AssertionError(f"{check.__doc__ or check} never happened in {timeout} s")


def test_an_expired_video_answers_410_leaves_the_disk_and_its_record_goes_later(world, tmp_path):
    data = tmp_path / "jobs"
    args = ("--workers", "1", "--keep-videos", "2s", "--data", str(data))
    with Server(world, *args) as srv, srv.client() as c:
        made = post_render(c, "/v1/lip-sync", world / "two.wav")
        assert made.status_code == 200 and made.content[4:8] == b"ftyp"
        job_id = made.headers["x-hotplate-job"]
        video = data / "videos" / f"{job_id}.mp4"
        assert video.is_file()

        def expired():
            """the video answers 410"""
            return c.get(f"/v1/renders/{job_id}/video").status_code == 410

        until(expired)
        assert_problem(c.get(f"/v1/renders/{job_id}/video"), 410, "expired", "--keep-videos")
        assert not video.exists() and not list((data / "videos").iterdir())
        status = c.get(f"/v1/renders/{job_id}")
        assert status.status_code == 404 or status.json()["state"] == "expired"

        def forgotten():
            """the record is deleted"""
            return c.get(f"/v1/renders/{job_id}").status_code == 404

        until(forgotten)
        assert job_id not in [r["id"] for r in c.get("/v1/renders").json()["renders"]]
        metrics = c.get("/metrics").text
        assert 'hotplate_videos_expired_total{reason="age"} 1.0' in metrics


def test_a_full_data_dir_loses_its_oldest_videos_first(world, tmp_path):
    data = tmp_path / "jobs"
    # smaller than one video: every finished video but the newest must go, oldest first
    args = ("--workers", "1", "--max-data-size", "1K", "--data", str(data))
    with Server(world, *args) as srv, srv.client() as c:
        ids = []
        for _ in range(3):
            made = post_render(c, "/v1/lip-sync", world / "two.wav")
            assert made.status_code == 200 and made.content[4:8] == b"ftyp"
            ids.append(made.headers["x-hotplate-job"])
            # the cap is applied as each video is finished, before its answer is sent
            on_disk = sorted(p.stem for p in (data / "videos").glob("*.mp4"))
            assert on_disk == [ids[-1]], (on_disk, ids)
            for old in ids[:-1]:
                assert c.get(f"/v1/renders/{old}").json()["state"] == "expired"
                assert_problem(c.get(f"/v1/renders/{old}/video"), 410, "data dir was full")
            assert c.get(f"/v1/renders/{ids[-1]}/video").status_code == 200
        metrics = c.get("/metrics").text
        assert 'hotplate_videos_expired_total{reason="size"} 2.0' in metrics

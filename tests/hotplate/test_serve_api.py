"""`hotplate serve` over real HTTP: every endpoint, and every bad input refused with a
problem+json 4xx before it costs any work."""

import json

import numpy as np
import pytest

from hotplate.demo_data import write_wav
from testkit.serve_helpers import (
    Server,
    assert_problem,
    make_world,
    mp4_facts,
    post_render,
    speech,
    store_counters,
    wait_state,
)

pytestmark = pytest.mark.slow
MAX_AUDIO_SECONDS = 6.0


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("serve"), attires=("studio", "navy", "gala"))
    speech(root / "two.wav", 2.0)
    speech(root / "long.wav", 5.0, seed=1)
    return root


@pytest.fixture(scope="module")
def server(world):
    args = ["--workers", "1", "--max-upload-mb", "0.5"]
    with Server(world, *args, "--max-audio-seconds", str(MAX_AUDIO_SECONDS)) as srv:
        yield srv


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def test_health_readiness_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok", "token_required": False}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] and ready.json()["workers"] == 1
    assert "swagger" in client.get("/docs").text.lower()
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/lip-sync", "/v1/renders", "/v1/renders/{job_id}/events", "/v1/precompile"):
        assert path in paths
    page = client.get("/")
    assert page.status_code == 200 and "hotplate" in page.text
    assert client.get("/static/app.js").status_code == 200


def test_lip_sync_precompiles_a_cold_attire_then_hits(client, world, tmp_path):
    cold = {r["attire"]: r for r in client.get("/v1/personas").json()["personas"]}["studio"]
    assert cold["state"] == "cold" and cold["why"] and cold["thumbnail"] is None
    assert_problem(client.get("/v1/personas/astro/studio/thumbnail.jpg"), 404, "cold")

    first = post_render(client, "/v1/lip-sync", world / "two.wav")
    assert first.status_code == 200, first.text
    assert first.headers["content-type"] == "video/mp4"
    assert first.headers["x-hotplate-cache"] == "jit"
    assert float(first.headers["x-hotplate-jit-seconds"]) > 0
    total = float(first.headers["x-hotplate-total-seconds"])
    assert 0 < float(first.headers["x-hotplate-first-frame-seconds"]) <= total
    facts = mp4_facts(first.content, tmp_path / "jit.mp4")
    assert facts["video"] == "h264" and facts["audio"] == "aac"
    assert abs(facts["seconds"] - 2.0) <= 0.05

    hits = store_counters(world / "cache").get("hits", 0)
    second = post_render(client, "/v1/lip-sync", world / "two.wav")
    assert second.status_code == 200 and second.headers["x-hotplate-cache"] == "hit"
    assert float(second.headers["x-hotplate-jit-seconds"]) == 0
    assert store_counters(world / "cache")["hits"] == hits + 1

    hot = {r["attire"]: r for r in client.get("/v1/personas").json()["personas"]}["studio"]
    assert hot["state"] == "hot" and hot["why"] is None and hot["size"] > 0
    thumb = client.get(hot["thumbnail"])
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    import cv2

    image = cv2.imdecode(np.frombuffer(thumb.content, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (320, 180, 3)


def events_of(client, job_id):
    """Every SSE event of a job until its final one, as (event, data) pairs."""
    events, name = [], None
    with client.stream("GET", f"/v1/renders/{job_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
                if name in ("done", "failed"):
                    break
    return events


def test_queued_render_status_events_and_ranged_video(client, world):
    accepted = post_render(client, "/v1/renders", world / "long.wav")
    assert accepted.status_code == 202
    job = accepted.json()
    assert accepted.headers["location"] == f"/v1/renders/{job['id']}" == job["status_url"]
    events = events_of(client, job["id"])
    assert events[-1][0] == "done" and [e for e, _ in events[:-1]] == ["progress"] * (
        len(events) - 1
    )
    progress = [data["progress"] for _, data in events]
    assert progress == sorted(progress) and progress[-1] == 1.0 and len(progress) > 2

    done = client.get(job["status_url"]).json()
    assert done["state"] == "done" and done["audio_seconds"] == pytest.approx(5.0, abs=0.01)
    assert done["total_seconds"] >= done["first_frame_seconds"] > 0
    full = client.get(done["video_url"])
    assert full.status_code == 200 and full.headers["accept-ranges"] == "bytes"
    size = int(full.headers["content-length"])
    assert size == len(full.content)
    part = client.get(done["video_url"], headers={"Range": "bytes=100-1099"})
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100-1099/{size}"
    assert part.content == full.content[100:1100]
    tail = client.get(done["video_url"], headers={"Range": f"bytes={size - 10}-"})
    assert tail.status_code == 206 and tail.content == full.content[-10:]
    assert client.get(done["video_url"], headers={"Range": f"bytes={size}-"}).status_code == 416

    listed = [r["id"] for r in client.get("/v1/renders").json()["renders"]]
    assert job["id"] in listed
    assert client.delete(f"/v1/renders/{job['id']}").json() == {"id": job["id"], "deleted": True}
    assert_problem(client.get(job["status_url"]), 404, job["id"])
    assert_problem(client.get(done["video_url"]), 404)


def test_delete_cancels_a_running_job_and_removes_its_output(client, world, server):
    job = post_render(client, "/v1/renders", world / "long.wav", attire="gala").json()
    wait_state(client, job["id"], ("running",))  # cold, 5 s of audio: seconds of work left
    cancelled = client.delete(job["status_url"]).json()
    assert cancelled["state"] == "cancelled" and "DELETE" in cancelled["error"]
    assert not list((world / "cache-serve" / "videos").glob(f"{job['id']}*"))
    assert not list((world / "cache-serve" / "uploads").glob(f"{job['id']}*"))
    assert_problem(client.get(f"{job['status_url']}/video"), 409, "cancelled")
    # the killed worker was replaced: the next render is served
    again = post_render(client, "/v1/lip-sync", world / "two.wav", attire="gala")
    assert again.status_code == 200 and again.headers["x-hotplate-cache"] == "jit"


def test_precompile_makes_an_attire_hot_ahead_of_time(client):
    accepted = client.post("/v1/precompile", data={"persona": "astro", "attire": "navy"})
    assert accepted.status_code == 202
    done = wait_state(client, accepted.json()["id"], ("done", "failed"))
    assert done["state"] == "done" and done["jit"] is True and done["kind"] == "precompile"
    rows = client.get("/v1/personas").json()["personas"]
    assert {r["attire"]: r["state"] for r in rows}["navy"] == "hot"
    assert_problem(client.get(f"/v1/renders/{done['id']}/video"), 409)
    assert_problem(client.post("/v1/precompile", data={"persona": "astro", "attire": "x"}), 404)


def test_a_hot_still_has_a_thumbnail_and_renders_with_motion_default(client, world):
    """The catalog gives a still `?motion=default`; that used to answer 404."""
    accepted = client.post("/v1/precompile", data={"persona": "astro", "attire": "default"})
    assert wait_state(client, accepted.json()["id"], ("done", "failed"))["state"] == "done"
    rows = client.get("/v1/personas").json()["personas"]
    still = next(r for r in rows if r["kind"] == "still")
    assert still["state"] == "hot" and still["thumbnail"].endswith("?motion=default")
    thumb = client.get(still["thumbnail"])
    assert thumb.status_code == 200, thumb.text
    assert thumb.headers["content-type"] == "image/jpeg"
    rendered = post_render(
        client, "/v1/lip-sync", world / "two.wav", attire="default", motion="default"
    )
    assert rendered.status_code == 200, rendered.text
    assert rendered.headers["x-hotplate-cache"] == "hit"


def test_metrics_in_prometheus_text_format(client):
    text = client.get("/metrics")
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for line in text.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    for family in (
        "hotplate_render_seconds",
        "hotplate_jit_seconds",
        "hotplate_cache_hits_total",
        "hotplate_cache_misses_total",
        "hotplate_queue_depth",
        "hotplate_store_bytes",
        "hotplate_live_leases",
    ):
        assert f"# TYPE {family} " in text.text
    assert samples['hotplate_renders_total{outcome="done"}'] >= 1
    assert (
        samples["hotplate_render_seconds_count"]
        == samples['hotplate_render_seconds_bucket{le="+Inf"}']
    )
    assert samples["hotplate_jit_total"] >= 1 and samples["hotplate_store_bytes"] > 0
    # issue 24's dashboard: admission, waits, latency by route template, speed, workers
    assert samples['hotplate_requests_admitted_total{kind="render"}'] >= 1
    assert samples['hotplate_queue_wait_seconds_count{kind="render"}'] >= 1
    route = 'hotplate_http_request_duration_seconds_count{method="POST",route="/v1/lip-sync"}'
    assert samples[route] >= 1
    assert not any('route="/v1/renders/' in name and "{job_id}" not in name for name in samples)
    assert samples['hotplate_render_realtime_factor_count{backend="warp",kind="render"}'] >= 1
    assert samples["hotplate_workers"] == 1 and samples["hotplate_workers_busy"] == 0


def junk(path, data):
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "fields, audio, status, words",
    [
        ({"persona": "nobody"}, "two.wav", 404, ["nobody", "astro"]),
        ({"attire": "tuxedo"}, "two.wav", 404, ["tuxedo", "studio", "navy"]),
        ({"motion": "M9"}, "two.wav", 404, ["M9", "default"]),
        ({"persona": "../etc"}, "two.wav", 404, ["not a plain"]),
        ({"attire": "../../secrets"}, "two.wav", 404, ["not a plain"]),
        ({"backend": "deepfake"}, "two.wav", 422, ["warp"]),
        ({}, "junk.wav", 415, ["junk.wav", "WAV"]),
        ({}, "text.mp3", 415, ["text.mp3"]),
        ({}, "silent.wav", 422, ["no audio samples"]),
        ({}, "eight.wav", 422, ["over the 6 s limit"]),
        ({}, "big.wav", 413, ["0.5 MB"]),
    ],
    ids=[
        "persona",
        "attire",
        "motion",
        "persona-escape",
        "attire-escape",
        "backend",
        "junk-audio",
        "text-audio",
        "empty-audio",
        "too-long",
        "too-big",
    ],
)
def test_bad_input_gets_a_clear_4xx_and_costs_nothing(client, world, fields, audio, status, words):
    junk(world / "junk.wav", b"RIFF" + bytes(300))
    junk(world / "text.mp3", b"this is not audio at all\n" * 20)
    write_wav(world / "silent.wav", np.zeros(0, np.float32), 16000)
    speech(world / "eight.wav", 8.0)
    junk(world / "big.wav", bytes(600_000))
    before = client.get("/v1/renders").json()["renders"]
    misses = store_counters(world / "cache").get("misses", 0)
    for route in ("/v1/lip-sync", "/v1/renders"):
        assert_problem(post_render(client, route, world / audio, **fields), status, *words)
    assert client.get("/v1/renders").json()["renders"] == before
    assert store_counters(world / "cache").get("misses", 0) == misses
    assert not list((world / "cache-serve" / "uploads").iterdir())


def test_missing_fields_and_unknown_renders(client, world):
    with open(world / "two.wav", "rb") as f:
        no_persona = client.post("/v1/lip-sync", files={"audio": ("two.wav", f, "audio/wav")})
    assert_problem(no_persona, 422, "persona")
    assert_problem(client.post("/v1/renders", data={"persona": "astro"}), 422, "audio")
    for method, path in (
        ("GET", "/v1/renders/feedbeef"),
        ("GET", "/v1/renders/feedbeef/video"),
        ("GET", "/v1/renders/feedbeef/events"),
        ("DELETE", "/v1/renders/feedbeef"),
    ):
        assert_problem(client.request(method, path), 404, "feedbeef", "GET /v1/renders")
    assert_problem(client.get("/v1/nothing-here"), 404)


def test_chunked_upload_over_the_limit_is_refused(client, world):
    """No Content-Length (a streamed body): the limit holds while the upload is read."""

    def body():
        yield b"--b\r\nContent-Disposition: form-data; name=persona\r\n\r\nastro\r\n"
        yield b'--b\r\nContent-Disposition: form-data; name=audio; filename="a.wav"\r\n\r\n'
        for _ in range(8):
            yield bytes(100_000)
        yield b"\r\n--b--\r\n"

    response = client.post(
        "/v1/renders", content=body(), headers={"content-type": "multipart/form-data; boundary=b"}
    )
    assert_problem(response, 413, "0.5 MB")

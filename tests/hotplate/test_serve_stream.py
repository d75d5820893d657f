"""The streaming routes on a real `hotplate serve` (uvicorn on loopback, real workers):
`POST /v1/lip-sync/stream` read incrementally, `WS /v1/live` fed real-time-paced PCM,
and every kind of bad live input closed cleanly with the worker freed and no file left."""

import json
import math
import struct

import httpx
import numpy as np
import pytest

from hotplate.demo_data import make_speech_audio
from hotplate.serve.stream_jobs import fragment_samples
from pipeline.render.audio import n_video_frames
from pipeline.render.fmp4 import fragment_frames, fragment_starts
from pipeline.render.live import LOOKAHEAD
from testkit.serve_helpers import SIZE, Server, make_world, speech, wait_state
from testkit.stream_helpers import Boxes, decode_facts, live_connect, live_session, pcm16

pytestmark = pytest.mark.slow
FPS = 25.0
MAX_AUDIO_SECONDS = 120.0  # long enough for a never-reading client to outgrow the
# loopback socket buffers (tcp_wmem's max, 4 MiB here) before its render ends
START = {"persona": "astro", "attire": "studio", "sample_rate": 16000, "channels": 1}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("stream"))
    speech(root / "eight.wav", 8.0)
    return root


@pytest.fixture(scope="module")
def server(world):
    args = ["--workers", "1", "--max-audio-seconds", str(MAX_AUDIO_SECONDS)]
    env = {"HOTPLATE_LIVE_SEND_TIMEOUT": "2"}
    with Server(world, *args, env=env) as srv:
        with srv.client() as c:  # make the avatar hot first: these tests stream hot
            job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"})
            assert wait_state(c, job.json()["id"], ("done", "failed"))["state"] == "done"
        yield srv


def leftovers(world) -> list[str]:
    data = world / "cache-serve"
    return sorted(p.name for sub in ("uploads", "videos") for p in (data / sub).iterdir())


def test_stream_sends_fragments_while_it_renders(server, world, tmp_path):
    seconds = 8.0
    total = n_video_frames(seconds, FPS)
    per = fragment_frames(FPS)
    data, first_moof_progress, kinds = b"", None, []
    with httpx.Client(base_url=server.url, timeout=300) as c:
        with open(world / "eight.wav", "rb") as f:
            form = {"persona": "astro", "attire": "studio"}
            files = {"audio": ("eight.wav", f, "audio/wav")}
            with c.stream("POST", "/v1/lip-sync/stream", data=form, files=files) as r:
                assert r.status_code == 200, r.read()
                assert r.headers["content-type"] == "video/mp4"
                assert r.headers["transfer-encoding"] == "chunked"
                job_id = r.headers["x-hotplate-job"]
                assert r.headers["x-hotplate-events"] == f"/v1/renders/{job_id}/events"
                boxes = Boxes()
                for chunk in r.iter_raw():
                    data += chunk
                    for kind, _box in boxes.feed(chunk):
                        kinds.append(kind)
                        if kind == "moof" and first_moof_progress is None:
                            # The job's progress now is at least what it was when this
                            # moof arrived (the worker reports frames as it renders).
                            job = c.get(f"/v1/renders/{job_id}").json()
                            first_moof_progress = job
        job = wait_state(c, job_id, ("done", "failed"))
    assert job["state"] == "done", job
    assert kinds[:2] == ["ftyp", "moov"] and kinds[2] == "moof"
    assert kinds[2:] == ["moof", "mdat"] * ((len(kinds) - 2) // 2)
    p = first_moof_progress
    assert p["state"] == "running" and p["step"] == "render", p
    assert p["done"] < p["total"] / 2, f"first fragment only after {p['done']}/{p['total']}"

    facts = decode_facts(data, tmp_path / "stream.mp4")
    assert facts["frames"] == total and facts["size"] == SIZE
    starts = []
    for t in fragment_starts(per):
        if t >= total:
            break
        starts.append(t)
    assert facts["keyframes"] == starts  # each fragment starts on one, and only there
    frags = fragments_of(data)
    assert [fragment_samples(f) for f in frags] == np.diff([*starts, total]).tolist()
    assert max(np.diff(starts)) == per <= 0.5 * FPS
    # within a frame: the muxer lengthens frame 0 by the AAC encoder's priming (21 ms)
    assert abs(facts["video_seconds"] - total / FPS) <= 1 / FPS
    assert abs(facts["audio_seconds"] - facts["video_seconds"]) <= 1 / FPS
    assert leftovers(world) == [f"{job_id}.mp4"]  # the job's video, kept as a render's is


def fragments_of(data: bytes) -> list[bytes]:
    out, pending = [], None
    for kind, box in Boxes().feed(data):
        if kind == "moof":
            pending = box
        elif kind == "mdat" and pending is not None:
            out.append(pending + box)
    return out


def test_live_fragments_come_back_while_the_audio_is_sent(server, world, tmp_path):
    seconds = 6.0
    audio = make_speech_audio(seconds, sr=16000, seed=3)
    res = live_session(server.url, {**START, "format": "s16le"}, pcm16(audio), 32000)
    assert res.final and res.final["type"] == "done", res.final
    assert res.init[4:8] == b"ftyp"
    # fragments came back while the client was still sending
    assert res.fragments_before_end >= 3, res.fragments_before_end
    assert res.arrivals[0] < res.sent_all_at
    total = n_video_frames(seconds, FPS)
    assert res.frames == total == res.final["frames"]
    # When the end message left, the client had every frame but the last fragment's
    # worth: one fragment, the renderer's lookahead, and the chunk still in flight.
    before = sum(fragment_samples(f) for f in res.fragments[: res.fragments_before_end])
    per, look, chunk = fragment_frames(FPS), LOOKAHEAD["warp"], math.ceil(0.1 * FPS)
    assert total - before <= per + look + chunk + 1, (total, before)
    facts = decode_facts(res.data, tmp_path / "live.mp4")
    assert facts["frames"] == total and facts["size"] == SIZE
    assert abs(facts["audio_seconds"] - facts["video_seconds"]) <= 1 / FPS
    for key in ("first_fragment_seconds", "end_lag_seconds"):
        assert res.final[key] >= 0
    job = wait_state(httpx.Client(base_url=server.url), res.final["job"], ("done", "failed"))
    assert job["state"] == "done" and job["kind"] == "live"
    assert not [n for n in leftovers(world) if n.endswith((".pcm", ".part"))]


def test_live_stereo_44k_input(server, tmp_path):
    audio = make_speech_audio(2.0, sr=44100, seed=4)
    start = {**START, "sample_rate": 44100, "channels": 2, "format": "s16le"}
    res = live_session(server.url, start, pcm16(audio, 2), 44100 * 4, realtime=False)
    assert res.final and res.final["type"] == "done", res.final
    assert res.frames == n_video_frames(2.0, FPS)


def error_of(ws) -> tuple[dict, int | None]:
    """The error message the server sends, then its close code."""
    from websockets.exceptions import ConnectionClosed

    msg = None
    try:
        while True:
            m = ws.recv(timeout=120)
            if isinstance(m, str):
                msg = json.loads(m)
    except ConnectionClosed as exc:
        return msg, exc.rcvd.code if exc.rcvd else None


def job_of_last_live(server) -> dict:
    with httpx.Client(base_url=server.url) as c:
        jobs = [j for j in c.get("/v1/renders").json()["renders"] if j["kind"] == "live"]
        return wait_state(c, jobs[0]["id"], ("done", "failed", "cancelled"))


@pytest.mark.parametrize(
    "first, code, words",
    [
        (b"\x00\x01", 1003, "text JSON"),
        ("not json", 1003, "not JSON"),
        (json.dumps({**START, "format": "f32le"}), 1003, "'f32le' is not supported"),
        (json.dumps({**START, "sample_rate": 7}), 1003, "sample_rate 7"),
        (json.dumps({**START, "persona": "nobody"}), 1003, "nobody"),
        (json.dumps({**START, "profile": "fast"}), 1003, "'fast' is not one of preview, export"),
    ],
)
def test_live_refuses_a_bad_start_message(server, world, first, code, words):
    before = leftovers(world)
    with live_connect(server.url) as ws:
        ws.send(first)
        msg, got = error_of(ws)
    assert msg["type"] == "error" and words in msg["detail"], msg
    assert got == code
    assert leftovers(world) == before


@pytest.mark.parametrize("route", ["/v1/lip-sync/stream", "/v1/lip-sync"])
def test_an_unknown_profile_is_a_422_naming_the_profiles(server, world, route):
    before = leftovers(world)
    with httpx.Client(base_url=server.url, timeout=60) as c, open(world / "eight.wav", "rb") as f:
        form = {"persona": "astro", "attire": "studio", "profile": "fast"}
        r = c.post(route, data=form, files={"audio": ("eight.wav", f, "audio/wav")})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert "'fast' is not one of preview, export" in detail and "\n" not in detail
    assert leftovers(world) == before


def test_live_refuses_oversize_and_bad_messages_and_frees_the_worker(server, world):
    before = leftovers(world)
    too_long = pcm16(make_speech_audio(MAX_AUDIO_SECONDS + 2, sr=16000))
    with live_connect(server.url) as ws:
        ws.send(json.dumps(START))
        for i in range(0, len(too_long), 64000):
            try:
                ws.send(too_long[i : i + 64000])
            except Exception:  # noqa: BLE001 - the server closed it, as it should
                break
        msg, code = error_of(ws)
    assert msg["type"] == "error" and "over the limit" in msg["detail"] and code == 1009
    assert job_of_last_live(server)["state"] in ("failed", "cancelled")
    assert leftovers(world) == before

    with live_connect(server.url) as ws:
        ws.send(json.dumps(START))
        ws.send(pcm16(make_speech_audio(1.0, sr=16000)))
        ws.send(json.dumps({"type": "pause"}))
        msg, code = error_of(ws)
    assert msg["type"] == "error" and '{"type": "end"}' in msg["detail"] and code == 1003
    assert job_of_last_live(server)["state"] in ("failed", "cancelled")
    assert leftovers(world) == before
    assert_worker_serves(server)


def assert_worker_serves(server) -> None:
    res = live_session(
        server.url, START, pcm16(make_speech_audio(1.0, sr=16000)), 32000, realtime=False
    )
    assert res.final and res.final["type"] == "done", res.final
    assert res.frames == n_video_frames(1.0, FPS)


def test_live_disconnect_mid_stream_stops_the_job(server, world):
    before = leftovers(world)
    ws = live_connect(server.url)
    ws.send(json.dumps(START))
    pcm = pcm16(make_speech_audio(3.0, sr=16000))
    ws.send(pcm[: len(pcm) // 2])
    # wait for the first fragment (the job is running), then vanish without a close
    while not (isinstance(m := ws.recv(timeout=120), bytes) and m[4:8] == b"moof"):
        pass
    ws.socket.shutdown(2)
    ws.socket.close()
    job = job_of_last_live(server)
    assert job["state"] in ("failed", "cancelled"), job
    assert leftovers(world) == before
    assert_worker_serves(server)


def test_live_client_that_never_reads_is_dropped(server, world):
    """The server holds one fragment per client at most: a client that reads nothing is
    dropped once a send has waited HOTPLATE_LIVE_SEND_TIMEOUT (2 s here)."""
    from websockets.exceptions import ConnectionClosed

    before = leftovers(world)
    seconds = MAX_AUDIO_SECONDS - 10  # ~9 MB of fragments at this size
    ws = live_connect(server.url, rcvbuf=4096)
    ws.send(json.dumps(START))
    pcm = pcm16(make_speech_audio(seconds, sr=16000))
    for i in range(0, len(pcm), 64000):
        ws.send(pcm[i : i + 64000])
    ws.send(json.dumps({"type": "end"}))
    job = job_of_last_live(server)  # the render ends while the client reads nothing
    # Now read: what was in flight, then the close; never the whole stream or a "done".
    got, final = 0, None
    try:
        while True:
            m = ws.recv(timeout=120)
            if isinstance(m, bytes) and m[4:8] == b"moof":
                got += fragment_samples(m)
            elif isinstance(m, str):
                final = json.loads(m)
    except ConnectionClosed:
        pass
    assert final is None or final["type"] == "error", final
    assert got < n_video_frames(seconds, FPS)
    assert leftovers(world) == before  # the dropped session's video is not kept
    job = job_of_last_live(server)
    assert job["error"] and "read nothing" in job["error"], job
    assert_worker_serves(server)


def test_fragment_samples_counts_the_video_track():
    def box(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", 8 + len(body)) + kind + body

    def traf(tid: int, n: int) -> bytes:
        tfhd = box(b"tfhd", b"\x00\x02\x00\x00" + struct.pack(">I", tid))
        trun = box(b"trun", b"\x00\x00\x03\x01" + struct.pack(">I", n))
        return box(b"traf", tfhd + trun)

    moof = box(b"moof", box(b"mfhd", b"\x00" * 8) + traf(1, 12) + traf(2, 23))
    assert fragment_samples(moof + box(b"mdat", b"x")) == 12
    assert fragment_samples(moof, track=2) == 23

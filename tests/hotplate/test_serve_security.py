"""`hotplate serve` attacked as a studio's network would attack it, over real HTTP on
loopback: uploads that would fill the disk, audio bombs, reads without a token, CSRF and
DNS rebinding, one client deleting another's job. Each test failed before the guard."""

import time

import httpx
import pytest

from tests.hotplate.serve_attacks import (
    MB,
    ChunkedUpload,
    held_bytes,
    hide_flac_length,
    peak_rss,
    write_flac,
)
from tests.hotplate.serve_helpers import Server, assert_problem, make_world, speech

pytestmark = pytest.mark.slow
A, B, ADMIN = "token-of-client-a", "token-of-client-b", "the-admin-token"
MAX_UPLOAD_MB = 3
MAX_AUDIO_SECONDS = 6
STUDIO = "http://studio.example"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("security"), attires=("studio", "navy"))
    speech(root / "two.wav", 2.0)
    (root / "tokens").write_text(f"# one per client\n{A}\n\n{B}\n")
    (root / "admin").write_text(f"{ADMIN}\n")
    (root / "tmp").mkdir()
    return root


@pytest.fixture(scope="module")
def server(world):
    args = ["--workers", "1", "--token-file", str(world / "tokens")]
    args += ["--admin-token-file", str(world / "admin"), "--allow-origin", STUDIO]
    args += ["--max-upload-mb", str(MAX_UPLOAD_MB), "--max-audio-seconds", str(MAX_AUDIO_SECONDS)]
    env = {"TMPDIR": str(world / "tmp")}  # where Starlette spools uploads
    with Server(world, *args, env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """A tokenless server on loopback: the one a web page in the editor's browser can reach."""
    root = make_world(tmp_path_factory.mktemp("open"), attires=("studio",))
    with Server(root, "--workers", "1") as srv:
        yield srv


def server_pids(srv: Server) -> list[int]:
    with srv.client() as c:
        return [srv.proc.pid, *c.get("/readyz").json()["worker_pids"]]


# -- S1: the body is limited as it arrives ------------------------------------------------


@pytest.mark.parametrize("who", ["no-token", "token-over-the-limit"])
def test_a_gigabyte_chunked_upload_is_refused_holding_at_most_the_limit(server, world, who):
    pids = server_pids(server)
    dirs = [world / "tmp", world / "cache-serve"]
    before = held_bytes(pids, dirs)
    upload = ChunkedUpload(
        server.port, "/v1/renders", bearer(A) if who != "no-token" else {}, total=1 << 30
    )
    status, largest = upload.run(lambda: held_bytes(pids, dirs) - before)
    assert status == (401 if who == "no-token" else 413), upload.answer[:300]
    assert b"application/problem+json" in upload.answer and b"x-request-id" in upload.answer
    assert largest <= MAX_UPLOAD_MB * MB + (64 << 10), f"{largest / MB:.1f} MB held"
    assert upload.sent < 1 << 30  # cut off: the server did not read the rest
    if who == "no-token":  # nothing at all is read before the token is checked
        assert largest < 1 * MB
    assert server.proc.poll() is None
    with server.client(headers=bearer(A)) as c:
        assert c.get("/v1/renders").json()["renders"] == []  # nothing was queued


def test_a_declared_length_over_the_limit_is_refused_before_the_body(server, world):
    with server.client(headers=bearer(A)) as c:
        body = b"x" * (MAX_UPLOAD_MB * MB + (128 << 10))
        answer = c.post(
            "/v1/renders", content=body, headers={"content-type": "multipart/form-data; boundary=b"}
        )
    assert_problem(answer, 413, f"{MAX_UPLOAD_MB:g} MB")


# -- S2: audio bombs -----------------------------------------------------------------------


@pytest.mark.parametrize("length", ["in-the-header", "hidden"])
def test_a_long_flac_is_refused_without_decoding_it_whole(server, world, tmp_path, length):
    """Three hours of silence (2 MB) claims its length; a noisy 40 s FLAC whose
    header claims nothing is decoded frame by frame and stopped at the limit."""
    if length == "in-the-header":
        bomb = write_flac(tmp_path / "bomb.flac", 3 * 3600)
        words = ["10800.0 s by its header", f"over the {MAX_AUDIO_SECONDS} s limit"]
    else:
        bomb = hide_flac_length(write_flac(tmp_path / "bomb.flac", 40, noise=True))
        words = [f"more than {MAX_AUDIO_SECONDS} s (decoding stopped there)"]
    assert bomb.stat().st_size < MAX_UPLOAD_MB * MB
    pids = server_pids(server)
    peaks = [peak_rss(pid) for pid in pids]
    with server.client(headers=bearer(A)) as c:
        with open(bomb, "rb") as f:
            answer = c.post(
                "/v1/renders",
                data={"persona": "astro", "attire": "studio"},
                files={"audio": ("bomb.flac", f, "audio/flac")},
            )
        assert_problem(answer, 422, *words)
        assert c.get("/v1/renders").json()["renders"] == []
    grown = [peak_rss(pid) - before for pid, before in zip(pids, peaks, strict=True)]
    # decoding 3 h whole to float32 at 16 kHz took ~1.4 GB; one frame at a time, nothing
    assert max(grown) < 64 * MB, [f"{g / MB:.0f} MB" for g in grown]
    assert not list((world / "cache-serve" / "uploads").iterdir())


# -- S3: reads need the token --------------------------------------------------------------


def every_route(client: httpx.Client) -> list[tuple[str, str]]:
    """(method, path) of every route in the server's own OpenAPI, path parameters filled."""
    paths = client.get("/openapi.json").json()["paths"]
    routes = []
    for path, methods in paths.items():
        for method in methods:
            filled = path
            for part in path.split("/"):
                if part.startswith("{"):
                    filled = filled.replace(part, "x")
            routes.append((method.upper(), filled))
    return routes


def test_every_api_route_and_metrics_need_the_token(server):
    with server.client() as c:
        routes = every_route(c)
        assert ("GET", "/v1/renders/x/video") in routes and ("GET", "/v1/personas") in routes
        for method, path in routes:
            if path in ("/healthz", "/readyz"):
                continue
            answer = c.request(method, path)
            assert_problem(answer, 401, "Bearer")
            assert answer.headers["x-request-id"] == answer.json()["request_id"]
            assert_problem(c.request(method, path, headers=bearer("guess")), 403, "token")
        assert_problem(c.get("/metrics"), 401)
        assert c.get("/healthz").json()["token_required"] is True
        assert c.get("/readyz").status_code == 200
        assert c.get("/metrics", headers=bearer(B)).status_code == 200
        assert c.get("/docs").status_code == 200 and c.get("/openapi.json").status_code == 200


def test_a_signed_url_opens_one_path_for_a_get(server):
    with server.client(headers=bearer(A)) as c:
        url = c.get("/v1/sign", params={"path": "/v1/renders"}).json()["url"]
        assert_problem(c.get("/v1/sign", params={"path": "/etc/passwd"}), 422)
    with server.client() as anonymous:
        assert anonymous.get(url).status_code == 200
        sig = url.split("?", 1)[1]
        assert_problem(anonymous.get(f"/v1/personas?{sig}"), 403, "signed URL")
        assert_problem(anonymous.get(url[:-2] + ("00" if url[-2:] != "00" else "11")), 403)
        assert_problem(anonymous.post(url, data={"persona": "astro"}), 401)  # GETs only


# -- S4: CSRF, DNS rebinding, another client's job ----------------------------------------


def test_a_cross_origin_post_is_refused_and_curl_still_works(open_server):
    with open_server.client() as c:
        form = {"persona": "nobody"}  # past the guard it is a 404: no work is queued
        evil = {"Origin": "http://evil.example"}
        assert_problem(c.post("/v1/precompile", data=form, headers=evil), 403, "evil.example")
        assert_problem(c.delete("/v1/renders/x", headers=evil), 403)
        assert_problem(c.post("/v1/precompile", data=form, headers={"Origin": "null"}), 403)
        site = {"Sec-Fetch-Site": "cross-site"}
        assert_problem(c.post("/v1/precompile", data=form, headers=site), 403)
        own = {"Origin": open_server.url}
        assert_problem(c.post("/v1/precompile", data=form, headers=own), 404, "nobody")
        assert_problem(c.post("/v1/precompile", data=form), 404, "nobody")  # curl: no Origin
        assert c.get("/v1/renders", headers=evil).status_code == 200  # reads are not CSRF


def test_an_allowed_origin_may_post(server):
    with server.client(headers=bearer(A)) as c:
        form = {"persona": "nobody"}
        assert_problem(c.post("/v1/precompile", data=form, headers={"Origin": STUDIO}), 404)
        preflight = c.options(
            "/v1/renders",
            headers={"Origin": STUDIO, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.headers["access-control-allow-origin"] == STUDIO
        assert_problem(c.post("/v1/precompile", data=form, headers={"Origin": "http://x.y"}), 403)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io"])
def test_a_foreign_host_header_is_refused(open_server, host):
    with open_server.client() as c:
        answer = c.get("/v1/renders", headers={"Host": host.format(port=open_server.port)})
        assert_problem(answer, 421, "--allowed-host")
        for ok in (f"localhost:{open_server.port}", f"127.0.0.1:{open_server.port}", "[::1]"):
            assert c.get("/v1/renders", headers={"Host": ok}).status_code == 200


def test_only_the_owner_or_the_admin_may_cancel_or_delete_a_job(server):
    with server.client(headers=bearer(A)) as a, server.client(headers=bearer(B)) as b:
        job = a.post("/v1/precompile", data={"persona": "astro", "attire": "navy"}).json()
        assert job["owner"] and job["owner"] != B and A not in job["owner"]
        assert_problem(b.delete(job["status_url"]), 403, "another client")
        assert b.get(job["status_url"]).json()["id"] == job["id"]  # reading is shared
        assert a.delete(job["status_url"]).status_code == 200
        other = b.post("/v1/precompile", data={"persona": "astro", "attire": "navy"}).json()
        assert_problem(a.delete(other["status_url"]), 403)
        with server.client(headers=bearer(ADMIN)) as admin:
            assert admin.delete(other["status_url"]).status_code == 200


# -- errors ----------------------------------------------------------------------------------


def test_errors_name_no_server_path_and_carry_a_request_id(server, world):
    with server.client(headers=bearer(A)) as c:
        answer = c.post("/v1/precompile", data={"persona": "nobody"})
        body = assert_problem(answer, 404, "nobody")
        assert str(world) not in answer.text and body["request_id"]
        assert answer.headers["x-request-id"] == body["request_id"]
    deadline = time.monotonic() + 30  # the log line with the same id has the detail
    while body["request_id"] not in server.log_text():
        assert time.monotonic() < deadline, server.log_text()
        time.sleep(0.1)
    line = next(x for x in server.log_text().splitlines() if body["request_id"] in x)
    assert "404" in line and "nobody" in line


def test_the_audio_limit_defaults_to_ten_minutes():
    from hotplate.cli.serve import serve

    default = {p.name: p.default for p in serve.params}["max_audio_seconds"]
    assert default == 600.0


def test_jobs_made_before_tokens_were_set_are_the_admins_to_delete(tmp_path):
    root = make_world(tmp_path, attires=("studio",))
    (root / "tokens").write_text(f"{A}\n")
    (root / "admin").write_text(f"{ADMIN}\n")
    with Server(root, "--workers", "1") as srv, srv.client() as c:  # tokenless, loopback
        job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"}).json()
        assert job["owner"] == "local"
    args = ("--workers", "1", "--token-file", str(root / "tokens"))
    with Server(root, *args, "--admin-token-file", str(root / "admin")) as srv:
        with srv.client(headers=bearer(A)) as a:
            assert_problem(a.delete(job["status_url"]), 403, "another client")
        with srv.client(headers=bearer(ADMIN)) as admin:
            assert admin.delete(job["status_url"]).status_code == 200

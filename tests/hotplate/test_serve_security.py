"""`hotplate serve` attacked as a studio's network would attack it, over real HTTP on
loopback: uploads that would fill the disk, audio bombs, reads without a token, CSRF and
DNS rebinding, one client deleting another's job. Each test failed before the guard."""

import os
import socket
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.serve_attacks import (
    MB,
    ChunkedUpload,
    held_bytes,
    hide_flac_length,
    peak_rss,
    write_flac,
)
from testkit.serve_helpers import Server, assert_problem, make_world, speech, worker_pids

pytestmark = pytest.mark.slow
A, B, ADMIN = "token-of-client-a", "token-of-client-b", "the-admin-token"
MAX_UPLOAD_MB = 3
MAX_AUDIO_SECONDS = 6
STUDIO = "http://studio.example"
FUZZ_EXAMPLES = int(os.environ.get("HOTPLATE_FUZZ_EXAMPLES", "15")) * 10


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
    return [srv.proc.pid, *worker_pids(srv.proc.pid)]


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


def test_a_signed_url_opens_one_method_path_and_query(server):
    with server.client(headers=bearer(A)) as c:
        url = c.get("/v1/sign", params={"path": "/v1/renders?limit=1"}).json()["url"]
        live = c.get("/v1/sign", params={"path": "/v1/live", "method": "WEBSOCKET"}).json()
        assert_problem(c.get("/v1/sign", params={"path": "/etc/passwd"}), 422)
        # what mints signatures is never signed: such a URL would sign any path, forever
        for path in ("/v1/sign", "/v1/sign?path=/v1/personas"):
            assert_problem(c.get("/v1/sign", params={"path": path}), 422, "cannot be signed")
    sig = url.split("sig=", 1)[1]
    with server.client() as anonymous:
        assert anonymous.get(url).status_code == 200
        # HEAD is a GET without the body: the guard lets it through (the route has no HEAD)
        assert anonymous.head(url).status_code not in (401, 403)
        assert_problem(anonymous.get(f"/v1/personas?sig={sig}"), 403, "signed URL")
        assert_problem(anonymous.get(url.replace("limit=1", "limit=500")), 403)  # the query
        assert_problem(anonymous.get(url + "&limit=2"), 403)
        assert_problem(anonymous.get(f"/v1/sign?path=/v1/personas&sig={sig}"), 403)
        assert_problem(anonymous.get(live["url"].replace("/v1/live", "/v1/renders")), 403)
        assert_problem(anonymous.get(url[:-2] + ("00" if url[-2:] != "00" else "11")), 403)
        assert_problem(anonymous.post(url, data={"persona": "astro"}), 401)  # GETs only


MALFORMED = [
    "c-0123456789abcdef.u.\u00b2.{mac}",  # int() of a superscript two raised: a 500
    "c-0123456789abcdef.u.99999999999.{mac_non_ascii}",  # compare_digest of non-ASCII: a 500
    "c-0123456789abcdef.u.\u0663\u0663\u0663.{mac}",  # Arabic-Indic digits
    "c-0123456789abcdef.a.99999999999999999999999.{mac}",
    "...",
    "",
    ".u.1.",
    "c-x.u.1",
    "c-x.q.1.{mac}",
    "\x00.u.1.{mac}",
    "c-x.u.-1.{mac}",
]


@pytest.mark.parametrize("template", MALFORMED)
def test_a_malformed_signature_is_a_403(server, template):
    sig = template.format(mac="0" * 64, mac_non_ascii="\u00e9" * 64)
    with server.client() as anonymous:
        assert_problem(anonymous.get("/v1/renders", params={"sig": sig}), 403)


SIG_TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120)
SIG_PARTS = st.tuples(
    st.one_of(SIG_TEXT, st.just("c-0123456789abcdef")),
    st.one_of(SIG_TEXT, st.sampled_from(["a", "u"])),
    st.one_of(SIG_TEXT, st.integers(-(10**30), 10**30).map(str)),
    st.one_of(SIG_TEXT, st.text("0123456789abcdef\u00e9\u0663", min_size=64, max_size=64)),
).map(".".join)


@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sig=st.one_of(SIG_TEXT, SIG_PARTS), path=st.sampled_from(["/v1/renders", "/v1/live"]))
def test_no_signature_gets_a_500(server, sig, path):
    """Hypothesis over whatever a `sig=` can carry, sent percent-encoded as a browser
    would: never anything but a 403."""
    with server.client(timeout=30) as anonymous:
        answer = anonymous.get(path, params={"sig": sig})
    assert_problem(answer, 403)


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
        # a WHEP player on the studio's page trickles its candidates (PATCH, If-Match)
        trickle = c.options(
            "/v1/sessions/s/whep/peer",
            headers={
                "Origin": STUDIO,
                "Access-Control-Request-Method": "PATCH",
                "Access-Control-Request-Headers": "content-type, if-match",
            },
        )
        assert trickle.status_code == 200, trickle.text
        assert "PATCH" in trickle.headers["access-control-allow-methods"]
        # and the PATCH itself: the studio's reaches the session's worker (which has no
        # peer yet: 409) with the CORS header; another site's is refused before it (403)
        made = c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
        assert made.status_code == 201, made.text
        peer = f"/v1/sessions/{made.json()['id']}/whep/peer"
        frag = "a=mid:0\r\na=candidate:1 1 udp 2130706431 127.0.0.1 9 typ host\r\n"
        kind = {"content-type": "application/trickle-ice-sdpfrag", "if-match": '"x"'}
        try:
            ours = c.patch(peer, content=frag, headers={**kind, "Origin": STUDIO})
            assert_problem(ours, 409, "offer")
            assert ours.headers["access-control-allow-origin"] == STUDIO
            evil = c.patch(peer, content=frag, headers={**kind, "Origin": "http://evil.example"})
            assert_problem(evil, 403, "evil.example")
            assert "access-control-allow-origin" not in evil.headers
            site = c.patch(peer, content=frag, headers={**kind, "Sec-Fetch-Site": "cross-site"})
            assert_problem(site, 403)
            assert c.get(peer.removesuffix("/whep/peer")).status_code == 200  # it lives on
        finally:
            c.delete(peer.removesuffix("/whep/peer"))
        assert_problem(c.post("/v1/precompile", data=form, headers={"Origin": "http://x.y"}), 403)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:{port}", "127.0.0.1.nip.io"])
def test_a_foreign_host_header_is_refused(open_server, host):
    with open_server.client() as c:
        answer = c.get("/v1/renders", headers={"Host": host.format(port=open_server.port)})
        assert_problem(answer, 421, "--allowed-host")
        for ok in (f"localhost:{open_server.port}", f"127.0.0.1:{open_server.port}", "[::1]"):
            assert c.get("/v1/renders", headers={"Host": ok}).status_code == 200


def raw_status(port: int, request: str) -> tuple[int, bytes]:
    """Send `request` (CRLF lines, as given: repeated headers stay repeated) over a socket;
    the status and the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request.encode("latin-1"))
        answer = b""
        while chunk := sock.recv(65536):  # to the end: the request says Connection: close
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


@pytest.mark.parametrize(
    "headers, method",
    [
        (["Host: evil.example", "Host: 127.0.0.1:{port}"], "GET /v1/renders"),
        (
            ["Host: 127.0.0.1:{port}", "Origin: http://evil.example", "Origin: {own}"],
            "DELETE /v1/renders/x",
        ),
    ],
)
def test_a_repeated_host_or_origin_header_is_refused(open_server, headers, method):
    """The guard read the last Host or Origin and Starlette the first: a foreign name
    first and the server's own last passed the guard and reached the app as foreign."""
    lines = [f"{method} HTTP/1.1", *headers, "Connection: close", "", ""]
    own = open_server.url
    status, answer = raw_status(
        open_server.port, "\r\n".join(lines).format(port=open_server.port, own=own)
    )
    assert status == 400, answer[:300]
    name = "Host" if method.startswith("GET") else "Origin"
    assert f"2 {name} headers".encode() in answer


def test_readyz_names_no_process(server):
    with server.client() as anonymous:  # a probe sends no token
        answer = anonymous.get("/readyz")
    assert answer.status_code == 200
    assert set(answer.json()) == {"ready", "draining", "workers", "queued", "running"}  # counts
    assert str(server.proc.pid) not in answer.text


def test_any_host_on_a_tokenless_server_is_warned_of_at_start(tmp_path):
    root = make_world(tmp_path, attires=("studio",))
    with Server(root, "--workers", "1", "--allowed-host", "*") as srv:
        assert "warning: --allowed-host '*' on a server without a token" in srv.log_text()
    root2 = make_world(tmp_path / "guarded", attires=("studio",))
    with Server(root2, "--workers", "1", "--allowed-host", "*", env={"HOTPLATE_TOKEN": A}) as srv:
        assert "warning" not in srv.log_text()


def test_servers_sharing_a_signing_key_file_accept_each_others_urls(world, tmp_path, server):
    key = tmp_path / "signing.key"
    key.write_text("k" * 64 + "\n")
    common = (
        "--workers",
        "1",
        "--token-file",
        str(world / "tokens"),
        "--signing-key-file",
        str(key),
    )
    one = Server(world, *common, "--data", str(tmp_path / "one"))
    two = Server(world, *common, "--data", str(tmp_path / "two"))
    with one, two, one.client(headers=bearer(A)) as c, two.client() as anonymous:
        url = c.get("/v1/sign", params={"path": "/v1/renders"}).json()["url"]
        assert anonymous.get(url).status_code == 200  # signed by one, opened on two
        with server.client(headers=bearer(A)) as other:  # a server with its own random key
            elsewhere = other.get("/v1/sign", params={"path": "/v1/renders"}).json()["url"]
        assert_problem(anonymous.get(elsewhere), 403)
    key.write_text("short\n")
    short = Server(world, *common, "--data", str(tmp_path / "three"))
    with pytest.raises(AssertionError, match="holds 5 characters"):
        short.start()
    short.stop()


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

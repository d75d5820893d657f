"""The API fuzzed against a real `hotplate serve`: schemathesis generates requests from the
server's own OpenAPI schema, Hypothesis generates the render form's fields and files.
No input may get a 5xx, a traceback or a server path back, and the server stays up.

Bounded: HOTPLATE_FUZZ_EXAMPLES examples per operation (default 15, seconds in all);
raise it for a longer hunt (e.g. 500; bench/bench_fuzz.py runs it so). The session routes
are fuzzed against a live session too (it needs the webrtc extra in the server)."""

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testkit.serve_helpers import Server, make_world

pytestmark = pytest.mark.slow
TOKEN = "fuzz-token"
EXAMPLES = int(os.environ.get("HOTPLATE_FUZZ_EXAMPLES", "15"))
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("fuzz"), attires=("studio",))
    args = ("--workers", "1", "--max-upload-mb", "1", "--max-audio-seconds", "5")
    with Server(root, *args, env={"HOTPLATE_TOKEN": TOKEN}) as srv:
        yield srv


def check(server: Server, status: int, text: str, what: str) -> None:
    assert status < 500, f"{what} -> {status}: {text[:300]}"
    assert "Traceback" not in text, what
    assert str(server.root) not in text, f"{what} showed a server path: {text[:300]}"


def test_no_request_from_the_schema_gets_a_5xx(server):
    """Valid and invalid requests for every operation, generated from /openapi.json."""
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = sum(1 for _ in schema.get_all_operations())
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    seen = set()

    @settings(
        max_examples=EXAMPLES * operations,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(*(schema.as_strategy(mode) for mode in modes)))
    def call(case):
        response = case.call(headers=AUTH, timeout=60)
        seen.add(f"{case.method} {case.path}")
        check(server, response.status_code, response.text, f"{case.method} {case.formatted_path}")

    call()
    assert len(seen) >= operations // 2, seen  # the budget reached most operations


NAMES = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40),
    st.sampled_from(["astro", "studio", "default", "../astro", "..", ".", "", "a/b", "%2e%2e"]),
)


@settings(
    max_examples=EXAMPLES * 4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    persona=NAMES,
    attire=NAMES,
    motion=st.none() | NAMES,
    backend=st.none() | st.sampled_from(["warp", "musetalk"]) | NAMES,
    audio=st.binary(max_size=4096) | st.sampled_from([b"RIFF" + bytes(60), b"fLaC" + bytes(60)]),
    filename=NAMES,
    route=st.sampled_from(["/v1/renders", "/v1/lip-sync"]),
)
def test_no_render_form_gets_a_5xx(
    server, persona, attire, motion, backend, audio, filename, route
):
    data = {"persona": persona, "attire": attire}
    if motion is not None:
        data["motion"] = motion
    if backend is not None:
        data["backend"] = backend
    with server.client(headers=AUTH, timeout=60) as c:
        answer = c.post(route, data=data, files={"audio": (filename or "a", audio)})
    check(server, answer.status_code, answer.text, f"POST {route} {data!r}")
    if answer.status_code >= 400:
        assert answer.headers["content-type"].startswith("application/problem+json")


def test_no_request_to_a_live_session_gets_a_5xx(server):
    """The session routes from the schema, their session id a live session's (made again
    when a case ends it: a malformed offer does): every answer a 4xx or 2xx with a
    one-line problem, or, for POST /v1/sessions on a full server, 503 with Retry-After.
    Then a session made afresh still answers."""
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json").include(
        path_regex="^/v1/sessions"
    )
    operations = sum(1 for _ in schema.get_all_operations())
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    live: dict[str, str] = {}
    seen: set[str] = set()

    def session() -> str:
        with server.client(headers=AUTH, timeout=120) as c:
            if live and c.get(f"/v1/sessions/{live['id']}").status_code == 200:
                return live["id"]
            made = c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
            assert made.status_code == 201, made.text
            live["id"] = made.json()["id"]
            return live["id"]

    @settings(
        max_examples=EXAMPLES * operations,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(*(schema.as_strategy(mode) for mode in modes)), ours=st.booleans())
    def call(case, ours):
        if case.path_parameters and "session_id" in case.path_parameters and ours:
            case.path_parameters["session_id"] = session()
        response = case.call(headers=AUTH, timeout=60)
        seen.add(f"{case.method} {case.path}")
        what = f"{case.method} {case.formatted_path}"
        if response.status_code == 503 and case.path == "/v1/sessions":
            after = response.headers.get("retry-after") or [""]  # schemathesis: lists
            assert int(after[0] if isinstance(after, list) else after) > 0, what  # the cap
            return
        check(server, response.status_code, response.text, what)
        if response.status_code >= 400:
            assert "\n" not in response.json()["detail"], what

    try:
        call()
        assert len(seen) >= operations // 2, seen
        with server.client(headers=AUTH, timeout=120) as c:
            assert c.get(f"/v1/sessions/{session()}").status_code == 200
    finally:
        if live:
            with server.client(headers=AUTH, timeout=120) as c:
                c.delete(f"/v1/sessions/{live['id']}")


def test_the_server_survived_the_fuzz(server):
    assert server.proc.poll() is None
    with server.client() as c:
        assert c.get("/readyz").status_code == 200
    assert "Traceback" not in server.log_text()

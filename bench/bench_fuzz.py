"""A long fuzz of a conversation session's inputs. Run: python bench/bench_fuzz.py

On a real `hotplate serve` (one worker, a hot 8-frame avatar, the webrtc extra):
1. the speech socket: `--cases` seeded hostile clients (testkit/speech_fuzz.py: deep
   nesting, huge strings, wrong types, binary where text is expected, text that is not
   UTF-8, wrong sample rates, zero-length messages, fragments) against one live session;
   each must end in a close frame whose code is one of speech.CLOSE_CODES with a one-line
   reason. Figures: the cases, their rate, and how many ended otherwise (must be 0);
2. the HTTP session routes: schemathesis from the server's schema, as
   tests/hotplate/test_serve_fuzz.py runs it, `--examples` examples per operation, the
   session id a live session's half the time. Figures: the requests and their seconds.
Then the server must still be up, its log free of tracebacks, and a new session must
answer. The CI tier runs a short fuzz of both in the tests (under 30 s); this is the hunt.
Any failure exits non-zero with the case and the seed that reproduce it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

from harness import Bench, run_bench

from hotplate.serve.speech import CLOSE_CODES
from testkit.serve_helpers import Server, make_world, precompiled
from testkit.speech_fuzz import describe, hostile, run_case

ASTRO = {"persona": "astro", "attire": "studio"}
ENV = {"HOTPLATE_SESSION_OFFER_TIMEOUT": "3600"}  # the session lives without a peer


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cases", type=int, default=3000, help="hostile speech-socket clients")
    ap.add_argument("--examples", type=int, default=200, help="schemathesis examples per route")
    ap.add_argument("--seed", type=int, default=None, help="the socket fuzz's seed")


def socket_fuzz(bench: Bench, srv: Server, seed: int) -> None:
    import httpx

    rng = random.Random(seed)
    seen: dict[int, int] = {}

    async def run() -> float:
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
            made = await c.post("/v1/sessions", json=ASTRO)
            if made.status_code != 201:
                raise SystemExit(f"bench_fuzz: no session: {made.text[:200]}")
            s = made.json()
            url = srv.url.replace("http", "ws", 1) + s["speech"]
            began = time.perf_counter()
            for number in range(bench.args.cases):
                case = hostile(rng)
                code, reason = await run_case(url, case)
                if code not in CLOSE_CODES or not reason or "\n" in reason:
                    raise SystemExit(
                        f"bench_fuzz: case {number} (--seed {seed}) ended {code} {reason!r}: "
                        f"{describe(case)}"
                    )
                seen[code] = seen.get(code, 0) + 1
                if code == 1008 and ("ahead" in reason or "refused" in reason):
                    await c.post(s["interrupt"])  # the pace or the worker's queue: empty it
            took = time.perf_counter() - began
            if (await c.get(f"/v1/sessions/{s['id']}")).status_code != 200:
                raise SystemExit(
                    f"bench_fuzz: the session did not outlive the fuzz (--seed {seed})"
                )
            await c.delete(f"/v1/sessions/{s['id']}")
            return took

    took = asyncio.run(run())
    inputs = {"seed": seed, "close_codes": {str(k): v for k, v in sorted(seen.items())}}
    bench.figure("speech socket: hostile clients", bench.args.cases, "cases", inputs=inputs)
    bench.figure("speech socket: hostile clients per second", bench.args.cases / took, "1/s")
    bench.figure("speech socket: undocumented ends", 0, "cases", better="lower")


def http_fuzz(bench: Bench, srv: Server) -> None:
    """schemathesis over the session routes, their id a live session's half the time
    (made again when a case ends it); every answer under 500 but a full server's 503
    with Retry-After to POST /v1/sessions, one line, no traceback, no server path."""
    import httpx
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    schema = schemathesis.openapi.from_url(srv.url + "/openapi.json").include(
        path_regex="^/v1/sessions"
    )
    operations = sum(1 for _ in schema.get_all_operations())
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    live: dict[str, str] = {}
    calls = [0]

    def session() -> str:
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            if live and c.get(f"/v1/sessions/{live['id']}").status_code == 200:
                return live["id"]
            made = c.post("/v1/sessions", json=ASTRO)
            if made.status_code != 201:
                raise SystemExit(f"bench_fuzz: no session: {made.text[:200]}")
            live["id"] = made.json()["id"]
            return live["id"]

    @settings(
        max_examples=bench.args.examples * operations,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(*(schema.as_strategy(mode) for mode in modes)), ours=st.booleans())
    def call(case, ours) -> None:
        if case.path_parameters and "session_id" in case.path_parameters and ours:
            case.path_parameters["session_id"] = session()
        answer = case.call(timeout=60)
        calls[0] += 1
        what = f"{case.method} {case.formatted_path} -> {answer.status_code}"
        if answer.status_code == 503 and case.path == "/v1/sessions":
            return  # the session cap (--max-sessions): Retry-After is the tests' check
        text = answer.text
        if answer.status_code >= 500 or "Traceback" in text or str(srv.root) in text:
            raise AssertionError(f"{what}: {text[:300]}")

    began = time.perf_counter()
    try:
        call()
    except AssertionError as exc:
        raise SystemExit(f"bench_fuzz: the session routes: {str(exc).splitlines()[0]}") from None
    finally:
        if live:
            with httpx.Client(base_url=srv.url, timeout=120) as c:
                c.delete(f"/v1/sessions/{live['id']}")
    took = time.perf_counter() - began
    inputs = {"examples_per_operation": bench.args.examples, "operations": operations}
    bench.figure("session routes: schemathesis requests", calls[0], "requests", inputs=inputs)
    bench.figure("session routes: schemathesis seconds", took, "s", better="lower")


def main(bench: Bench) -> None:
    from pipeline.nets.backends import ExtraMissingError, require_extra

    try:
        require_extra("webrtc", "a conversation session")
    except ExtraMissingError as exc:
        bench.missing(str(exc))
    seed = bench.args.seed if bench.args.seed is not None else random.randrange(1 << 32)
    print(f"socket fuzz seed {seed}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp:
        root = make_world(Path(tmp))
        with Server(root, "--workers", "1", env=ENV) as srv:
            precompiled(srv)
            socket_fuzz(bench, srv, seed)
            http_fuzz(bench, srv)
            if srv.proc.poll() is not None or "Traceback" in srv.log_text(tail=None):
                raise SystemExit(f"bench_fuzz: the server failed (--seed {seed}): see its log")
            with srv.client() as c:
                if c.get("/readyz").status_code != 200:
                    raise SystemExit("bench_fuzz: the server is not ready after the fuzz")


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"cases": 60, "examples": 3})

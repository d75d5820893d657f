"""Eight concurrent one-shot requests for one cold attire: eight valid MP4s, and the
avatar precompiled exactly once (the store's misses counter), with several workers."""

import threading

import pytest

from testkit.serve_helpers import (
    Server,
    make_world,
    mp4_facts,
    post_render,
    speech,
    store_counters,
)

pytestmark = pytest.mark.slow
N = 8


def test_eight_concurrent_requests_for_one_cold_attire_make_one_precompile(tmp_path):
    root = make_world(tmp_path)
    wav = speech(root / "two.wav", 2.0)
    with Server(root, "--workers", "3", "--queue-size", str(N)) as srv:
        before = store_counters(root / "cache").get("misses", 0)
        answers: list = [None] * N
        start = threading.Barrier(N)

        def one(i: int) -> None:
            with srv.client() as c:
                start.wait()
                answers[i] = post_render(c, "/v1/lip-sync", wav)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(N)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        assert all(a is not None and a.status_code == 200 for a in answers), [
            a and a.text[:200] for a in answers
        ]
        for i, answer in enumerate(answers):
            facts = mp4_facts(answer.content, tmp_path / f"{i}.mp4")
            assert facts["video"] == "h264" and abs(facts["seconds"] - 2.0) <= 0.05
        # one precompile of the two records a render reads: the avatar and its loop's bank
        # record (every loop gets one, empty for a quiet loop), each missed once
        assert store_counters(root / "cache")["misses"] - before == 2

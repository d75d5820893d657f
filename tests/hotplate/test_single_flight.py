"""Single flight through the real CLI: concurrent cold renders of one attire make one
precompile; a holder killed with -9 releases at once; a wait has a limit."""

from __future__ import annotations

import signal

import av
import pytest

from cachestore.store import forget_store, open_store
from tests.hotplate.many_processes import (
    as_json,
    hotplate,
    make_world,
    read_line,
    render_args,
    spawn,
    start_holder,
)


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def frames_in(path) -> int:
    with av.open(str(path)) as c:
        return sum(1 for _ in c.decode(video=0))


@pytest.mark.parametrize("n", [2, 8])
def test_concurrent_cold_renders_make_exactly_one_precompile(world, n):
    outs = [world / f"out{i}.mp4" for i in range(n)]
    procs = [spawn(world, *render_args(world, out)) for out in outs]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    assert all(frames_in(out) > 0 for out in outs)

    counters = as_json(hotplate(world, "status", "--json"))["counters"]
    (source,) = as_json(hotplate(world, "ls", "--json"))["sources"]
    assert source["state"] == "hot"
    # one precompile makes the two records a render reads: the avatar and its loop's mouth
    # bank record (every loop gets one, empty for a quiet loop), each missed and built once
    assert counters["misses"] == 2, counters
    # the avatar's bytes and the bank's own stage (it shares the avatar's first stages),
    # each written once
    try:
        bank_bytes = open_store(world / "cache", readonly=True).avatar_bytes(source["bank"]["key"])
    finally:
        forget_store(world / "cache")
    assert counters["bytes_written"] == source["bytes"] + bank_bytes, (counters, bank_bytes)


def test_a_waiter_names_the_holder_and_builds_once_the_holder_is_killed(world):
    holder = start_holder(world)
    waiter = spawn(world, "precompile", str(world / "personas" / "astro" / "studio.mp4"))
    try:
        line = read_line(waiter.stderr, 300)
        assert f"waiting for pid {holder.pid} (" in line and "since" in line, line
        holder.send_signal(signal.SIGKILL)  # mid-precompile: the kernel drops its lock
        holder.wait(timeout=60)
        out, err = waiter.communicate(timeout=300)
    finally:
        holder.kill()
        waiter.kill()
    assert waiter.returncode == 0, err
    assert "now hot" in out
    resolved = as_json(
        hotplate(world, "resolve", "--persona", "astro", "--attire", "studio", "--json")
    )
    assert resolved["state"] == "hot"
    assert as_json(hotplate(world, "verify", "--json"))["problems"] == []


@pytest.mark.parametrize("given", ["flag", "env"])
def test_a_wait_past_its_limit_is_one_clear_line(world, given):
    holder = start_holder(world)
    limit = ["--flight-wait", "1"] if given == "flag" else []
    try:
        result = hotplate(
            world,
            *limit,
            "precompile",
            str(world / "personas" / "astro" / "studio.mp4"),
            env={} if limit else {"HOTPLATE_FLIGHT_WAIT": "1"},
        )
    finally:
        holder.kill()
        holder.wait(timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [x for x in result.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert f"pid {holder.pid}" in errors[0] and "flight_wait" in errors[0]
    assert errors[0] == result.stderr.strip().splitlines()[-1]

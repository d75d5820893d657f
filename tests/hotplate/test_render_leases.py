"""A render that gc runs beside: `gc --max-size 1`, again and again in other processes,
while a long render reads its avatar frame by frame. The render's lease keeps the
avatar; once the render is done the next gc evicts it."""

from __future__ import annotations

import re
import time

import av

from tests.hotplate.many_processes import as_json, hotplate, make_world, render_args, spawn

SECONDS = 10.0  # 250 frames at the loop's 25 fps: many gc runs while they render


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def test_gc_in_a_loop_never_breaks_a_long_render(tmp_path):
    world = make_world(tmp_path, n_frames=6, seconds=SECONDS)
    made = hotplate(world, "precompile", str(world / "personas" / "astro" / "studio.mp4"))
    assert made.returncode == 0, made.stderr
    out = world / "long.mp4"

    render = spawn(world, *render_args(world, out))
    leases = world / "cache" / "leases"
    try:
        wait_for(
            lambda: any(leases.glob("*.lease")) or render.poll() is not None,
            300,
            "the render's lease",
        )
        gc_runs = []
        while render.poll() is None:
            gc_runs.append(hotplate(world, "gc", "--max-size", "1"))
        stdout, stderr = render.communicate(timeout=300)
    finally:
        render.kill()
    assert render.returncode == 0, stderr
    assert all(r.returncode == 0 for r in gc_runs), gc_runs[0].stderr
    assert len(gc_runs) >= 2, "the render ended before gc could run twice beside it"

    frames = int(re.search(r"(\d+) frames at", stdout).group(1))
    assert frames == round(SECONDS * 25)
    with av.open(str(out)) as c:
        assert sum(1 for _ in c.decode(video=0)) == frames

    # the lease went with the render: now gc evicts the avatar it was keeping
    assert hotplate(world, "gc", "--max-size", "1").returncode == 0
    resolved = as_json(
        hotplate(world, "resolve", "--persona", "astro", "--attire", "studio", "--json")
    )
    assert resolved["state"] == "cold"

"""What do a render lease and the single-flight lock cost a hot render?
Run: python bench/bench_leases.py

Prints, measured side by side in one run (nothing is asserted):

a) a lease taken and released (`cachestore.leases.Lease`: create, flock, write, rename,
   pass gc's barrier; then unlink and close), median of 500, next to the hit check a hot
   render makes anyway (`Store.get_avatar`), as the baseline.
b) the single-flight lock taken and released uncontended (`cachestore.flight`), median
   of 500. A hot render never takes it (the hit check comes first); a JIT render takes it
   once, so it is shown for completeness.
c) the sum of a) and b) as a share of a 4 s render and of a real hot `lip_sync` of 4 s of
   speech on a 540x960 loop (warp renderer, one run, after one warm-up run).
   Goal: under 5 ms, or under 2% of a 4 s render.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cachestore.flight import single_flight  # noqa: E402
from cachestore.leases import Lease  # noqa: E402
from cachestore.store import open_store  # noqa: E402

RUNS = 500
RENDER_SECONDS = 4.0


def median_ms(fn: Callable[[], object], runs: int = RUNS) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def hot_render_seconds(root: Path) -> tuple[float, str]:
    from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
    from pipeline.lip_sync import LipSyncRequest, lip_sync
    from pipeline.precompile.recipe import Recipe

    (root / "personas" / "astro").mkdir(parents=True)
    write_loop_video(root / "personas" / "astro" / "studio.mp4", n_frames=6, size=(540, 960))
    write_wav(root / "speech.wav", make_speech_audio(RENDER_SECONDS), 16000)
    store = open_store(root / "cache")
    request = LipSyncRequest("astro", "studio", root / "speech.wav", root / "out.mp4")
    outcome = lip_sync(store, root / "personas", Recipe(), request)  # JIT, then warm
    start = time.perf_counter()
    outcome = lip_sync(store, root / "personas", Recipe(), request)
    assert not outcome.jit
    return time.perf_counter() - start, outcome.avatar


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        render_s, avatar = hot_render_seconds(root)
        store = open_store(root / "cache")
        hit_ms = median_ms(lambda: store.get_avatar(avatar))
        lease_ms = median_ms(lambda: Lease(store.path, [avatar]).release())

        def flight() -> None:
            with single_flight(store.path, avatar):
                pass

        flight_ms = median_ms(flight)
    both = lease_ms + flight_ms
    print(f"a) lease take+release  {lease_ms:.3f} ms   (hit check, the baseline: {hit_ms:.3f} ms)")
    print(f"b) single-flight lock  {flight_ms:.3f} ms   (uncontended; a hot render skips it)")
    print(
        f"c) both: {both:.3f} ms = {both / (RENDER_SECONDS * 1000):.4%} of a 4 s render; "
        f"a hot lip_sync of {RENDER_SECONDS:.0f} s of speech took {render_s:.2f} s "
        f"({both / (render_s * 1000):.4%}). Goal: < 5 ms or < 2%."
    )


if __name__ == "__main__":
    main()

"""What does the blob tier buy, and what does it cost? Run: python bench/bench_remote.py

Side by side in one run, on this machine, against a real nginx on loopback (Debian's
nginx-light with `dav_methods PUT`, as the tests start it); nothing is asserted:

a) baseline: JIT precompile of a 150-frame 1080x1920 loop into a fresh store (what a
   node without the tier pays on its first render of that avatar);
b) push of that avatar to nginx (what the building node pays afterwards, in the
   background after a JIT build);
c) pull of the same avatar into another fresh store, through the precompile miss hook
   (`precompile()` with the tier attached: source hash, lock, manifest, verified blobs,
   manifests), and through `pull_avatar` alone; printed as a) / c);
d) a hot render (1 s of speech, warp) with the tier attached against one without (best
   of 6 each, alternating which goes first): the
   tier is never asked on a hit, so the two should be equal; the requests nginx logged
   during the hot renders are counted (0 expected);
e) with --ray: the fleet precompile (`hotplate sync --ray`) of N small loops over a
   two-node local Ray cluster against `hotplate sync` in one process; on 2 cores no
   speed-up is expected; the per-task overhead is the difference divided by N.

Options: --frames N --size WxH for a quick run (e.g. --frames 30 --size 540x960).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cachestore.remote.pull import pull_avatar  # noqa: E402
from cachestore.remote.push import push_avatar  # noqa: E402
from cachestore.remote.tier import _ATTACHED, ATTACHED_ENV, ENV, attach, open_remote  # noqa: E402
from cachestore.store import forget_store, open_store  # noqa: E402
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav  # noqa: E402
from pipeline.precompile.recipe import Recipe  # noqa: E402
from pipeline.precompile.run import precompile  # noqa: E402
from tests.cachestore.nginx import Nginx  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def hot_render(store, world: Path, out: Path) -> float:
    from pipeline.render.job import LipSyncRequest, lip_sync

    request = LipSyncRequest(
        persona="astro", attire="studio", audio=world / "speech.wav", output=out, no_jit=True
    )
    seconds, outcome = timed(lambda: lip_sync(store, world / "personas", Recipe(), request))
    assert not outcome.jit
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=150)
    parser.add_argument("--size", default="1080x1920", help="WxH of the loop")
    parser.add_argument("--ray", action="store_true", help="also e): sync --ray vs sync")
    parser.add_argument("--loops", type=int, default=4, help="loops for e)")
    args = parser.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        world = Path(tmp)
        (world / "personas" / "astro").mkdir(parents=True)
        source = write_loop_video(
            world / "personas" / "astro" / "studio.mp4", n_frames=args.frames, size=(w, h)
        )
        write_wav(world / "speech.wav", make_speech_audio(1.0), 16000)
        nginx = Nginx(world / "nginx").start()
        try:
            run(world, source, nginx, args)
        finally:
            nginx.stop()


def run(world: Path, source: Path, nginx: Nginx, args) -> None:
    recipe = Recipe()
    print(f"loop: {args.frames} frames {args.size}, tier {nginx.url} (nginx on loopback)")
    # a) baseline: JIT precompile, no tier
    built = open_store(world / "built")
    jit, report = timed(lambda: precompile(source, recipe, built))
    nbytes = sum(s.nbytes for s in report.stages)
    print(f"a) JIT precompile (baseline)     {jit:8.2f} s   ({nbytes / 1e6:.0f} MB stored)")
    # b) push
    tier = open_remote(nginx.url)
    push_s, pushed = timed(lambda: push_avatar(built, tier, report.avatar))
    print(f"b) push to nginx                 {push_s:8.2f} s   ({pushed.sent} blobs)")
    # c) pull through the miss hook, and pull_avatar alone
    attach(world / "hook", nginx.url)
    hook = open_store(world / "hook")
    lines: list[str] = []
    hook_s, hooked = timed(lambda: precompile(source, recipe, hook, on_wait=lines.append))
    assert hooked.pulled is not None, lines
    bare = open_store(world / "bare")
    bare_s, _ = timed(lambda: pull_avatar(bare, tier, report.avatar))
    print(f"c) pull via the precompile miss  {hook_s:8.2f} s   JIT/pull = {jit / hook_s:.1f}x")
    print(f"   pull_avatar alone             {bare_s:8.2f} s   JIT/pull = {jit / bare_s:.1f}x")
    # d) hot render with and without the tier (best of 3 each, interleaved)
    log = nginx.root / "access.log"
    before = len(log.read_text().splitlines())
    with_tier, without = [], []

    def tier_on(on: bool) -> None:
        if on:
            attach(world / "hook", nginx.url)
        else:
            _ATTACHED.pop(str((world / "hook").resolve()), None)
            os.environ.pop(ATTACHED_ENV, None)  # attach() exported it for child processes

    for i in range(6):  # alternating which goes first, so neither side gets the warm-up
        for on in (True, False) if i % 2 == 0 else (False, True):
            tier_on(on)
            (with_tier if on else without).append(hot_render(hook, world, world / f"r{i}{on}.mp4"))
    asked = len(log.read_text().splitlines()) - before
    print(
        f"d) hot render, tier attached     {min(with_tier):8.2f} s   vs no tier "
        f"{min(without):.2f} s (ratio {min(with_tier) / min(without):.2f}); "
        f"requests to nginx during hot renders: {asked}"
    )
    for path in ("built", "hook", "bare"):
        forget_store(world / path)
    if args.ray:
        fleet(world, nginx, args)


def fleet(world: Path, nginx: Nginx, args) -> None:
    """e) sync --ray over a two-node local cluster against sync in one process."""
    import subprocess

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # and no usage report sent anywhere
    from ray.cluster_utils import Cluster

    from hotplate.demo_data import write_loop_video as loop

    root = world / "fleet"
    for i in range(args.loops):
        (root / "personas" / f"p{i}").mkdir(parents=True)
        loop(root / "personas" / f"p{i}" / "studio.mp4", n_frames=8, size=(540, 960), seed=i)
    base = [sys.executable, "-m", "hotplate.cli", "--personas", str(root / "personas")]
    env = {**os.environ, ENV: nginx.url}
    one_s, one = timed(
        lambda: subprocess.run(
            [*base, "--cache", str(root / "one"), "sync"], capture_output=True, text=True
        )
    )
    assert one.returncode == 0, one.stderr
    start_s, cluster = timed(lambda: two_nodes(Cluster, root))
    try:
        ray_s, ray = timed(
            lambda: subprocess.run(
                [*base, "--cache", str(root / "unused"), "sync", "--ray", cluster.address],
                capture_output=True,
                text=True,
                env=env,
            )
        )
        assert ray.returncode == 0, ray.stderr
        again_s, _ = timed(
            lambda: subprocess.run(
                [*base, "--cache", str(root / "unused"), "sync", "--ray", cluster.address],
                capture_output=True,
                text=True,
                env=env,
            )
        )
    finally:
        cluster.shutdown()
    print(f"e) sync, one process (baseline)  {one_s:8.2f} s   {args.loops} loops, 8 frames 540x960")
    print(
        f"   sync --ray, 2 local nodes     {ray_s:8.2f} s   ratio {ray_s / one_s:.2f} "
        f"(cluster start {start_s:.1f} s not included); overhead per task "
        f"{(ray_s - one_s) / args.loops:+.2f} s"
    )
    print(
        f"   sync --ray again, all hot     {again_s:8.2f} s   {again_s / args.loops:.2f} s a task "
        f"(driver start, hash, hit check)"
    )


def two_nodes(Cluster, root: Path):
    """Two Ray nodes on this machine, one CPU each, each with its own store."""
    nodes = []
    for i in (1, 2):
        env = {"HOTPLATE_NODE_CACHE": str(root / f"node{i}"), "OMP_NUM_THREADS": "1"}
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
        nodes.append({"num_cpus": 1, "env_vars": env, "include_dashboard": False})
    cluster = Cluster(initialize_head=True, head_node_args=nodes[0])
    del nodes[1]["include_dashboard"]
    cluster.add_node(**nodes[1])
    return cluster


if __name__ == "__main__":
    main()

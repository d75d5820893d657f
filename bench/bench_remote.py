"""What does the blob tier buy, and what does it cost? Run: python bench/bench_remote.py

Side by side in one run, on this machine, against a real nginx on loopback (Debian's
nginx-light with `dav_methods PUT`, started by testkit/nginx.py);
nothing is asserted about speed:

a) baseline: JIT precompile of a 150-frame 1080x1920 loop into a fresh store (what a
   node without the tier pays on its first render of that avatar);
b) push of that avatar to nginx (what the building node pays afterwards, in the
   background after a JIT build);
c) pull of the same avatar into another fresh store, through the precompile miss hook
   (`precompile()` with the tier attached: source hash, lock, manifest, verified blobs,
   manifests), and through `pull_avatar` alone; printed as a) / c);
d) a hot render (1 s of speech, warp) from the store the tier is attached to against the
   same render from the store c) filled with pull_avatar, which has no tier (best of
   `--renders` each, alternating which goes first): the tier is never asked on a hit, so
   the two should be equal; a request nginx logged during the hot renders fails the run;
e) unless --no-ray: the fleet precompile (`hotplate sync --ray`) of `--loops` small loops
   over a two-node local Ray cluster against `hotplate sync` in one process; on 2 cores
   no speed-up is expected; the per-task overhead is the difference divided by the loops.

Options: --frames N --size WxH for the loop of a) to d).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from harness import Bench, run_bench, timed

from cachestore.remote.pull import pull_avatar
from cachestore.remote.push import push_avatar
from cachestore.remote.tier import ENV, attach, open_remote
from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline.catalog import plan_for
from pipeline.lip_sync import LipSyncRequest, lip_sync
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit.nginx import Nginx


def hot_render(store, world: Path, out: Path) -> float:
    request = LipSyncRequest(
        persona="astro", attire="studio", audio=world / "speech.wav", output=out, no_jit=True
    )
    seconds, outcome = timed(lambda: lip_sync(store, world / "personas", Recipe(), request))
    if outcome.jit:
        raise SystemExit(f"the render from {store.path} was not hot")
    return seconds


def add_arguments(ap) -> None:
    ap.add_argument("--frames", type=int, default=150)
    ap.add_argument("--size", default="1080x1920", help="WxH of the loop")
    ap.add_argument("--renders", type=int, default=6, help="hot renders a side in d)")
    ap.add_argument("--no-ray", action="store_true", help="leave out e): sync --ray vs sync")
    ap.add_argument("--loops", type=int, default=4, help="loops for e)")


def main(bench: Bench) -> None:
    args = bench.args
    if not (shutil.which("nginx") or os.access("/usr/sbin/nginx", os.X_OK)):
        bench.missing(
            "nginx is not installed (apt-get install nginx; `just setup` does it as root)"
        )
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
            run(bench, world, source, nginx)
        finally:
            nginx.stop()


def run(bench: Bench, world: Path, source: Path, nginx: Nginx) -> None:
    args = bench.args
    recipe = Recipe()
    print(f"loop: {args.frames} frames {args.size}, tier {nginx.url} (nginx on loopback)")
    # a) baseline: JIT precompile, no tier
    built = open_store(world / "built")
    jit, report = timed(lambda: precompile(source, recipe, built))
    nbytes = sum(s.nbytes for s in report.stages)
    inputs = {"loop_frames": args.frames, "resolution": args.size, "recipe": "default"}
    inputs["avatar_mb"] = round(nbytes / 1e6)
    # b) push
    tier = open_remote(nginx.url)
    push_s, pushed = timed(lambda: push_avatar(built, tier, report.avatar))
    # c) pull through the miss hook, and pull_avatar alone
    attach(world / "hook", nginx.url)
    hook = open_store(world / "hook")
    lines: list[str] = []
    hook_s, hooked = timed(lambda: precompile(source, recipe, hook, on_wait=lines.append))
    if hooked.pulled is None:
        raise SystemExit(f"the precompile miss built instead of pulling: {lines}")
    bare = open_store(world / "bare")
    planned = plan_for(bare, source, recipe)  # a pull takes the stage keys of its own plan
    bare_s, pulled = timed(lambda: pull_avatar(bare, tier, planned.avatar, planned.stages))
    if pulled is None:
        raise SystemExit(f"pull_avatar found no avatar {planned.avatar} on the tier")
    jit_base = "JIT precompile of the same loop, no tier, same run"
    bench.figure(
        "pull of an avatar through the precompile miss (nginx on loopback)",
        hook_s,
        "s",
        baseline=jit_base,
        baseline_value=jit,
        better="lower",
        inputs=inputs,
        note="goal: pull >= 10x faster",
    )
    bench.figure(
        "pull_avatar alone",
        bare_s,
        "s",
        baseline=jit_base,
        baseline_value=jit,
        better="lower",
        inputs=inputs,
    )
    bench.figure(
        "push of the built avatar to nginx",
        push_s,
        "s",
        baseline=jit_base,
        baseline_value=jit,
        better="lower",
        inputs=inputs,
        note=f"{pushed.sent} blobs",
    )
    # d) hot render with the tier attached (hook) and without (bare: never attached)
    log = nginx.root / "access.log"
    before = len(log.read_text().splitlines())
    with_tier, without = [], []
    for i in range(args.renders):  # alternating which goes first: neither gets the warm-up
        for on in (True, False) if i % 2 == 0 else (False, True):
            store = hook if on else bare
            (with_tier if on else without).append(hot_render(store, world, world / f"r{i}{on}.mp4"))
    asked = len(log.read_text().splitlines()) - before
    if asked:
        raise SystemExit(f"hot renders asked the tier {asked} times; a hit must never ask it")
    bench.figure(
        "hot render with the tier attached",
        min(with_tier),
        "s",
        baseline="the same render from a store with no tier",
        baseline_value=min(without),
        better="lower",
        inputs={**inputs, "audio_seconds": 1.0, "renderer": "warp"},
        note=f"best of {args.renders}; 0 requests reached nginx",
    )
    for path in ("built", "hook", "bare"):
        forget_store(world / path)
    if not args.no_ray:
        fleet(bench, world, nginx)


def fleet(bench: Bench, world: Path, nginx: Nginx) -> None:
    """e) sync --ray over a two-node local cluster against sync in one process."""
    import subprocess

    args = bench.args
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # and no usage report sent anywhere
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        bench.missing("ray is not installed: pip install -e '.[ray]' (or --no-ray)")

    from hotplate.demo_data import write_loop_video as loop

    root = world / "fleet"
    for i in range(args.loops):
        (root / "personas" / f"p{i}").mkdir(parents=True)
        loop(root / "personas" / f"p{i}" / "studio.mp4", n_frames=8, size=(540, 960), seed=i)
    env = {**os.environ, ENV: nginx.url}
    one_s, one = timed(
        lambda: subprocess.run(
            invocation(root / "personas", root / "one", "sync"), capture_output=True, text=True
        )
    )
    if one.returncode:
        raise SystemExit(f"hotplate sync failed: {one.stderr.strip()}")
    start_s, cluster = timed(lambda: two_nodes(Cluster, root))
    try:
        ray_s, ray = timed(
            lambda: subprocess.run(
                invocation(root / "personas", root / "unused", "sync", "--ray", cluster.address),
                capture_output=True,
                text=True,
                env=env,
            )
        )
        if ray.returncode:
            raise SystemExit(f"hotplate sync --ray failed: {ray.stderr.strip()}")
        again_s, again = timed(
            lambda: subprocess.run(
                invocation(root / "personas", root / "unused", "sync", "--ray", cluster.address),
                capture_output=True,
                text=True,
                env=env,
            )
        )
        if again.returncode:
            raise SystemExit(f"hotplate sync --ray (all hot) failed: {again.stderr.strip()}")
    finally:
        cluster.shutdown()
    inputs = {"loops": args.loops, "loop_frames": 8, "resolution": "540x960", "nodes": 2}
    bench.figure(
        "`hotplate sync --ray`, two local Ray nodes (1 CPU each)",
        ray_s,
        "s",
        baseline="`hotplate sync` in one process",
        baseline_value=one_s,
        better="lower",
        inputs=inputs,
        note=f"{(ray_s - one_s) / args.loops:+.2f} s a task; cluster start {start_s:.1f} s "
        f"not counted; no speed-up expected on 2 cores",
    )
    bench.figure(
        "`hotplate sync --ray` again, all hot",
        again_s,
        "s",
        baseline="`hotplate sync` in one process, cold",
        baseline_value=one_s,
        better="lower",
        inputs=inputs,
        note=f"{again_s / args.loops:.2f} s a task (driver start, hash, hit check)",
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
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={"frames": 4, "size": "540x960", "renders": 1, "loops": 2},
    )

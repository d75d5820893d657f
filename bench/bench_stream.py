"""Streaming: time to the first fragment, live latency, and a hot 1080x1920 warp render's
speed streamed and whole-file, against today's renderer on the same loop in the same run.

    .venv/bin/python bench/bench_stream.py [--seconds 20] [--frames 250] [--live-seconds 10]
        [--baseline-ref 3d0c64b] [--skip-http]

Setup: a generated 1080x1920 loop of `--frames` frames is precompiled into a real store.
Then, each on that loop and the same `--seconds` of generated speech:

- baseline: `render_video` as it was at `--baseline-ref` (the renderer before the
  streaming work: `git archive` of that commit, run in a subprocess), on that tree's own
  precompile of the same loop in a store of its own (not timed): a store today's code
  built holds frames in a format the old renderer cannot read;
- whole file: today's `render_video` (MP4, superfast);
- streamed in process: `render_video` with a fragment sink (fMP4, superfast +
  zerolatency): frames/s and the time from the call to the first fragment;
- over loopback HTTP: `hotplate serve` on 127.0.0.1, POST /v1/lip-sync/stream, time from
  the request to the first moof received, and the whole response;
- live: WS /v1/live fed `--live-seconds` of speech paced at real time; from the first
  PCM chunk sent to the first fragment received, and from the end message to the last;
- per frame: decode, mouth and blend (`WarpRenderer.render`), encode (I420 + x264), each
  alone, CPU ms, against one frame's budget at 25 fps;
- quality: PSNR of the streamed frames against the baseline's, outside the mouth region
  (the blend square), min and mean over frames.

The machine may be shared: wall-clock figures move with its load, CPU ms per frame less
so; the harness records the load average. The baseline needs `--baseline-ref` in this
clone's history (a shallow clone lacks it: the bench then stops, naming the fetch).
Figures only, no asserts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np
from harness import ROOT, Bench, cpu_seconds, psnr, run_bench

from cachestore.store import open_store
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
from pipeline.catalog import plan_for
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile

BASELINE_REF = "3d0c64b"  # main before issue 18 (streaming, the faster hot path)

# The baseline's own precompile (its store, its decode format and landmarks) and render:
# a store that today's code built holds frames in a format the old renderer cannot read.
BASELINE = r"""
import json, resource, sys, time
from pathlib import Path
import numpy as np
from cachestore.store import open_store
from pipeline.hot import load_assets
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.render.video import render_video
store = open_store(Path(sys.argv[1]))
assets = load_assets(store, precompile(Path(sys.argv[2]), Recipe(), store).avatar)
np.save(sys.argv[5], np.asarray(assets.mask_boxes))  # where the old mouth was drawn
r0 = resource.getrusage(resource.RUSAGE_SELF)
rep = render_video(assets, sys.argv[3], sys.argv[4])
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print(json.dumps({"frames": rep.frames, "wall": rep.wall_seconds, "cpu": cpu,
                  "first": rep.first_frame_seconds}))
"""


def line(label: str, frames: int, wall: float, cpu: float, extra: str = "") -> None:
    print(
        f"  {label:28s} {frames / wall:6.1f} fps  {frames / 25 / wall:5.2f}x real time  "
        f"CPU {cpu / frames * 1000:5.1f} ms/frame  wall {wall:5.1f} s{extra}"
    )


def baseline(
    bench: Bench, ref: str, tmp: Path, cache: Path, video: Path, wav: Path, out: Path
) -> dict:
    """Today's renderer: the tree at `ref`, in its own process, on the same loop, which it
    precompiles into a store of its own first (not timed). Its mask boxes are saved
    beside `out` (.npy) for the PSNR outside both sides' mouths."""
    tree = tmp / f"baseline-{ref}"
    known = subprocess.run(
        ["git", "-C", str(ROOT), "cat-file", "-e", f"{ref}^{{commit}}"], capture_output=True
    )
    if known.returncode:
        bench.missing(
            f"the baseline renderer at {ref} is not in this clone's history "
            f"(git fetch --unshallow, or --baseline-ref REF)"
        )
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "cachestore", "pipeline"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(tree, filter="data")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run(
        [sys.executable, "-c", BASELINE, str(cache), str(video), str(wav), str(out)]
        + [str(out.with_suffix(".npy"))],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


def breakdown(assets, n: int = 50) -> dict:
    """CPU ms per frame of each stage alone, on `n` frames."""
    import cv2

    from pipeline.render.encode import Mp4Writer
    from pipeline.render.fmp4 import FragmentWriter
    from pipeline.render.renderers.warp import WarpRenderer
    from pipeline.render.schedule import schedule

    idxs = schedule(n, assets.n_frames).tolist()
    out = {}
    t = time.thread_time()
    frames = [assets.load_frame(i) for i in idxs]
    out["decode (JPEG, whole frame)"] = (time.thread_time() - t) / n
    r = WarpRenderer(silence=None)  # the mouth moves on every frame
    audio = make_speech_audio(n / 25, sr=48000)
    r.prepare(assets, audio, 48000, n, 25.0)
    for k, i in enumerate(idxs):  # plans are made once per stored frame, not per output frame
        r.render(k, i, frames[k])
    t = time.thread_time()
    blended = [f.copy() for f in frames]
    out["copy of a whole frame, fresh memory"] = (time.thread_time() - t) / n
    t = time.thread_time()
    for k, i in enumerate(idxs):
        r.render(k, i, blended[k], inplace=True)
    out["mouth and blend (WarpRenderer.render, in place)"] = (time.thread_time() - t) / n
    t = time.thread_time()
    for f in blended:
        cv2.cvtColor(f, cv2.COLOR_RGB2YUV_I420)
    out["RGB -> I420"] = (time.thread_time() - t) / n
    # x264 runs on its own threads: measure the process's CPU time
    with tempfile.TemporaryDirectory() as tmp:
        t = cpu_seconds()
        with Mp4Writer(Path(tmp) / "e.mp4", assets.width, assets.height, 25) as w:
            for f in blended:
                w.write(f)
        out["encode whole-file (superfast)"] = (cpu_seconds() - t) / n
    t = cpu_seconds()
    with FragmentWriter(lambda k, b: None, assets.width, assets.height, 25) as w:
        for f in blended:
            w.write(f)
    out["encode stream (superfast+zerolatency)"] = (cpu_seconds() - t) / n
    return out


def psnr_outside_mouth(
    a_path: Path, b_path: Path, assets, idxs, a_boxes: np.ndarray
) -> tuple[float, float, int]:
    """(min, mean) PSNR in dB of b's frames against a's, outside both sides' blend squares
    (`assets.mask_boxes` for b, `a_boxes` for a: their landmarks may differ)."""
    import av

    def frames(p: Path):
        with av.open(str(p)) as c:
            for f in c.decode(c.streams.video[0]):
                yield f.to_ndarray(format="rgb24")

    vals = []
    for t, (fa, fb) in enumerate(zip(frames(a_path), frames(b_path), strict=False)):
        i = idxs[t]
        keep = np.ones(fa.shape[:2], bool)
        for box in (assets.mask_boxes[i], a_boxes[i]):
            x1, y1, x2, y2 = (int(v) for v in box)
            keep[max(y1, 0) : max(y2, 0), max(x1, 0) : max(x2, 0)] = False
        vals.append(min(psnr(fa, fb, keep), 99.0))  # 99: identical outside the mouth
    return min(vals), float(np.mean(vals)), len(vals)


def add_arguments(ap) -> None:
    ap.add_argument("--seconds", type=float, default=20.0, help="speech to render")
    ap.add_argument(
        "--frames", type=int, default=250, help="stored frames in the loop (a short one flatters)"
    )
    ap.add_argument("--size", default="1080x1920", help="WxH of the generated loop")
    ap.add_argument("--live-seconds", type=float, default=10.0)
    ap.add_argument("--stage-frames", type=int, default=50, help="frames for each stage alone")
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--skip-http", action="store_true", help="no server: in process only")
    ap.add_argument("--only-serve", action="store_true", help="only the HTTP and live parts")


def main(bench: Bench) -> None:
    args = bench.args
    from pipeline.render.schedule import schedule
    from pipeline.render.video import render_video

    size = tuple(int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        personas = tmp / "personas" / "astro"
        personas.mkdir(parents=True)
        video = write_loop_video(personas / "studio.mp4", n_frames=args.frames, size=size)
        store = open_store(tmp / "cache")
        precompile(video, Recipe(), store)
        avatar = plan_for(store, video, Recipe()).avatar
        assets = load_assets(store, avatar)
        wav = write_wav(tmp / "speech.wav", make_speech_audio(args.seconds, sr=16000), 16000)
        print(
            f"setup: {assets.n_frames} stored {assets.width}x{assets.height} frames "
            f"precompiled in {time.perf_counter() - t0:.1f} s; {args.seconds:g} s of speech"
        )

        inputs = {
            "loop_frames": assets.n_frames,
            "resolution": f"{assets.width}x{assets.height}",
            "audio_seconds": args.seconds,
            "renderer": "warp",
        }
        if args.only_serve:
            http_and_live(bench, tmp, args, inputs)
            return
        print(f"\nhot warp render, {args.seconds:g} s at 25 fps:")
        base = baseline(
            bench, args.baseline_ref, tmp, tmp / "base-cache", video, wav, tmp / "base.mp4"
        )
        line(f"baseline ({args.baseline_ref})", base["frames"], base["wall"], base["cpu"])

        cpu = cpu_seconds()
        rep = render_video(assets, wav, tmp / "whole.mp4")
        line("whole file (MP4)", rep.frames, rep.wall_seconds, cpu_seconds() - cpu)
        whole_fps = rep.frames / rep.wall_seconds

        first: list[float] = []
        sizes: list[int] = []

        def sink(kind: str, data: bytes) -> None:
            if kind == "fragment" and not first:
                first.append(time.perf_counter())
            sizes.append(len(data))

        cpu = cpu_seconds()
        start = time.perf_counter()
        rep = render_video(assets, wav, tmp / "stream.mp4", sink=sink)
        stream_cpu = cpu_seconds() - cpu
        line(
            "streamed (fMP4, in process)",
            rep.frames,
            rep.wall_seconds,
            stream_cpu,
            f"  first fragment {1000 * (first[0] - start):.0f} ms",
        )
        stream_fps = rep.frames / rep.wall_seconds
        base_fps = base["frames"] / base["wall"]
        old = f"today's renderer (render_video at {args.baseline_ref}, same loop, same run)"
        bench.figure(
            "hot warp render, streamed (fMP4, in process)",
            stream_fps,
            "frames/s",
            baseline=old,
            baseline_value=base_fps,
            inputs=inputs,
            note=f"~{2000 / (stream_cpu / rep.frames * 1000):.0f} frames/s on 2 idle cores by CPU time",
        )
        bench.figure(
            "hot warp render, whole file (MP4)",
            whole_fps,
            "frames/s",
            baseline=old,
            baseline_value=base_fps,
            inputs=inputs,
        )
        bench.figure(
            "hot warp render, streamed: CPU per frame",
            stream_cpu / rep.frames * 1e3,
            "ms",
            baseline=old,
            baseline_value=base["cpu"] / base["frames"] * 1e3,
            better="lower",
            inputs=inputs,
        )
        bench.figure(
            "time to the first fragment, hot, in process",
            1000 * (first[0] - start),
            "ms",
            baseline="the whole streamed render",
            baseline_value=1000 * rep.wall_seconds,
            better="lower",
            inputs=inputs,
            note="goal <= 0.3 s",
        )

        idxs = schedule(rep.frames, assets.n_frames).tolist()
        old_boxes = np.load(tmp / "base.npy")
        lo, mean, n = psnr_outside_mouth(
            tmp / "base.mp4", tmp / "stream.mp4", assets, idxs, old_boxes
        )
        lo_w, mean_w, _ = psnr_outside_mouth(
            tmp / "base.mp4", tmp / "whole.mp4", assets, idxs, old_boxes
        )
        for which, value, whole in (("worst frame", lo, lo_w), ("mean", mean, mean_w)):
            bench.figure(
                f"PSNR outside the mouth, streamed vs the baseline's frames, {which}",
                value,
                "dB",
                baseline="the whole file vs the baseline's frames",
                baseline_value=whole,
                inputs={**inputs, "frames_compared": n},
                note="goal >= 40 dB",
            )

        print("\nper frame, each stage alone (CPU ms):")
        stage = {k: v for k, v in inputs.items() if k != "audio_seconds"}
        for k, v in breakdown(assets, args.stage_frames).items():
            bench.figure(
                f"per frame, alone: {k}",
                v * 1000,
                "CPU ms",
                baseline="one frame's time at 25 fps",
                baseline_value=40.0,
                better="lower",
                inputs={**stage, "frames": args.stage_frames},
            )

        if not args.skip_http:
            http_and_live(bench, tmp, args, inputs)


def http_and_live(bench: Bench, tmp: Path, args, inputs: dict) -> None:
    from testkit.serve_helpers import Server, wait_state
    from testkit.stream_helpers import Boxes, live_session, pcm16

    root = tmp
    with Server(root, "--workers", "1", "--max-audio-seconds", "600") as srv:
        with srv.client() as c:
            job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"})
            wait_state(c, job.json()["id"], ("done", "failed"))
            print("\nover loopback HTTP (hotplate serve, 1 worker):")
            for attempt in range(2):
                with open(root / "speech.wav", "rb") as f:
                    start = time.perf_counter()
                    first = None
                    n = 0
                    with c.stream(
                        "POST",
                        "/v1/lip-sync/stream",
                        data={"persona": "astro", "attire": "studio"},
                        files={"audio": ("speech.wav", f, "audio/wav")},
                    ) as r:
                        boxes = Boxes()
                        for chunk in r.iter_raw():
                            for kind, _ in boxes.feed(chunk):
                                if kind == "moof":
                                    n += 1
                                    first = first or time.perf_counter()
                    end = time.perf_counter()
                if r.status_code != 200 or first is None:
                    raise SystemExit(f"POST /v1/lip-sync/stream: {r.status_code}, no fragment")
                which = "the server's first request" if attempt == 0 else "a second request"
                bench.figure(
                    f"time to the first fragment over loopback HTTP, {which}",
                    1000 * (first - start),
                    "ms",
                    baseline="the whole response",
                    baseline_value=1000 * (end - start),
                    better="lower",
                    inputs=inputs,
                    note=f"{n} fragments; goal <= 0.5 s",
                )

        audio = make_speech_audio(args.live_seconds, sr=16000, seed=5)
        start = {"persona": "astro", "attire": "studio", "sample_rate": 16000, "channels": 1}
        res = live_session(srv.url, start, pcm16(audio), 32000, chunk_seconds=0.02)
        if not res.arrivals:
            raise SystemExit(f"WS /v1/live sent no fragment: {res.final}")
        lat = res.arrivals[0] - res.first_audio_at
        lag = res.arrivals[-1] - res.end_sent_at
        own = {k: res.final.get(k) for k in ("first_fragment_seconds", "end_lag_seconds", "frames")}
        print(f"  WS /v1/live, server's own figures: {json.dumps(own)}")
        live = {**inputs, "audio_seconds": args.live_seconds, "chunk_ms": 20}
        from pipeline.render.fmp4 import FRAGMENT_SECONDS, fragment_frames

        per = fragment_frames(25.0, FRAGMENT_SECONDS)
        pace = f"the audio's own pace (one {per}-frame fragment = {per * 40} ms of audio)"
        bench.figure(
            "WS /v1/live: first fragment after the first audio",
            1000 * lat,
            "ms",
            baseline=pace,
            baseline_value=per * 40.0,
            better="lower",
            inputs=live,
            note="goal <= 1 s; the first fragment is one frame",
        )
        bench.figure(
            "WS /v1/live: last fragment after the end message",
            1000 * lag,
            "ms",
            baseline=pace,
            baseline_value=per * 40.0,
            better="lower",
            inputs=live,
            note="goal <= 1 s",
        )


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={
            "seconds": 2.0,
            "frames": 4,
            "size": "540x960",
            "live_seconds": 1.0,
            "stage_frames": 8,
        },
    )

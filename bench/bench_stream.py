"""Streaming: time to the first fragment, live latency, and a hot 1080x1920 warp render's
speed streamed and whole-file, against today's renderer on the same avatar in the same run.

    .venv/bin/python bench/bench_stream.py [--seconds 20] [--frames 24] [--live-seconds 10]
        [--baseline-ref 3d0c64b] [--skip-http]

Setup: a generated 1080x1920 loop of `--frames` frames is precompiled into a real store.
Then, each on the same avatar and the same `--seconds` of generated speech:

- baseline: `render_video` as it was at `--baseline-ref` (the renderer before the
  streaming work: `git archive` of that commit, run in a subprocess on the same store);
- whole file: today's `render_video` (MP4, superfast);
- streamed in process: `render_video` with a fragment sink (fMP4, superfast +
  zerolatency): frames/s and the time from the call to the first fragment;
- over loopback HTTP: `hotplate serve` on 127.0.0.1, POST /v1/lip-sync/stream, time from
  the request to the first moof received, and the whole response;
- live: WS /v1/live fed `--live-seconds` of speech paced at real time; from the first
  PCM chunk sent to the first fragment received, and from the end message to the last;
- per frame: decode, mouth (warp), blend, encode (I420 + x264), each alone, CPU ms;
- quality: PSNR of the streamed frames against the baseline's, outside the mouth region
  (the union of the blend squares), min and mean over frames.

The machine may be shared: wall-clock figures move with its load, CPU ms per frame less
so; the load average is printed. CUDA: musetalk is benched only where a device exists.
Figures only, no asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cachestore.store import open_store  # noqa: E402
from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav  # noqa: E402
from pipeline.catalog import plan_for  # noqa: E402
from pipeline.hot import load_assets  # noqa: E402
from pipeline.precompile.recipe import Recipe  # noqa: E402
from pipeline.precompile.run import precompile  # noqa: E402

BASELINE_REF = "3d0c64b"  # main before issue 18 (streaming, the faster hot path)

BASELINE = r"""
import json, resource, sys, time
from pathlib import Path
from cachestore.store import open_store
from pipeline.hot import load_assets
from pipeline.render.video import render_video
store = open_store(Path(sys.argv[1]))
assets = load_assets(store, sys.argv[2])
r0 = resource.getrusage(resource.RUSAGE_SELF)
rep = render_video(assets, sys.argv[3], sys.argv[4])
r1 = resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
print(json.dumps({"frames": rep.frames, "wall": rep.wall_seconds, "cpu": cpu,
                  "first": rep.first_frame_seconds}))
"""


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def line(label: str, frames: int, wall: float, cpu: float, extra: str = "") -> None:
    print(
        f"  {label:28s} {frames / wall:6.1f} fps  {frames / 25 / wall:5.2f}x real time  "
        f"CPU {cpu / frames * 1000:5.1f} ms/frame  wall {wall:5.1f} s{extra}"
    )


def baseline(ref: str, tmp: Path, cache: Path, avatar: str, wav: Path, out: Path) -> dict:
    """Today's renderer: the tree at `ref`, in its own process, on the same store."""
    tree = tmp / f"baseline-{ref}"
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "cachestore", "pipeline"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(tree, filter="data")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run(
        [sys.executable, "-c", BASELINE, str(cache), avatar, str(wav), str(out)],
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
    from pipeline.render.renderers.base import blend, fit_mask
    from pipeline.render.renderers.warp import WarpRenderer
    from pipeline.render.schedule import schedule

    idxs = schedule(n, assets.n_frames).tolist()
    out = {}
    t = time.thread_time()
    frames = [assets.load_frame(i) for i in idxs]
    out["decode (JPEG, whole frame)"] = (time.thread_time() - t) / n
    r = WarpRenderer(silence=None)
    audio = make_speech_audio(n / 25, sr=48000)
    r.prepare(assets, audio, 48000, n, 25.0)
    for i in set(idxs):
        r._plan(i)  # plans are made once per stored frame; not per output frame
    o = np.clip(r.openness(), 0.3, 1.0)
    regions = []
    t = time.thread_time()
    for k, i in enumerate(idxs):
        plan = r._plan(i)
        regions.append(r._warp(frames[k], plan, float(o[k]), 0.0))
    out["mouth (warp of the region)"] = (time.thread_time() - t) / n
    t = time.thread_time()
    blended = [f.copy() for f in frames]
    out["copy of a whole frame, fresh memory (today's blend makes one)"] = (
        time.thread_time() - t
    ) / n
    t = time.thread_time()
    for k, i in enumerate(idxs):
        plan = r._plan(i)
        mbox = assets.mask_boxes[i]
        mask = fit_mask(assets.masks[i], mbox)
        x1, y1, x2, y2 = plan.box
        mask = mask[y1 - mbox[1] : y2 - mbox[1], x1 - mbox[0] : x2 - mbox[0]]
        blend(blended[k], regions[k], plan.box, mask, plan.box, out=blended[k])
    out["blend (into the frame, in place)"] = (time.thread_time() - t) / n
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


def psnr_outside_mouth(a_path: Path, b_path: Path, assets, idxs) -> tuple[float, float, int]:
    """(min, mean) PSNR in dB of b's frames against a's, outside the blend squares."""
    import av

    def frames(p: Path):
        with av.open(str(p)) as c:
            for f in c.decode(c.streams.video[0]):
                yield f.to_ndarray(format="rgb24")

    vals = []
    for t, (fa, fb) in enumerate(zip(frames(a_path), frames(b_path), strict=False)):
        i = idxs[t]
        keep = np.ones(fa.shape[:2], bool)
        x1, y1, x2, y2 = (int(v) for v in assets.mask_boxes[i])
        keep[max(y1, 0) : max(y2, 0), max(x1, 0) : max(x2, 0)] = False
        d = fa[keep].astype(np.float32) - fb[keep].astype(np.float32)
        mse = float(np.mean(d * d))
        vals.append(99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse))
    return min(vals), float(np.mean(vals)), len(vals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="speech to render")
    ap.add_argument("--frames", type=int, default=24, help="stored frames in the loop")
    ap.add_argument("--live-seconds", type=float, default=10.0)
    ap.add_argument("--baseline-ref", default=BASELINE_REF)
    ap.add_argument("--skip-http", action="store_true", help="no server: in process only")
    ap.add_argument("--only-serve", action="store_true", help="only the HTTP and live parts")
    args = ap.parse_args()

    from pipeline.render.schedule import schedule
    from pipeline.render.video import render_video

    print(
        f"cores: {os.cpu_count()}; load average at start: {os.getloadavg()[0]:.1f} "
        "(the machine may be shared)"
    )
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        t0 = time.perf_counter()
        personas = tmp / "personas" / "astro"
        personas.mkdir(parents=True)
        video = write_loop_video(personas / "studio.mp4", n_frames=args.frames)
        store = open_store(tmp / "cache")
        precompile(video, Recipe(), store)
        avatar = plan_for(store, video, Recipe()).avatar
        assets = load_assets(store, avatar)
        wav = write_wav(tmp / "speech.wav", make_speech_audio(args.seconds, sr=16000), 16000)
        print(
            f"setup: {assets.n_frames} stored {assets.width}x{assets.height} frames "
            f"precompiled in {time.perf_counter() - t0:.1f} s; {args.seconds:g} s of speech"
        )

        if args.only_serve:
            http_and_live(tmp, args)
            return
        print(f"\nhot warp render, {args.seconds:g} s at 25 fps:")
        base = baseline(args.baseline_ref, tmp, tmp / "cache", avatar, wav, tmp / "base.mp4")
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
        print(
            f"  speed-up vs baseline: whole file {whole_fps / base_fps:.2f}x, "
            f"streamed {stream_fps / base_fps:.2f}x; on 2 idle cores (CPU-bound): "
            f"~{2000 / (stream_cpu / rep.frames * 1000):.0f} fps streamed"
        )

        idxs = schedule(rep.frames, assets.n_frames).tolist()
        lo, mean, n = psnr_outside_mouth(tmp / "base.mp4", tmp / "stream.mp4", assets, idxs)
        print(
            f"  PSNR streamed vs baseline outside the mouth: min {lo:.1f} dB, mean {mean:.1f} dB ({n} frames)"
        )
        lo, mean, n = psnr_outside_mouth(tmp / "base.mp4", tmp / "whole.mp4", assets, idxs)
        print(
            f"  PSNR whole file vs baseline outside the mouth: min {lo:.1f} dB, mean {mean:.1f} dB"
        )

        print("\nper frame, each stage alone (CPU ms):")
        for k, v in breakdown(assets).items():
            print(f"  {k:40s} {v * 1000:6.1f}")

        if not args.skip_http:
            http_and_live(tmp, args)

        try:
            import torch

            cuda = torch.cuda.is_available()
        except ImportError:
            cuda = False
        if not cuda:
            print(
                "\nCUDA: no device on this machine; musetalk streamed fps with batch and fp16 not measured"
            )


def http_and_live(tmp: Path, args) -> None:

    from tests.hotplate.serve_helpers import Server, wait_state
    from tests.hotplate.stream_helpers import Boxes, live_session, pcm16

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
                print(
                    f"  POST /v1/lip-sync/stream #{attempt + 1}: first moof after "
                    f"{1000 * (first - start):.0f} ms, {n} fragments, whole response "
                    f"{end - start:.1f} s for {args.seconds:g} s of speech "
                    f"({args.seconds / (end - start):.2f}x real time)"
                )

        audio = make_speech_audio(args.live_seconds, sr=16000, seed=5)
        start = {"persona": "astro", "attire": "studio", "sample_rate": 16000, "channels": 1}
        res = live_session(srv.url, start, pcm16(audio), 32000, chunk_seconds=0.02)
        lat = res.arrivals[0] - res.first_audio_at
        lag = res.arrivals[-1] - res.end_sent_at
        print(
            f"  WS /v1/live, {args.live_seconds:g} s paced in 20 ms chunks: first fragment "
            f"{1000 * lat:.0f} ms after the first audio (the first fragment is one frame: floor "
            f"~120 ms of audio), last {1000 * lag:.0f} ms after the end message; server's own "
            f"figures: {json.dumps({k: res.final.get(k) for k in ('first_fragment_seconds', 'end_lag_seconds', 'frames')})}"
        )


if __name__ == "__main__":
    main()

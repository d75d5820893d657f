"""The hot path, old and new side by side: stored frame formats, the encoder, each stage's
CPU ms per frame, and whole-file, streamed and live renders of warp loops of 24, 100 and
250 frames at 1080x1920 and 720x1280.

    .venv/bin/python bench/bench_hot_path.py [--loops 24,100,250] [--sizes 1080x1920,720x1280]
        [--seconds 20] [--baseline-ref a9ed232] [--quick] [--json FILE]

For each size and loop length a generated loop is precompiled twice into one store: by
the baseline (`git archive` of `--baseline-ref`, main before issue 25: frames stored as
JPEG 4:4:4, decoded to RGB, the mouth blended in RGB, the whole frame converted to I420)
and by this tree (frames stored as the encoder's I420 planes in a JPEG, the mouth blended
in I420). Each side then renders its own avatar in a process of its own (the same script,
run from either tree): whole file, streamed (fMP4 to a sink) and live (the PCM given in
20 ms chunks as fast as it renders). Printed per render: frames/s, real-time factor, CPU
ms per frame (process CPU time, both cores counted), time to the first fragment, peak
RSS of the process; then the store's bytes per avatar, and the PSNR of the new output
against the old outside the mouth (the union of the blend squares) and inside it.

In this process, on the same avatars: each stage alone, CPU ms per frame (decode, the
mouth, blend, colour conversion, x264), and the candidate stored formats (decode ms,
bytes, PSNR against the source's I420) and encoder settings (ms, bitrate, PSNR/SSIM at
the baseline's bitrate).

The machine may be shared: wall-clock figures move with its load, CPU ms per frame much
less; the load average is printed at start and end. Ratios are measured in one run.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np
from harness import ROOT, Bench, run_bench

from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from hotplate.demo_data import iter_loop_frames, make_speech_audio, write_loop_video, write_wav
from pipeline.hot import load_assets

BASELINE_REF = "a9ed232"  # main before issue 25

# One side's precompile and renders, run from either tree: argv[1] is a JSON job.
RUNNER = r"""
import json, os, resource, sys, time
from pathlib import Path
import numpy as np
job = json.loads(sys.argv[1])
from cachestore.store import open_store
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from pipeline.hot import load_assets
from pipeline.render.video import render_video
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def reset_peak():  # Linux: clear VmHWM, so each render's own peak is read
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
def status_mb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
try:  # this tree's render workers set the allocator up and warm up before their first job
    from pipeline.render.video import warm_up
    warm_up()
except ImportError:  # the old tree has none
    pass
store = open_store(Path(job["cache"]))
t0 = time.perf_counter()
rep = precompile(Path(job["video"]), Recipe(), store)  # the loop has job["frames"] frames
out = {"avatar": rep.avatar, "precompile_s": time.perf_counter() - t0}
assets = load_assets(store, rep.avatar)
if job.get("speech"):  # the persona's talking footage: the mouth bank (this tree only)
    from pipeline.hot import load_bank
    from pipeline.precompile.recipe import for_speech
    t0 = time.perf_counter()
    bank = precompile(Path(job["speech"]), for_speech(Recipe()), store, bank=True).avatar
    out["bank_s"], out["bank"] = time.perf_counter() - t0, bank
    assets.bank = load_bank(store, bank)
    out["bank_entries"] = assets.bank.size
for mode in ("whole", "stream", "live"):  # whole first: it pays what a first render pays
    reset_peak()
    rss0 = status_mb("VmRSS")
    c0, w0 = cpu(), time.perf_counter()
    first = []
    if mode == "live":
        from pipeline.render.live import live_render
        pcm = np.fromfile(job["pcm"], "<i2").tobytes()
        step = 2 * 960  # 20 ms at 48 kHz
        rep2 = live_render(assets, (pcm[i:i + step] for i in range(0, len(pcm), step)), 48000, 1,
                           lambda k, b: first.append(time.perf_counter()) if k == "fragment" else None)
        frames = rep2.frames
    else:
        sink = (lambda k, b: first.append(time.perf_counter()) if k == "fragment" else None) if mode == "stream" else None
        rep2 = render_video(assets, job["audio"], job["out_" + mode], sink=sink)
        frames = rep2.frames
    wall, c = time.perf_counter() - w0, cpu() - c0
    out[mode] = {"frames": frames, "wall": wall, "cpu": c,
                 "first": (first[0] - w0) if first else None,
                 "maxrss_mb": status_mb("VmHWM"), "grew_mb": status_mb("VmHWM") - rss0}
print("RESULT " + json.dumps(out))
"""


def add_arguments(ap) -> None:
    ap.add_argument("--loops", default="24,100,250", help="loop lengths in frames")
    ap.add_argument("--sizes", default="1080x1920,720x1280", help="WxH, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="speech per render")
    ap.add_argument("--baseline-ref", default=BASELINE_REF, help="commit of the old path")
    ap.add_argument(
        "--bank-seconds",
        type=float,
        default=10.0,
        help="talking footage the new side builds its mouth bank from (0: no bank)",
    )


def baseline_tree(ref: str, into: Path) -> Path:
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def run_side(tree: Path, job: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(job)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"render in {tree} failed:\n{proc.stderr[-3000:]}")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def first_fragments(tree: Path, root: Path, cache: Path, wav: Path, requests: int) -> list[float]:
    """`hotplate serve` from `tree` on loopback (1 worker): seconds from each POST
    /v1/lip-sync/stream to its first moof, the first request right after /readyz."""
    import httpx

    port = free_port()
    data = root / f"serve-data-{port}"
    cmd = invocation(root / "personas", cache, "serve", "--port", str(port), "--workers", "1")
    cmd += ["--data", str(data), "--max-audio-seconds", "600"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    log = open(root / f"serve-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server from {tree} did not start: see {log.name}")
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        out = []
        with httpx.Client(base_url=url, timeout=600) as client:
            for _ in range(requests):
                with open(wav, "rb") as f:
                    start, first, buf = time.perf_counter(), None, b""
                    with client.stream(
                        "POST",
                        "/v1/lip-sync/stream",
                        data={"persona": "astro", "attire": "studio"},
                        files={"audio": ("speech.wav", f, "audio/wav")},
                    ) as r:
                        r.raise_for_status()
                        for chunk in r.iter_raw():
                            buf += chunk
                            if first is None and b"moof" in buf:
                                first = time.perf_counter() - start
                                buf = b""
                out.append(first)
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def speech_clip(tmp: Path, size: tuple[int, int], seconds: float) -> Path:
    """Talking footage of the loop's presenter (its frames over generated speech, as
    H.264 + AAC): what the new side builds the persona's mouth bank from."""
    from pipeline.render.encode import Mp4Writer

    path = tmp / f"speech-{size[0]}x{size[1]}.mp4"
    if not path.exists():
        frames = int(seconds * 25)
        audio = make_speech_audio(seconds, 48000, seed=7)
        with Mp4Writer(path, size[0], size[1], 25.0, audio=audio, sample_rate=48000) as w:
            for frame in iter_loop_frames(frames, size, seed=3):
                w.write(frame)
    return path


def cpu_thread() -> float:
    return time.thread_time()


def cpu_process() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    m = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return 10 * np.log10(255.0**2 / max(m, 1e-10))


def ssim_y(a: np.ndarray, b: np.ndarray) -> float:
    import cv2

    a, b = a.astype(np.float32), b.astype(np.float32)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def g(x):
        return cv2.GaussianBlur(x, (11, 11), 1.5)

    ma, mb = g(a), g(b)
    va, vb, cov = g(a * a) - ma**2, g(b * b) - mb**2, g(a * b) - ma * mb
    return float(
        np.mean(((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma**2 + mb**2 + c1) * (va + vb + c2)))
    )


def decode_video(path: Path, limit: int) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as c:
        return [
            f.to_ndarray(format="rgb24")
            for _, f in zip(range(limit), c.decode(video=0), strict=False)
        ]


def encode_cpu(frames, options: dict, bitrate: int | None = None) -> tuple[float, float, list]:
    """x264 on I420 VideoFrames: CPU ms per frame (all its threads), Mbit/s, decoded Y."""
    from fractions import Fraction

    import av

    w, h = frames[0].width, frames[0].height
    cc = av.CodecContext.create("libx264", "w")
    cc.width, cc.height, cc.pix_fmt = w, h, "yuv420p"
    cc.time_base, cc.framerate = Fraction(1, 25), Fraction(25)
    if bitrate:
        cc.bit_rate = int(bitrate)
    cc.options = options
    packets = []
    c0 = cpu_process()
    for i, f in enumerate(frames):
        f.pts = i
        packets += [bytes(p) for p in cc.encode(f)]
    packets += [bytes(p) for p in cc.encode(None)]
    ms = (cpu_process() - c0) / len(frames) * 1e3
    dec = av.CodecContext.create("h264", "r")
    ys = []
    for p in packets:
        ys += [np.asarray(f.to_ndarray())[:h] for f in dec.decode(av.Packet(p))]
    ys += [np.asarray(f.to_ndarray())[:h] for f in dec.decode(None)]
    return ms, sum(map(len, packets)) * 8 * 25 / len(frames) / 1e6, ys


def stages(
    bench: Bench, store, old_key: str, new_key: str, bank: str | None, n: int, inputs: dict
) -> list:
    """Each stage alone on n output frames, CPU ms per frame, old and new side by side
    (the new side with the persona's mouth bank when there is one)."""
    import cv2

    from pipeline.media import decode_frame, decode_yuv
    from pipeline.render.compose import compose
    from pipeline.render.encode import DEFAULT_CRF, DEFAULT_PRESET
    from pipeline.render.fmp4 import STREAM_CRF, STREAM_PRESET, STREAM_TUNE
    from pipeline.render.renderers.warp import WarpRenderer
    from pipeline.render.schedule import schedule
    from pipeline.yuv import copy_frame, paste_patch, sparse_rgb

    old, new = load_assets(store, old_key), load_assets(store, new_key)
    if bank is not None:
        from pipeline.hot import load_bank

        new.bank = load_bank(store, bank)
    audio = make_speech_audio(n / 25 + 1, 48000)
    idxs = schedule(n, new.n_frames, "pingpong")
    r_old, r_new = WarpRenderer(), WarpRenderer()
    r_old.prepare(old, audio, 48000, n, 25.0)
    r_new.prepare(new, audio, 48000, n, 25.0)
    for k in range(n):  # each stored frame's warp plan, made once per render, not timed
        r_old.mouth_source(k, int(idxs[k]))
        r_new.mouth_source(k, int(idxs[k]))
    with store.read() as r:  # the stored bytes, copied out as the frame loader does
        blobs_old = [r.array(old.load_frame.digests[int(i)]).copy() for i in idxs]
        blobs_new = [r.array(new.load_frame.digests[int(i)]).copy() for i in idxs]

    def timed(fn, items):
        c0 = cpu_thread()
        out = [fn(x) for x in items]
        return (cpu_thread() - c0) / len(items) * 1e3, out

    ms = {}
    ms["decode old (JPEG 4:4:4 -> RGB)"], rgb = timed(decode_frame, blobs_old)
    ms["decode new (I420 JPEG -> planes)"], yuv = timed(decode_yuv, blobs_new)
    ms["mouth+blend old steps (warp on the whole RGB frame, no bank)"], drawn = timed(
        lambda k: r_old.render(k, int(idxs[k]), rgb[k], inplace=True), range(n)
    )
    ms["RGB->I420 old (whole frame)"], _ = timed(
        lambda f: cv2.cvtColor(f, cv2.COLOR_RGB2YUV_I420), drawn
    )
    boxes = [r_new.mouth_source(k, int(idxs[k])) for k in range(n)]
    moving = [k for k in range(n) if boxes[k] is not None]
    ms["mouth rect -> RGB new"], unders = timed(lambda k: sparse_rgb(yuv[k], boxes[k])[0], moving)
    c0 = cpu_thread()
    patches = [
        r_new.render_patches([k], [int(idxs[k])], [u])[0]
        for k, u in zip(moving, unders, strict=True)
    ]
    ms["mouth new (warp's patch)"] = (cpu_thread() - c0) / max(len(moving), 1) * 1e3
    c0 = cpu_thread()
    for k, m, u in zip(moving, patches, unders, strict=True):
        if m is not None:
            paste_patch(copy_frame(yuv[k]), m.box, m.pixels, u)
    ms["copy + patch into I420 new"] = (cpu_thread() - c0) / max(len(moving), 1) * 1e3
    c0 = cpu_thread()
    composed = []
    for k in range(0, n, 4):
        composed += compose(
            r_new,
            list(range(k, min(n, k + 4))),
            [int(i) for i in idxs[k : k + 4]],
            yuv[k : k + 4],
            new.width - new.width % 2,
            new.height - new.height % 2,
        )
    ms["compose new (all of the above, per output frame)"] = (cpu_thread() - c0) / n * 1e3
    from pipeline.yuv import frame_from_rgb

    old_frames = [frame_from_rgb(f) for f in drawn]
    whole = {"preset": DEFAULT_PRESET, "crf": str(DEFAULT_CRF)}
    stream = {"preset": STREAM_PRESET, "tune": STREAM_TUNE, "crf": str(STREAM_CRF)}
    ms[f"x264 whole file ({DEFAULT_PRESET}, CRF {DEFAULT_CRF})"], rate, _ = encode_cpu(
        old_frames, whole
    )
    ms[f"x264 stream ({STREAM_PRESET} {STREAM_TUNE}, CRF {STREAM_CRF})"], _, _ = encode_cpu(
        old_frames, stream
    )
    for name, value in ms.items():
        bench.figure(f"stage: {name}", value, "CPU ms/frame", better="lower", inputs=inputs)
    old_total = (
        ms["decode old (JPEG 4:4:4 -> RGB)"]
        + ms["mouth+blend old steps (warp on the whole RGB frame, no bank)"]
    )
    old_total += ms["RGB->I420 old (whole frame)"]
    new_total = (
        ms["decode new (I420 JPEG -> planes)"]
        + ms["compose new (all of the above, per output frame)"]
    )
    bench.figure(
        "stages before x264 (decode, mouth, blend, conversion)",
        new_total,
        "CPU ms/frame",
        baseline="the old path's same stages",
        baseline_value=old_total,
        better="lower",
        inputs=inputs,
    )
    return [old_frames, composed, rate]


def formats(bench: Bench, size: tuple[int, int], n: int, inputs: dict) -> None:
    """Candidate stored formats on source frames: decode CPU ms, KiB, PSNR of I420."""
    from fractions import Fraction

    import av
    import lz4.frame

    from pipeline.media import decode_frame, decode_yuv, encode_frame
    from pipeline.yuv import frame_from_rgb, i420_of_rgb, planes

    src = list(iter_loop_frames(n, size))
    want = [np.concatenate([p.reshape(-1) for p in i420_of_rgb(f)]) for f in src]

    def flat(vf):
        return np.concatenate([np.ascontiguousarray(p).reshape(-1) for p in planes(vf)])

    rows = {}
    old = [encode_frame(f, "jpeg-q95-444") for f in src]
    c0 = cpu_thread()
    got = [frame_from_rgb(decode_frame(b)) for b in old]
    rows["JPEG q95 4:4:4 -> RGB -> I420 (old)"] = (cpu_thread() - c0, old, got)
    new = [encode_frame(f) for f in src]
    c0 = cpu_thread()
    got = [decode_yuv(b) for b in new]
    rows["I420 JPEG q95 4:2:0 -> planes (new)"] = (cpu_thread() - c0, new, got)
    raw = [lz4.frame.compress(w.tobytes()) for w in want]
    c0 = cpu_thread()
    got_raw = [np.frombuffer(lz4.frame.decompress(b), np.uint8) for b in raw]
    t_raw = cpu_thread() - c0
    cc = av.CodecContext.create("libx264", "w")
    cc.width, cc.height, cc.pix_fmt = size[0], size[1], "yuv420p"
    cc.time_base = Fraction(1, 25)
    cc.options = {"preset": "medium", "tune": "fastdecode", "crf": "12", "x264-params": "keyint=25"}
    pk = []
    for i, f in enumerate(src):
        vf = frame_from_rgb(f)
        vf.pts = i
        pk += [bytes(p) for p in cc.encode(vf)]
    pk += [bytes(p) for p in cc.encode(None)]
    dec = av.CodecContext.create("h264", "r")
    dec.thread_type, dec.thread_count = "FRAME", 2
    c0 = cpu_process()
    got_h = []
    for p in pk:
        got_h += dec.decode(av.Packet(p))
    got_h += dec.decode(None)
    t_h = cpu_process() - c0
    for name, (t, data, frames) in rows.items():
        p = np.mean([psnr(flat(g), w) for g, w in zip(frames, want, strict=True)])
        kib = np.mean([len(b) for b in data]) / 1024
        bench.figure(
            f"format: {name}: decode",
            t / n * 1e3,
            "CPU ms/frame",
            better="lower",
            inputs=inputs,
            note=f"{kib:.0f} KiB/frame, PSNR vs source I420 {p:.1f} dB",
        )
    bench.figure(
        "format: I420 planes under LZ4 (lossless): decode",
        t_raw / n * 1e3,
        "CPU ms/frame",
        better="lower",
        inputs=inputs,
        note=f"{np.mean([len(b) for b in raw]) / 1024:.0f} KiB/frame, lossless",
    )
    p = np.mean([psnr(flat(g), w) for g, w in zip(got_h, want, strict=True)])
    bench.figure(
        "format: the loop as H.264 (CRF 12, fastdecode), FFmpeg's threaded decoder",
        t_h / n * 1e3,
        "CPU ms/frame",
        better="lower",
        inputs=inputs,
        note=f"{sum(map(len, pk)) / n / 1024:.0f} KiB/frame in order (x2 for ping-pong's "
        f"reverse), PSNR vs source I420 {p:.1f} dB; sequential access only",
    )
    del got_raw


def encoders(bench: Bench, frames: list, rate: float, inputs: dict) -> None:
    """x264 settings at the baseline whole file's bitrate: CPU ms, PSNR/SSIM of Y."""
    from pipeline.yuv import planes

    ref = [np.ascontiguousarray(planes(f)[0]) for f in frames]
    bitrate = int(rate * 1e6)
    results = {}
    for name, opts in (
        ("superfast (the whole file's preset)", {"preset": "superfast"}),
        ("superfast zerolatency (the stream's)", {"preset": "superfast", "tune": "zerolatency"}),
        ("ultrafast", {"preset": "ultrafast"}),
        ("veryfast", {"preset": "veryfast"}),
        ("superfast, 1 thread", {"preset": "superfast", "threads": "1"}),
        (
            "superfast zerolatency, 2 slices",
            {"preset": "superfast", "tune": "zerolatency", "threads": "2"},
        ),
    ):
        ms, mbit, ys = encode_cpu(frames, opts, bitrate)
        results[name] = (
            ms,
            mbit,
            np.mean([psnr(a, b) for a, b in zip(ys, ref, strict=False)]),
            np.mean([ssim_y(a, b) for a, b in zip(ys[::4], ref[::4], strict=False)]),
        )
    base = results["superfast (the whole file's preset)"]
    for name, (ms, mbit, p, s) in results.items():
        bench.figure(
            f"x264 {name} at {rate:.1f} Mbit/s",
            ms,
            "CPU ms/frame",
            better="lower",
            baseline="superfast at the same bitrate",
            baseline_value=base[0],
            inputs=inputs,
            note=f"{mbit:.2f} Mbit/s, PSNR-Y {p:.2f} dB (superfast {base[2]:.2f}), SSIM-Y {s:.4f}",
        )
    import av

    if "libopenh264" not in av.codecs_available:
        print("  openh264: not in this PyAV build's codecs (not measured)")


def outside_psnr(a_path: Path, b_path: Path, assets, n: int) -> tuple[float, float]:
    from pipeline.render.schedule import schedule

    a, b = decode_video(a_path, n), decode_video(b_path, n)
    idxs = schedule(len(a), assets.n_frames, "pingpong")
    out, inside = [], []
    for t, (x, y) in enumerate(zip(a, b, strict=False)):
        x1, y1, x2, y2 = (int(v) for v in assets.mask_boxes[int(idxs[t])])
        keep = np.ones(x.shape[:2], bool)
        keep[max(y1, 0) : y2, max(x1, 0) : x2] = False
        out.append(psnr(x[keep], y[keep]))
        inside.append(psnr(x[~keep], y[~keep]))
    return float(np.min(out)), float(np.mean(inside))


def main(bench: Bench) -> None:
    args = bench.args
    loops = [int(v) for v in args.loops.split(",")]
    sizes = args.sizes.split(",")
    seconds, bank_seconds = args.seconds, args.bank_seconds
    with tempfile.TemporaryDirectory(prefix="hot-path-") as tmp:
        tmp = Path(tmp)
        try:
            old_tree = baseline_tree(args.baseline_ref, tmp / "old")
        except subprocess.CalledProcessError:
            bench.missing(
                f"the baseline {args.baseline_ref} (git archive failed; a clone with history)"
            )
        audio = make_speech_audio(seconds, 48000)
        wav = write_wav(tmp / "speech.wav", audio, 48000)
        pcm = tmp / "speech.pcm"
        (np.clip(audio, -1, 1) * 32767).astype("<i2").tofile(pcm)
        for size_text in sizes:
            w, h = (int(v) for v in size_text.split("x"))
            for n in loops:
                inputs = {
                    "loop_frames": n,
                    "resolution": size_text,
                    "audio_seconds": seconds,
                    "renderer": f"warp, new side with a mouth bank of {bank_seconds:g} s"
                    if bank_seconds
                    else "warp",
                    "recipe": "default",
                }
                video = write_loop_video(tmp / f"loop-{size_text}-{n}.mp4", n_frames=n, size=(w, h))
                cache = tmp / f"cache-{size_text}-{n}"
                job = {
                    "cache": str(cache),
                    "video": str(video),
                    "frames": n,
                    "audio": str(wav),
                    "pcm": str(pcm),
                }
                res = {}
                if bank_seconds:
                    job["speech"] = str(speech_clip(tmp, (w, h), bank_seconds))
                for side, tree in (("old", old_tree), ("new", ROOT)):
                    if side == "old":
                        job_side = {k: v for k, v in job.items() if k != "speech"}
                    else:
                        job_side = job
                    res[side] = run_side(
                        tree,
                        {
                            **job_side,
                            "out_whole": str(tmp / f"{side}.mp4"),
                            "out_stream": str(tmp / f"{side}-s.mp4"),
                        },
                    )
                for mode in ("whole", "stream", "live"):
                    o, nw = res["old"][mode], res["new"][mode]
                    frames = nw["frames"]
                    bench.figure(
                        f"{mode}: fps",
                        frames / nw["wall"],
                        "frames/s",
                        baseline="the old path",
                        baseline_value=o["frames"] / o["wall"],
                        inputs=inputs,
                        note=f"real time x{frames / 25 / nw['wall']:.2f} "
                        f"(old x{o['frames'] / 25 / o['wall']:.2f})",
                    )
                    bench.figure(
                        f"{mode}: CPU per frame",
                        nw["cpu"] / frames * 1e3,
                        "ms",
                        baseline="the old path",
                        baseline_value=o["cpu"] / o["frames"] * 1e3,
                        better="lower",
                        inputs=inputs,
                        note=f"2-core real-time factor by CPU x{2 * 40 / (nw['cpu'] / frames * 1e3):.2f}",
                    )
                    if mode != "whole" and nw["first"] is not None:
                        bench.figure(
                            f"{mode}: first fragment, in process",
                            nw["first"],
                            "s",
                            baseline="the old path",
                            baseline_value=o["first"],
                            better="lower",
                            inputs=inputs,
                        )
                    bench.figure(
                        f"{mode}: peak RSS of the process during the render",
                        nw["maxrss_mb"],
                        "MB",
                        baseline="the old path",
                        baseline_value=o["maxrss_mb"],
                        better="lower",
                        inputs=inputs,
                    )
                    bench.figure(
                        f"{mode}: memory the render added (peak RSS over the process's before)",
                        nw["grew_mb"],
                        "MB",
                        baseline="the old path",
                        baseline_value=o["grew_mb"],
                        better="lower",
                        inputs=inputs,
                    )
                store = open_store(cache)
                bench.figure(
                    "store per avatar",
                    store.avatar_bytes(res["new"]["avatar"]) / 2**20,
                    "MiB",
                    baseline="the old format",
                    baseline_value=store.avatar_bytes(res["old"]["avatar"]) / 2**20,
                    better="lower",
                    inputs=inputs,
                )
                assets = load_assets(store, res["new"]["avatar"])
                low, mouth = outside_psnr(
                    tmp / "new.mp4", tmp / "old.mp4", assets, 48 if bench.quick else 250
                )
                bench.figure(
                    "whole file, new vs old, outside the mouth: min PSNR",
                    low,
                    "dB",
                    inputs=inputs,
                    note=f"inside the blend square: mean {mouth:.1f} dB",
                )
                if size_text == sizes[0] and n == max(loops):
                    personas = tmp / "personas" / "astro"
                    shutil.rmtree(tmp / "personas", ignore_errors=True)
                    personas.mkdir(parents=True)
                    os.link(video, personas / "studio.mp4")
                    if job.get("speech"):  # the new server renders with the persona's bank
                        os.link(job["speech"], personas / "speech.mp4")
                    k = 2 if bench.quick else 3
                    old_ff = first_fragments(old_tree, tmp, cache, wav, k)
                    new_ff = first_fragments(ROOT, tmp, cache, wav, k)
                    for j in range(k):
                        bench.figure(
                            f"first fragment over loopback HTTP, request {j + 1} after start",
                            new_ff[j],
                            "s",
                            baseline="the old server",
                            baseline_value=old_ff[j],
                            better="lower",
                            inputs=inputs,
                        )
                if n == max(loops):
                    frames_n = 8 if bench.quick else 48
                    old_frames, composed, rate = stages(
                        bench,
                        store,
                        res["old"]["avatar"],
                        res["new"]["avatar"],
                        res["new"].get("bank"),
                        frames_n,
                        inputs,
                    )
                    formats(bench, (w, h), 8 if bench.quick else 24, inputs)
                    encoders(bench, composed, rate, inputs)
                if "bank_s" in res["new"]:
                    bench.figure(
                        f"mouth bank precompile, {bank_seconds:g} s of talking footage",
                        res["new"]["bank_s"],
                        "s",
                        baseline="the loop's own precompile (new side)",
                        baseline_value=res["new"]["precompile_s"],
                        better="lower",
                        inputs=inputs,
                        note=f"{res['new']['bank_entries']} entries",
                    )
                forget_store(cache)
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    quick = {"loops": "24", "sizes": "720x1280", "seconds": 3.0, "bank_seconds": 1.2}
    run_bench(main, __doc__, add_arguments, quick=quick)

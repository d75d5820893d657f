"""The hot path against its limit: each stage's time, the encoder-only ceiling, the two
encoder profiles side by side, and the stream over HTTP against the file.

    .venv/bin/python bench/bench_hot_path.py [--loops 24,100,250] [--sizes 1080x1920]
        [--seconds 20] [--bank-seconds 10] [--requests 3] [--quick] [--json FILE]

For each size and loop length a generated loop (with sensor-like noise, as a camera's
frames have) is precompiled into a store, with the persona's mouth bank (built once per
size from `--bank-seconds` of talking footage). Then, in this
process, one after another on the same avatar and `--seconds` of speech:

- whole file, export profile (what `hotplate render` does) and preview profile;
- streamed in process (fMP4 to a sink), preview profile;
- per render: frames/s, the real-time factor, the time split between read/decode,
  the mouth, compose, encode and mux (RenderReport.timings: seconds summed on each
  stage's thread; they overlap on two cores), the first fragment, the bitrate;
- the encoder-only ceiling: the same frames (the first frames of the render, made by
  compose as the render makes them) through the same x264 settings and keyframes,
  nothing else, in frames/s of wall time; each path as a percentage of it.

On the longest loop of the first size, also:

- the encoder table: x264 settings (preset, tune, threads, slices, CRF) on those frames,
  CPU and wall ms per frame, Mbit/s, PSNR against the frames themselves (the source of
  the encode) and against the export's pictures; the two profiles are two of its rows;
- over loopback HTTP (`hotplate serve`, one worker, warm): `--requests` POSTs of
  /v1/lip-sync/stream with the preview profile, each one's first fragment and whole
  response, then one with the export profile; against the in-process export file.

The machine may be shared: wall-clock figures move with its load (printed at start and
end), ratios measured side by side in one run much less.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from fractions import Fraction
from pathlib import Path

import numpy as np
from harness import Bench, run_bench

from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from hotplate.demo_data import iter_loop_frames, make_speech_audio, write_loop_video, write_wav
from pipeline.hot import load_assets

STAGES = ("read", "mouth", "compose", "encode", "mux")
# the encoder table: name -> x264 options (keyframes forced as the preview's, every 12)
CANDIDATES = {
    "superfast CRF 18 (export)": {"preset": "superfast", "crf": "18"},
    "superfast zerolatency CRF 17 (the old stream)": {
        "preset": "superfast",
        "tune": "zerolatency",
        "crf": "17",
    },
    "superfast zerolatency CRF 23": {"preset": "superfast", "tune": "zerolatency", "crf": "23"},
    "veryfast zerolatency CRF 23": {"preset": "veryfast", "tune": "zerolatency", "crf": "23"},
    "ultrafast zerolatency CRF 20": {"preset": "ultrafast", "tune": "zerolatency", "crf": "20"},
    "ultrafast zerolatency CRF 23 (preview)": {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "crf": "23",
    },
    "ultrafast zerolatency CRF 26": {"preset": "ultrafast", "tune": "zerolatency", "crf": "26"},
    "ultrafast zerolatency CRF 23, 1 thread": {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "crf": "23",
        "threads": "1",
    },
    "ultrafast zerolatency CRF 23, 4 slices": {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "crf": "23",
        "x264-params": "slices=4",
    },
    "ultrafast zerolatency CRF 23, CABAC": {
        "preset": "ultrafast",
        "tune": "zerolatency",
        "crf": "23",
        "x264-params": "cabac=1",
    },
    "ultrafast CRF 23, frame threads": {"preset": "ultrafast", "crf": "23", "threads": "2"},
}


def add_arguments(ap) -> None:
    ap.add_argument("--loops", default="24,100,250", help="loop lengths in frames")
    ap.add_argument("--sizes", default="1080x1920", help="WxH, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0, help="speech per render")
    ap.add_argument(
        "--bank-seconds",
        type=float,
        default=10.0,
        help="talking footage the persona's mouth bank is built from (0: no bank)",
    )
    ap.add_argument("--requests", type=int, default=3, help="preview streams over HTTP")
    ap.add_argument(
        "--ceiling-frames", type=int, default=100, help="frames the encoder-only ceiling encodes"
    )


def cpu_process() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    m = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return 10 * np.log10(255.0**2 / max(m, 1e-10))


def noisy_loop(path: Path, n: int, size: tuple[int, int]) -> Path:
    """The generated loop with sensor-like noise (sigma 1.5): a camera's frames cost
    the encoder more bits than the clean render does."""
    from pipeline.render.encode import Mp4Writer

    rng = np.random.default_rng(0)
    clean = path.with_suffix(".clean.mp4")
    write_loop_video(clean, n_frames=n, size=size)
    import av

    with av.open(str(clean)) as c, Mp4Writer(path, *size, 25.0, profile="export") as w:
        for f in c.decode(video=0):
            rgb = f.to_ndarray(format="rgb24").astype(np.int16)
            rgb += rng.normal(0, 1.5, rgb.shape).astype(np.int16)
            w.write(np.clip(rgb, 0, 255).astype(np.uint8))
    clean.unlink()
    return path


def speech_clip(tmp: Path, size: tuple[int, int], seconds: float) -> Path:
    """Talking footage of the loop's presenter (its frames over generated speech): what
    the persona's mouth bank is built from."""
    from pipeline.render.encode import Mp4Writer

    path = tmp / f"speech-{size[0]}x{size[1]}.mp4"
    if not path.exists():
        audio = make_speech_audio(seconds, 48000, seed=7)
        with Mp4Writer(path, size[0], size[1], 25.0, audio=audio, sample_rate=48000) as w:
            for frame in iter_loop_frames(int(seconds * 25), size, seed=3):
                w.write(frame)
    return path


def render(assets, wav: Path, out: Path, profile: str, stream: bool) -> dict:
    """One render in this process: wall, CPU, the report's stage split, first fragment."""
    from pipeline.mouth.visemes import forget
    from pipeline.render.video import render_video

    first: list[float] = []

    def sink(kind: str, data: bytes) -> None:
        if kind == "fragment" and not first:
            first.append(time.perf_counter())

    forget()  # each render hears its speech afresh, as a user's first render does
    c0, w0 = cpu_process(), time.perf_counter()
    rep = render_video(assets, wav, out, sink=sink if stream else None, profile=profile)
    wall, cpu = time.perf_counter() - w0, cpu_process() - c0
    return {
        "frames": rep.frames,
        "wall": wall,
        "cpu": cpu,
        "audio": rep.audio_seconds,
        "timings": rep.timings,
        "first": (first[0] - w0) if first else None,
        "mbit": out.stat().st_size * 8 / rep.audio_seconds / 1e6,
    }


def encoder_input(assets, wav: Path, n: int) -> list:
    """The first n frames the render hands x264 (I420 av.VideoFrames), made as it makes
    them: stored frames decoded, the mouth composed in (render/compose.py)."""
    from pipeline.frames import ScheduledFrames, yuv_loader
    from pipeline.render.audio import load_audio, n_video_frames
    from pipeline.render.compose import compose
    from pipeline.render.renderers.warp import WarpRenderer
    from pipeline.render.schedule import schedule
    from pipeline.yuv import copy_frame

    r = WarpRenderer()
    audio = load_audio(wav, r.sample_rate)
    total = n_video_frames(audio.size / r.sample_rate, 25.0)
    r.prepare(assets, audio, r.sample_rate, total, 25.0)
    idxs = schedule(min(n, total), assets.n_frames, "pingpong")
    w, h = assets.width - assets.width % 2, assets.height - assets.height % 2
    out = []
    for t, i, frame, owned in ScheduledFrames(yuv_loader(assets.load_frame), idxs):
        made = compose(r, [t], [i], [frame], w, h, [owned])[0]
        out.append(made if owned or made is not frame else copy_frame(made, w, h))
    return out


def encode_alone(frames: list, options: dict, keys=None) -> dict:
    """x264 on `frames` and nothing else: wall and CPU ms per frame (all threads), the
    bitrate at 25 fps, and the decoded pictures (flat I420 arrays)."""
    import av
    from av.video.frame import PictureType

    from pipeline.yuv import planes

    cc = av.CodecContext.create("libx264", "w")
    cc.width, cc.height, cc.pix_fmt = frames[0].width, frames[0].height, "yuv420p"
    cc.time_base, cc.framerate = Fraction(1, 25), Fraction(25)
    cc.options = options
    keys = set(keys if keys is not None else range(0, len(frames), 12))
    packets = []
    c0, w0 = cpu_process(), time.perf_counter()
    for t, f in enumerate(frames):
        f.pts = t
        f.pict_type = PictureType.I if t in keys else PictureType.NONE
        packets += [bytes(p) for p in cc.encode(f)]
    packets += [bytes(p) for p in cc.encode(None)]
    wall, cpu = time.perf_counter() - w0, cpu_process() - c0
    dec = av.CodecContext.create("h264", "r")
    pictures = []
    for p in [*packets, None]:
        for g in dec.decode(av.Packet(p) if p is not None else None):
            pictures.append(np.concatenate([np.asarray(x).reshape(-1) for x in planes(g)]))
    return {
        "wall_ms": wall / len(frames) * 1e3,
        "cpu_ms": cpu / len(frames) * 1e3,
        "mbit": sum(map(len, packets)) * 8 * 25 / len(frames) / 1e6,
        "pictures": pictures,
    }


def flat(frames: list) -> list[np.ndarray]:
    from pipeline.yuv import planes

    return [np.concatenate([np.asarray(x).reshape(-1) for x in planes(f)]) for f in frames]


def ceiling(frames: list, profile: str) -> dict:
    """The profile's encoder alone on the render's frames, its keyframes where the
    writer puts them."""
    import itertools

    from pipeline.render.profiles import get_profile

    p = get_profile(profile)
    keys = list(itertools.takewhile(lambda t: t < len(frames), p.keyframes(25.0)))
    encode_alone(frames[:8], p.x264_options(25.0), keys)  # x264's first-call costs
    return encode_alone(frames, p.x264_options(25.0), keys)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_streams(root: Path, cache: Path, wav: Path, profiles: list[str]) -> list[dict]:
    """`hotplate serve` on loopback (1 worker, warm: the first request right after
    /readyz): per POST /v1/lip-sync/stream (one per entry of `profiles`), seconds to the
    first moof received and to the end of the response."""
    import httpx

    port = free_port()
    data = root / f"serve-data-{port}"
    cmd = invocation(root / "personas", cache, "serve", "--port", str(port), "--workers", "1")
    cmd += ["--data", str(data), "--max-audio-seconds", "600"]
    log = open(root / f"serve-{port}.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start: see {log.name}")
            try:
                if httpx.get(url + "/readyz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        out = []
        with httpx.Client(base_url=url, timeout=600) as client:
            for profile in profiles:
                with open(wav, "rb") as f:
                    start, first, buf, size = time.perf_counter(), None, b"", 0
                    form = {"persona": "astro", "attire": "studio", "profile": profile}
                    files = {"audio": ("speech.wav", f, "audio/wav")}
                    with client.stream("POST", "/v1/lip-sync/stream", data=form, files=files) as r:
                        r.raise_for_status()
                        for chunk in r.iter_raw():
                            size += len(chunk)
                            if first is None:
                                buf += chunk
                                if b"moof" in buf:
                                    first = time.perf_counter() - start
                    out.append(
                        {"first": first, "total": time.perf_counter() - start, "bytes": size}
                    )
        return out
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def stage_split(bench: Bench, label: str, res: dict, inputs: dict) -> None:
    """One render's stage split, ms per output frame, each against the render's wall
    time per frame."""
    per_frame = res["wall"] / res["frames"] * 1e3
    for stage in STAGES:
        bench.figure(
            f"{label}: {stage}, ms per frame on its thread",
            res["timings"].get(stage, 0.0) / res["frames"] * 1e3,
            "ms",
            baseline="the render's wall time per frame",
            baseline_value=per_frame,
            better="lower",
            inputs=inputs,
        )


def main(bench: Bench) -> None:
    args = bench.args
    loops = [int(v) for v in args.loops.split(",")]
    sizes = args.sizes.split(",")
    seconds, bank_seconds = args.seconds, args.bank_seconds
    print(f"load average at the start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="hot-path-") as tmp:
        tmp = Path(tmp)
        audio = make_speech_audio(seconds, 48000)
        wav = write_wav(tmp / "speech.wav", audio, 48000)
        from pipeline.precompile.recipe import Recipe, for_speech
        from pipeline.precompile.run import precompile
        from pipeline.render.video import warm_up

        warm_up()  # what a render worker does before its first job
        for size_text in sizes:
            w, h = (int(v) for v in size_text.split("x"))
            cache = tmp / f"cache-{size_text}"
            store = open_store(cache)
            bank = speech = None
            cue = ""
            if bank_seconds:  # one persona, one bank, for every loop length
                speech = speech_clip(tmp, (w, h), bank_seconds)
                bank = precompile(speech, for_speech(Recipe()), store, bank=True).avatar
                from pipeline.hot import load_bank

                got = load_bank(store, bank)
                cue = f" (drive {got.drive_cue} x {got.drive_share:.2f})"
                print(f"the bank's drive:{cue}; (phones are heard only for a phones share)")
            for n in loops:
                inputs = {
                    "loop_frames": n,
                    "resolution": size_text,
                    "audio_seconds": seconds,
                    "renderer": f"warp, a mouth bank of {bank_seconds:g} s{cue}"
                    if bank_seconds
                    else "warp",
                    "recipe": "default",
                }
                video = noisy_loop(tmp / f"loop-{size_text}-{n}.mp4", n, (w, h))
                key = precompile(video, Recipe(), store).avatar
                assets = load_assets(store, key)
                runs = {}
                if bank is not None:  # the procedural mouth too: it hears the phones
                    runs["export file, no bank"] = render(
                        assets, wav, tmp / "b.mp4", "export", False
                    )
                    assets.bank = load_bank(store, bank)
                runs |= {
                    "export file": render(assets, wav, tmp / "export.mp4", "export", False),
                    "preview file": render(assets, wav, tmp / "preview.mp4", "preview", False),
                    "preview stream": render(assets, wav, tmp / "stream.mp4", "preview", True),
                }
                frames = encoder_input(assets, wav, 16 if bench.quick else args.ceiling_frames)
                tops = {p: ceiling(frames, p) for p in ("export", "preview")}
                base = runs["export file"]
                for label, res in runs.items():
                    profile = label.split()[0]
                    fps = res["frames"] / res["wall"]
                    top = 1e3 / tops[profile]["wall_ms"]
                    bench.figure(
                        f"{label}: fps",
                        fps,
                        "frames/s",
                        baseline="the export file",
                        baseline_value=base["frames"] / base["wall"],
                        inputs=inputs,
                        note=f"real time x{res['audio'] / res['wall']:.2f}, "
                        f"{res['cpu'] / res['frames'] * 1e3:.1f} CPU ms/frame, "
                        f"{res['mbit']:.2f} Mbit/s",
                    )
                    bench.figure(
                        f"{label}: share of the encoder-only ceiling ({profile}'s x264 alone)",
                        100 * fps / top,
                        "%",
                        inputs=inputs,
                        note=f"ceiling {top:.0f} frames/s",
                    )
                    stage_split(bench, label, res, inputs)
                    if res["first"] is not None:
                        bench.figure(
                            f"{label}: first fragment, in process",
                            res["first"],
                            "s",
                            baseline="the render's whole time",
                            baseline_value=res["wall"],
                            better="lower",
                            inputs=inputs,
                        )
                for profile, top in tops.items():
                    bench.figure(
                        f"encoder-only ceiling, {profile} profile",
                        1e3 / top["wall_ms"],
                        "frames/s",
                        inputs=inputs,
                        note=f"{top['cpu_ms']:.1f} CPU ms/frame, {len(frames)} frames",
                    )
                if size_text == sizes[0] and n == max(loops):
                    encoder_table(bench, frames, tops, inputs)
                    personas = tmp / "personas" / "astro"
                    shutil.rmtree(tmp / "personas", ignore_errors=True)
                    personas.mkdir(parents=True)
                    os.link(video, personas / "studio.mp4")
                    if speech is not None:  # the server renders with the persona's bank
                        os.link(speech, personas / "speech.mp4")
                    k = 1 if bench.quick else args.requests
                    got = http_streams(tmp, cache, wav, ["preview"] * k + ["export"])
                    export_wall = runs["export file"]["wall"]
                    for j, res in enumerate(got):
                        profile = "preview" if j < k else "export"
                        bench.figure(
                            f"HTTP stream ({profile}), request {j + 1} after start: whole response",
                            res["total"],
                            "s",
                            baseline="the export file in process",
                            baseline_value=export_wall,
                            better="lower",
                            inputs=inputs,
                            note=f"real time x{seconds / res['total']:.2f}, "
                            f"{res['bytes'] * 8 / seconds / 1e6:.2f} Mbit/s",
                        )
                        bench.figure(
                            f"HTTP stream ({profile}), request {j + 1} after start: first "
                            "fragment (goal <= 0.3 s)",
                            res["first"],
                            "s",
                            baseline="the whole response",
                            baseline_value=res["total"],
                            better="lower",
                            inputs=inputs,
                        )
            forget_store(cache)
    print(f"load average at the end: {os.getloadavg()}")


def encoder_table(bench: Bench, frames: list, tops: dict, inputs: dict) -> None:
    """x264 settings on the render's frames: ms, Mbit/s, PSNR against the frames and
    against the export's pictures."""
    src = flat(frames)
    export = tops["export"]["pictures"]
    for name, options in CANDIDATES.items():
        got = encode_alone(frames, options)
        vs_src = float(np.mean([psnr(a, b) for a, b in zip(got["pictures"], src, strict=True)]))
        vs_exp = float(np.mean([psnr(a, b) for a, b in zip(got["pictures"], export, strict=True)]))
        bench.figure(
            f"x264 {name}: CPU per frame",
            got["cpu_ms"],
            "ms",
            better="lower",
            inputs=inputs,
            note=f"wall {got['wall_ms']:.1f} ms, {got['mbit']:.2f} Mbit/s, PSNR vs the "
            f"frames {vs_src:.2f} dB, vs the export {vs_exp:.2f} dB; keyframe every 12",
        )
    preview = tops["preview"]["pictures"]
    bench.figure(
        "preview profile: PSNR against the export's pictures (goal >= 34 dB)",
        float(np.mean([psnr(a, b) for a, b in zip(preview, export, strict=True)])),
        "dB",
        inputs=inputs,
        note=f"min {min(psnr(a, b) for a, b in zip(preview, export, strict=True)):.2f} dB",
    )
    bench.figure(
        "preview profile: bitrate (goal <= 10 Mbit/s)",
        tops["preview"]["mbit"],
        "Mbit/s",
        baseline="the export profile",
        baseline_value=tops["export"]["mbit"],
        better="lower",
        inputs=inputs,
    )


if __name__ == "__main__":
    quick = {
        "loops": "24",
        "sizes": "540x960",
        "seconds": 2.0,
        "bank_seconds": 1.2,
        "requests": 1,
    }
    run_bench(main, __doc__, add_arguments, quick=quick)

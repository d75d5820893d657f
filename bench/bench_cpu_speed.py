"""Neural stages on this CPU: which runtime is fastest and keeps the numbers.

    .venv/bin/python bench/bench_cpu_speed.py [--crops 1] [--frames 1] [--skip compile,bf16]
        [--only latents,musetalk,s3fd,bisenet] [--all]

Side by side in one run, random-init weights of the real architectures (speed does not
depend on the weights), each network under every runtime of `pipeline.nets.cpu_speed`:

1. latents: the SD-VAE encoder (sd-vae-ft-mse config) on 256x256 crops. Baseline: today's
   `encode_latents` (float32, batch 8). Kept when the latents are within 2e-2 relative
   error of the float32 reference AND their decoded crop within 2/255 mean absolute error.
2. musetalk per frame: the UNet (upstream musetalk.json: SD-1.x UNet, 8 in, 4 out,
   cross-attention 384) + VAE decode of its output. Baseline: the renderer's eager float32
   path. Kept under the same two bounds (UNet output, decoded face).
3. S3FD on the 480-px detection proxy and 4. BiSeNet at 512x512: kept within 2e-2 relative
   error of the raw outputs.

Records items/s and the ratio to the named baseline (wall clock), CPU seconds per item and
their ratio (all threads; less disturbed by other load on a shared machine, though
spinning thread pools count too), the one-off preparation time (export, conversion,
compilation; OpenVINO's conversions are read back from its disk cache after the first run),
the errors, and which runtime wins. Asserts nothing about speed. A runtime that is not
installed, or fails on a network, stops the bench in one line (`--skip` leaves it out).
The machine may be shared: both sides of every ratio ran in this one process, one after
the other. `--vae-width`, `--unet-width` and `--unet-layers` narrow the VAE and the UNet
(the same architectures), `--proxy` and `--parse-size` shrink S3FD's and BiSeNet's inputs:
--quick does, so that every runtime converts and runs them in seconds.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness import Bench, run_bench

from pipeline.nets.cpu_speed import (
    CHOSEN,
    RUNTIME_ENV,
    RUNTIMES,
    cpu_runner,
    runtime_available,
    unet_module,
)
from pipeline.nets.vae import decoder_module, latent_mode_module

LATENT_TOL = 2e-2  # relative error of latents / network outputs
PIXEL_TOL = 2.0  # mean absolute error of decoded crops, in 1/255 steps

SD_VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    block_out_channels=(128, 256, 512, 512),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2,
    sample_size=256,
)
# upstream MuseTalk's models/musetalk/musetalk.json (the SD-1.x UNet, 8 -> 4, audio context 384)
MUSETALK_UNET = dict(
    sample_size=64,
    in_channels=8,
    out_channels=4,
    block_out_channels=(320, 640, 1280, 1280),
    layers_per_block=2,
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    cross_attention_dim=384,
    attention_head_dim=8,
    norm_num_groups=32,
    flip_sin_to_cos=True,
    freq_shift=0,
)


def cpu_flags() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].split()
    except (OSError, IndexError):
        return "unknown"
    have = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return " ".join(have) or "none of avx2/avx512/amx"


def rel_err(out: Any, ref: Any) -> float:
    import torch

    outs = out if isinstance(out, list) else [out]
    refs = ref if isinstance(ref, list) else [ref]
    num = sum(float((o.float() - r.float()).norm() ** 2) for o, r in zip(outs, refs, strict=True))
    den = sum(float(r.float().norm() ** 2) for r in refs)
    return float(np.sqrt(num / max(den, 1e-30))) if torch.is_tensor(refs[0]) else float("nan")


_last_cpu = [0.0]  # CPU seconds (all threads) of the last timed() call


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(result, wall seconds); the CPU seconds go to _last_cpu, for Table.row."""
    cpu = time.process_time()
    start = time.perf_counter()
    out = fn()
    _last_cpu[0] = time.process_time() - cpu
    return out, time.perf_counter() - start


class Table:
    """One section: the baseline's speed, then each runtime's line (and figure) and the
    winner."""

    def __init__(
        self, bench: Bench, title: str, unit: str, n: int, baseline: str, inputs: dict
    ) -> None:
        self.bench, self.inputs = bench, inputs
        self.title, self.unit, self.n, self.baseline = title, unit, n, baseline
        self.base_rate = 0.0
        self.best: tuple[float, str] = (0.0, "")
        print(f"\n{title}")
        print(
            f"   {'runtime':18} {unit + '/s':>9} {'vs ' + baseline:>18} {'CPU s each':>10} "
            f"{'CPU ratio':>9}  prep s  accuracy"
        )
        self.base_cpu = 0.0

    def row(self, name: str, seconds: float, prep: float, ok: bool, note: str) -> None:
        rate, cpu = self.n / seconds, _last_cpu[0] / self.n
        if not self.base_rate:
            self.base_rate, self.base_cpu = rate, cpu
        verdict = "kept" if ok else "REJECTED"
        print(
            f"   {name:18} {rate:9.3f} {rate / self.base_rate:17.2f}x {cpu:10.2f} "
            f"{self.base_cpu / cpu:8.2f}x {prep:7.1f}  {note}  {verdict}",
            flush=True,
        )
        if ok and rate > self.best[0]:
            self.best = (rate, name)
        if rate != self.base_rate or cpu != self.base_cpu:  # not the baseline's own row
            self.bench.figure(
                f"{self.title.split(':')[0]}: {name}",
                rate,
                f"{self.unit}/s",
                baseline=self.baseline,
                baseline_value=self.base_rate,
                inputs=self.inputs,
                note=f"{self.base_cpu / cpu:.2f}x by CPU time; prep {prep:.1f} s; {note}; "
                f"{verdict}",
            )

    def skipped(self, name: str, why: str) -> None:
        print(f"   {name:18} skipped: {why}", flush=True)

    def cannot(self, name: str, why: str) -> None:
        """A runtime that cannot be measured: one line, exit 2 (never a silent skip)."""
        self.bench.missing(f"{self.title.split(':')[0]}: {name} {why}; --skip {name} leaves it out")

    def done(self, chosen: str) -> None:
        rate, name = self.best
        print(
            f"   fastest within bounds: {name}, {rate / self.base_rate:.2f}x {self.baseline}; "
            f"pipeline uses: {chosen}"
        )


def each_runtime(
    table: Table,
    skip: set[str],
    module: Any,
    example: tuple,
    run: Callable[[Callable[..., Any]], Any],
    check: Callable[[Any], tuple[bool, str]],
) -> None:
    """Time `run(runner)` under every runtime and check its output."""
    for runtime in RUNTIMES:
        if runtime in skip:
            table.skipped(runtime, "skipped (--skip, or see the note above)")
            continue
        if not runtime_available(runtime):
            table.cannot(runtime, "is not installed (pip install -e .)")
        try:
            runner, prep = timed(lambda r=runtime: cpu_runner(module, example, r))
            warm, warm_s = timed(lambda r=runner: run(r))  # first call compiles, for some
            out, seconds = timed(lambda r=runner: run(r))
        except Exception as e:  # a runtime that cannot take this network: say which, stop
            table.cannot(runtime, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
        ok, note = check(out)
        table.row(runtime, seconds, prep + max(0.0, warm_s - seconds), ok, note)


# -- 1. latents -------------------------------------------------------------------------------


def to_uint8(img: Any) -> np.ndarray:
    import torch

    x = ((img.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)
    return x.permute(0, 2, 3, 1).numpy()


def face_crops(n: int) -> np.ndarray:
    """n 256x256 crops of skimage's astronaut, shifted a few pixels each."""
    import cv2
    from skimage import data

    img = data.astronaut()
    out = []
    for i in range(n):
        y, x = 20 + 3 * i, 150 + 2 * i
        out.append(cv2.resize(img[y : y + 220, x : x + 220], (256, 256)))
    return np.stack(out)


def bench_latents(bench: Bench, vae: Any, n_crops: int, skip: set[str]) -> None:
    import torch

    from pipeline.nets.vae import encode_latents

    crops = face_crops(n_crops)
    decoder = decoder_module(vae)
    scale = float(vae.config.scaling_factor)
    os.environ[RUNTIME_ENV] = "eager"  # today's path, whatever cpu_speed chooses
    try:
        encode_latents(vae, crops, batch=8)  # warm-up: first calls allocate and pick kernels
        ref, seconds = timed(lambda: encode_latents(vae, crops, batch=8))
    finally:
        os.environ.pop(RUNTIME_ENV, None)
    ref_t = torch.from_numpy(ref.astype(np.float32))
    with torch.inference_mode():
        ref_img = to_uint8(decoder(ref_t[:, 4:] / scale))
    table = Table(
        bench,
        f"1. latents, SD-VAE encoder: {n_crops} crops of 256x256 (2 encodes each: masked, full)",
        "crops",
        n_crops,
        "today's encode_latents, eager float32, batch 8",
        {"crops": n_crops, "resolution": "256x256", "vae_width": bench.args.vae_width},
    )
    table.row("today (batch 8)", seconds, 0.0, True, "reference")

    x = torch.from_numpy(crops).permute(0, 3, 1, 2).float() / 255.0
    masked = x.clone()
    masked[:, :, 128:] = 0
    both = torch.cat([masked, x]) * 2 - 1
    encoder = latent_mode_module(vae)

    def check(lat: Any) -> tuple[bool, str]:
        lat = torch.cat(lat.float().chunk(2), dim=1) * scale
        err = rel_err(lat, ref_t)
        with torch.inference_mode():
            mae = float(np.abs(to_uint8(decoder(lat[:, 4:] / scale)).astype(int) - ref_img).mean())
        return (
            err <= LATENT_TOL and mae <= PIXEL_TOL,
            f"rel err {err:.1e}, decoded MAE {mae:.2f}/255",
        )

    for batch in (2, 4):
        if batch < len(both):

            def run_batches(b: int = batch) -> Any:
                with torch.inference_mode():
                    return torch.cat([encoder(both[i : i + b]) for i in range(0, len(both), b)])

            out, seconds = timed(run_batches)
            ok, note = check(out)
            table.row(f"eager, batch {batch}", seconds, 0.0, ok, note)
    each_runtime(table, skip, encoder, (both[:2],), lambda r: r(both), check)
    table.done(CHOSEN["vae_encoder"])


# -- 2. musetalk UNet + decode ----------------------------------------------------------------


def bench_musetalk(bench: Bench, vae: Any, n_frames: int, skip: set[str]) -> None:
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(1)
    w = bench.args.unet_width
    config = {**MUSETALK_UNET, "block_out_channels": (w, 2 * w, 4 * w, 4 * w)}
    unet = UNet2DConditionModel(**{**config, "layers_per_block": bench.args.unet_layers}).eval()

    net, decoder = unet_module(unet), decoder_module(vae)
    scale = float(vae.config.scaling_factor)
    g = torch.Generator().manual_seed(2)
    lat = torch.randn(n_frames, 8, 32, 32, generator=g)
    ctx = torch.randn(n_frames, 50, 384, generator=g)
    t0 = torch.zeros(1, dtype=torch.long)

    def eager() -> tuple[Any, Any]:
        with torch.inference_mode():
            pred = net(lat, t0, ctx)
            return pred, decoder(pred / scale)

    eager()  # warm-up
    (ref_pred, ref_img), seconds = timed(eager)
    ref_u8 = to_uint8(ref_img)
    table = Table(
        bench,
        f"2. musetalk per frame, UNet (musetalk.json) + VAE decode: batch of {n_frames}",
        "frames",
        n_frames,
        "the renderer's eager float32",
        {
            "frames": n_frames,
            "renderer": "musetalk",
            "unet_width": w,
            "unet_layers": bench.args.unet_layers,
            "vae_width": bench.args.vae_width,
        },
    )
    table.row("today (eager)", seconds, 0.0, True, "reference")
    for runtime in RUNTIMES:
        if runtime in skip:
            table.skipped(runtime, "skipped (--skip, or see the note above)")
            continue
        if not runtime_available(runtime):
            table.cannot(runtime, "is not installed (pip install -e .)")
        try:
            (u, d), prep = timed(
                lambda r=runtime: (
                    cpu_runner(net, (lat[:1], t0, ctx[:1]), r),
                    cpu_runner(decoder, (lat[:1, :4],), r),
                )
            )

            def run(u: Any = u, d: Any = d) -> tuple[Any, Any]:
                pred = u(lat, t0, ctx)
                return pred, d(pred.float() / scale)

            _, warm_s = timed(run)
            (pred, img), seconds = timed(run)
        except Exception as e:
            table.cannot(runtime, f"failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}")
        err = rel_err(pred, ref_pred)
        mae = float(np.abs(to_uint8(img).astype(int) - ref_u8).mean())
        ok = err <= LATENT_TOL and mae <= PIXEL_TOL
        table.row(
            runtime,
            seconds,
            prep + max(0.0, warm_s - seconds),
            ok,
            f"UNet rel err {err:.1e}, decoded MAE {mae:.2f}/255",
        )
    table.done(f"{CHOSEN['unet']} (UNet), {CHOSEN['vae_decoder']} (decode)")


# -- 3. S3FD, 4. BiSeNet ----------------------------------------------------------------------


def bench_plain(
    bench: Bench, title: str, key: str, module: Any, x: Any, n: int, unit: str, skip: set[str]
) -> None:
    import torch

    with torch.inference_mode():
        module(x)  # warm-up
        ref, seconds = timed(lambda: module(x))
    ref = list(ref) if isinstance(ref, list | tuple) else ref
    size = "x".join(str(v) for v in x.shape[:1:-1])
    table = Table(bench, title, unit, n, "eager float32", {"images": n, "resolution": size})
    table.row("today (eager)", seconds, 0.0, True, "reference")

    def check(out: Any) -> tuple[bool, str]:
        err = rel_err(out, ref)
        return err <= LATENT_TOL, f"rel err {err:.1e}"

    each_runtime(table, skip, module, (x[:1],), lambda r: r(x), check)
    table.done(CHOSEN[key])


def add_arguments(ap) -> None:
    ap.add_argument("--crops", type=int, default=1, help="crops for the latents stage")
    ap.add_argument("--frames", type=int, default=1, help="frames for the musetalk render")
    ap.add_argument("--images", type=int, default=1, help="images for S3FD and BiSeNet")
    ap.add_argument(
        "--all",
        action="store_true",
        help="bf16 and torch.compile on the big nets too (by default only where the CPU has "
        "bf16 hardware: emulated bf16 and compiling take many minutes on a small CPU)",
    )
    ap.add_argument(
        "--skip", default="", help=f"runtimes to leave out, comma-separated ({','.join(RUNTIMES)})"
    )
    ap.add_argument("--only", default="", help="sections to run: latents,musetalk,s3fd,bisenet")
    ap.add_argument("--vae-width", type=int, default=128, help="SD-VAE first block (128: real)")
    ap.add_argument("--unet-width", type=int, default=320, help="UNet first block (320: real)")
    ap.add_argument("--unet-layers", type=int, default=2, help="UNet layers per block (2: real)")
    ap.add_argument("--proxy", type=int, default=480, help="S3FD's proxy width (480: real)")
    ap.add_argument("--parse-size", type=int, default=512, help="BiSeNet's input (512: real)")


def main(bench: Bench) -> None:
    args = bench.args
    warnings.filterwarnings("ignore")
    skip = {s for s in args.skip.split(",") if s}
    only = {s for s in args.only.split(",") if s} or {"latents", "musetalk", "s3fd", "bisenet"}

    import torch
    from diffusers import AutoencoderKL

    print(
        f"cpu: {os.cpu_count()} cores ({cpu_flags()}), torch {torch.__version__} "
        f"with {torch.get_num_threads()} threads"
    )
    big_skip = set(skip)
    if "avx512_bf16" not in cpu_flags() and "amx_bf16" not in cpu_flags():
        print("note: no AVX512-BF16/AMX here: bf16 is emulated, so expect it to be slow")
        if not args.all:
            big_skip |= {"bf16", "compile"}
            print(
                "      bf16 and torch.compile measured on S3FD and BiSeNet only (--all for the "
                "VAE and UNet)"
            )
    torch.manual_seed(0)
    w0 = args.vae_width
    vae_config = {**SD_VAE, "block_out_channels": (w0, 2 * w0, 4 * w0, 4 * w0)}
    if w0 % 32:  # GroupNorm's 32 groups need channels that divide by them
        vae_config["norm_num_groups"] = w0 // 2
    vae = AutoencoderKL(**vae_config).eval()
    if "latents" in only:
        bench_latents(bench, vae, args.crops, big_skip)
    if "musetalk" in only:
        bench_musetalk(bench, vae, args.frames, big_skip)
    if "s3fd" in only:
        from face_alignment.detection.sfd.net_s3fd import s3fd

        torch.manual_seed(3)
        pw = args.proxy
        x = torch.rand(args.images, 3, pw * 9 // 16, pw) * 255 - 117
        bench_plain(
            bench,
            f"3. S3FD: {args.images} detection proxies of {pw}x{pw * 9 // 16}",
            "s3fd",
            s3fd().eval(),
            x,
            args.images,
            "images",
            skip,
        )
    if "bisenet" in only:
        from pipeline.nets.bisenet import build_bisenet

        torch.manual_seed(4)
        net = build_bisenet().eval()
        x = torch.randn(args.images, 3, args.parse_size, args.parse_size)
        bench_plain(
            bench,
            f"4. BiSeNet: {args.images} images of {args.parse_size}x{args.parse_size}",
            "bisenet",
            net,
            x,
            args.images,
            "images",
            skip,
        )


if __name__ == "__main__":
    # --quick leaves torch.compile out: inductor takes minutes a network on 2 cores
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={
            "vae_width": 16,
            "unet_width": 32,
            "unet_layers": 1,
            "proxy": 128,  # S3FD's six heads still each see a cell (128x72)
            "parse_size": 128,
            "skip": "compile",
        },
    )

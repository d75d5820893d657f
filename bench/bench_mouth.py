"""The warp renderer's mouth: where it opens, how it moves, the bank, and what it costs.

    .venv/bin/python bench/bench_mouth.py [--quick] [--json FILE] [--sheets DIR]

The baseline is the renderer this change replaced, run in the same process: the warp
renderer of commit BASELINE (its file read from git, on the landmarks it ran with then,
68 points fitted to RetinaFace's five). Everything is judged by the referee (dlib's 68
points, testkit/referee.py), never by the project's own landmarks.

1. Placement, per test face (testkit/faces.py, upright): the open mouth found in the image
   (dark, made darker, or between the referee's inner lips), its centroid's offset from
   the referee's inner-lip line and its share inside the outer lips, in mouth widths, on
   the frames where the mouth is open; and a sheet per face (`--sheets`, PNG): 2x mouth
   crops of the source, the old renderer and the new at the same frames.
2. Sync: the referee's lip gap on a rendered still against the speech envelope (r).
3. The bank: a talking clip made from a real face (espeak-ng speech, the mouth opened by
   a known warp: no talking clip with its own audio ships in a package) rendered from
   its own bank with its own audio: r of the referee's gap against the clip's; the
   procedural mouth on the same clip as the baseline; a sheet of both.
4. Speed: hot, streamed, 1080x1920, a LOOP-frame loop, 20 s of speech, with the bank in
   use, against the old renderer and the procedural mouth; the mouth alone per frame,
   also against the interior before issue 31 (INTERIOR_BASELINE); and the bank's
   precompile of a 30 s clip against the loop's own precompile.
5. The interior sheet (`--sheet`, docs/mouth_sheet.png; `--sheet-only` writes it
   alone): real talking clips (`--footage`, testkit/footage/, their own sound), each
   one's held-out frames beside the same presenter's still rendered with the bank of
   the clip's first 60 % and without a bank; then the test faces' stills at three
   openings of the procedural mouth. Every crop 2x, a mouth CELL_MOUTH px wide at 1x.

The machine's load is printed with each speed figure (the shared machine is contended).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np
from harness import ROOT, Bench, run_bench  # first: it puts the checkout on sys.path

from cachestore.store import forget_store, open_store
from pipeline.precompile.recipe import Recipe

BASELINE = "a9ed232"  # main before issue 23: the flat-fill warp renderer
INTERIOR_BASELINE = "ffe3c67"  # main before issue 31's interior (item 4)
OLD_LANDMARKS = "retinaface"  # what it ran on
SR = 48000
FPS = 25.0
LOOP = 250  # frames of the speed loop (always stated)
ROUNDS = 3  # turns each renderer's mouth cost is timed in


def add_arguments(ap) -> None:
    ap.add_argument("--sheets", type=Path, default=ROOT / "bench" / "out" / "mouth")
    ap.add_argument("--clip-seconds", type=float, default=30.0, help="bank precompile clip")
    ap.add_argument(
        "--sheet",
        type=Path,
        default=None,
        help="the interior sheet (default docs/mouth_sheet.png; under --quick, in --sheets)",
    )
    ap.add_argument(
        "--footage",
        type=Path,
        default=ROOT / "testkit" / "footage",
        help="real talking clips (NAME.mp4 with their own sound) for the sheet's bank rows",
    )
    ap.add_argument("--sheet-only", action="store_true", help="only write the interior sheet")


def load(bench: Bench) -> float:
    """The 1-minute load average (2 cores here): said beside every speed figure."""
    return os.getloadavg()[0]


def old_renderer(bench: Bench):
    """The warp renderer of BASELINE, from git (its imports still resolve today)."""
    try:
        src = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{BASELINE}:pipeline/render/renderers/warp.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        bench.missing(f"the baseline renderer: git and commit {BASELINE} in the checkout")
    module = types.ModuleType("warp_before_issue23")
    sys.modules[module.__name__] = module
    exec(compile(src, f"{BASELINE}:warp.py", "exec"), module.__dict__)
    return module.WarpRenderer


def old_interior_renderer(bench: Bench):
    """Today's warp renderer with the interior of INTERIOR_BASELINE (interior.py and the
    compositing in warp.py read from git): the per-frame cost before issue 31's item 4."""
    files = {}
    for path in ("pipeline/render/mouth/interior.py", "pipeline/render/renderers/warp.py"):
        try:
            files[path] = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{INTERIOR_BASELINE}:{path}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            bench.missing(f"the interior baseline: git and commit {INTERIOR_BASELINE}")
    interior = types.ModuleType("interior_before_issue31")
    sys.modules[interior.__name__] = interior  # its dataclass looks itself up there
    exec(
        compile(files["pipeline/render/mouth/interior.py"], "interior@base", "exec"),
        interior.__dict__,
    )
    warp = types.ModuleType("warp_before_issue31")
    sys.modules[warp.__name__] = warp
    warp.__dict__.update(Style=interior.Style, paint=interior.paint)
    src = files["pipeline/render/renderers/warp.py"].replace(
        "from pipeline.render.mouth.interior import Style, paint\n", ""
    )
    exec(compile(src, "warp@base", "exec"), warp.__dict__)
    return warp.WarpRenderer


def crop_box(points: np.ndarray, shape) -> tuple[int, int, int, int]:
    w = float(np.linalg.norm(points[54] - points[48]))
    c = points[48:68].mean(0)
    x1, y1 = int(c[0] - 0.9 * w), int(c[1] - 0.6 * w)
    x2, y2 = int(c[0] + 0.9 * w), int(c[1] + 0.9 * w)
    return max(x1, 0), max(y1, 0), min(x2, shape[1]), min(y2, shape[0])


def sheet(path: Path, rows: list[list[np.ndarray]], height: int = 160) -> None:
    """Rows of same-sized crops, each shown at 2x (nearest), written as PNG."""
    import cv2

    out = []
    for row in rows:
        scaled = [cv2.resize(c, None, fx=2, fy=2, interpolation=cv2.INTER_NEAREST) for c in row]
        h = scaled[0].shape[0]
        scaled = [cv2.resize(s, (int(s.shape[1] * h / s.shape[0]), h)) for s in scaled]
        out.append(np.concatenate(scaled, 1))
    width = min(r.shape[1] for r in out)
    img = np.concatenate([r[:, :width] for r in out], 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))


def placement_and_sheets(bench: Bench, faces, fx, Old, New, audio) -> None:
    """1. per face: offset and share, old and new, and the sheet."""
    names = ("astronaut", "grace_hopper") if bench.quick else None
    offsets = {"old": [], "new": []}
    for s in faces.samples(names, ("upright",)):
        centre = (s.truth.min(0) + s.truth.max(0)) / 2
        box = fx.detect_box(s.image, centre)
        made = {}
        for label, cls, lmk in (("old", Old, OLD_LANDMARKS), ("new", New, "facemesh")):
            r = cls()
            r.prepare(fx.still_assets(s.image, lmk, box), audio, SR, 75, FPS)
            made[label] = r
        opened = np.flatnonzero(made["new"].openness() > 0.3)[::2]
        figures = {}
        for label, r in made.items():
            placed = [
                fx.placement(fx.opened(s.image, r.render(int(t), 0, s.image), s.truth), s.truth)
                for t in opened
            ]
            figures[label] = (
                float(np.nanmedian([p[0] for p in placed])),
                float(np.median([p[1] for p in placed])),
            )
            offsets[label].append(figures[label][0])
        face = s.name.split("/")[0]  # the source, and its frame for a clip
        new_off, old_off = abs(figures["new"][0]), abs(figures["old"][0])
        bench.figure(
            f"{face}: opening's offset from the lips",
            figures["new"][0],
            "mouth widths",
            baseline="the old warp renderer (fitted-68)",
            baseline_value=figures["old"][0],
            better="lower",
            ratio=new_off / old_off if old_off > 1e-9 else None,  # of the distances
            inputs={"frames": len(opened), "referee": "dlib 68"},
        )
        bench.figure(
            f"{face}: opening's share between the lips",
            figures["new"][1],
            "share",
            baseline="the old warp renderer (fitted-68)",
            baseline_value=figures["old"][1],
            inputs={"frames": len(opened)},
        )
        frames = (
            [int(opened[len(opened) * k // 4]) for k in (1, 2, 3)]
            if len(opened) >= 4
            else list(opened)
        )
        x1, y1, x2, y2 = crop_box(s.truth, s.image.shape)
        rows = [
            [s.image[y1:y2, x1:x2]]
            + [made[k].render(t, 0, s.image)[y1:y2, x1:x2] for k in ("old", "new")]
            for t in frames
        ]
        sheet(bench.args.sheets / f"{s.name.replace('/', '_').replace('@', '-')}.png", rows)
    bench.figure(
        "median |offset| over the test faces",
        float(np.median(np.abs(offsets["new"]))),
        "mouth widths",
        baseline="the old warp renderer",
        baseline_value=float(np.median(np.abs(offsets["old"]))),
        better="lower",
        inputs={"faces": len(offsets["new"])},
    )


def step(bench: Bench) -> int:
    """The referee reads every step-th frame: 2, or 4 under --quick (dlib's detector on a
    frame was most of a quick run's time in the sync and bank sections)."""
    return 4 if bench.quick else 2


def sync(bench: Bench, faces, fx, Old, New, wav) -> None:
    """2. the referee's gap on a rendered still against the speech envelope."""
    from pipeline.render.audio import load_audio, loudness_envelope
    from pipeline.render.video import render_video

    env = loudness_envelope(load_audio(wav, 16000), 16000, FPS)
    for name in ("grace_hopper",) if bench.quick else ("grace_hopper", "luispedro", "takeo"):
        s = faces.samples((name,), ("upright",))[0]
        box = fx.detect_box(s.image, (s.truth.min(0) + s.truth.max(0)) / 2)
        rs = {}
        with tempfile.TemporaryDirectory() as tmp:
            for label, lmk in (("old", OLD_LANDMARKS), ("new", "facemesh")):
                assets = fx.still_assets(s.image, lmk, box)
                if label == "old":  # the old renderer through the same loop: patch it in
                    from pipeline.render import renderers

                    keep = renderers.load_renderer
                    renderers.load_renderer = lambda *a, **k: Old()
                try:
                    out = render_video(assets, wav, Path(tmp) / f"{label}.mp4").out_path
                finally:
                    if label == "old":
                        renderers.load_renderer = keep
                gaps = fx.referee_gaps(fx.video_frames(out), step(bench))
                rs[label] = fx.correlation(env[:: step(bench)], gaps)
        bench.figure(
            f"{name}: referee's lip gap vs speech envelope (still)",
            rs["new"],
            "r",
            baseline="the old warp renderer",
            baseline_value=rs["old"],
            inputs={"seconds": round(env.size / FPS, 1)},
        )


def bank(bench: Bench, faces, fx, wav, work: Path) -> None:
    """3. a talking clip through its own bank, and its sheet."""
    import cv2

    from pipeline.catalog import persona_bank
    from pipeline.lip_sync import LipSyncRequest, lip_sync
    from pipeline.precompile.run import precompile_source

    root = work / "personas"
    (root / "grace").mkdir(parents=True)
    face = faces.samples(("grace_hopper",), ("upright",))[0].image
    cv2.imwrite(str(root / "grace" / "portrait.png"), cv2.cvtColor(face, cv2.COLOR_RGB2BGR))
    clip = fx.talking_clip(face, wav, root / "grace" / "talk.mp4")
    store = open_store(work / "bank-store")
    recipe = Recipe(max_frames=0)
    try:
        precompile_source(clip, recipe, store)
        if persona_bank(store, root, "grace", recipe) is None:
            bench.missing("a bank from the talking clip (precompile_source made none)")
        source = fx.video_frames(clip)
        with_bank = work / "bank.mp4"
        lip_sync(
            store,
            root,
            recipe,
            LipSyncRequest("grace", "talk", wav, with_bank),
            default_loop="cycle",
        )
        # the procedural mouth on the same clip: the same render with no bank
        from pipeline.catalog import plan_for
        from pipeline.hot import load_assets
        from pipeline.render.video import render_video

        assets = load_assets(store, plan_for(store, clip, recipe).avatar)
        without = render_video(assets, wav, work / "procedural.mp4", loop="cycle").out_path
        out_b, out_p = fx.video_frames(with_bank), fx.video_frames(without)
        n = min(len(source), len(out_b), len(out_p))
        truth = fx.referee_gaps(source[:n], step(bench))
        r_bank = fx.correlation(truth, fx.referee_gaps(out_b[:n], step(bench)))
        r_proc = fx.correlation(truth, fx.referee_gaps(out_p[:n], step(bench)))
        bench.figure(
            "talking clip from its own bank: referee's gap vs the clip's",
            r_bank,
            "r",
            baseline="the procedural mouth on the same clip",
            baseline_value=r_proc,
            inputs={"frames": n, "clip": "grace_hopper + espeak-ng, known warp"},
        )
        from testkit.referee import referee_points

        pts = referee_points(source[0])
        x1, y1, x2, y2 = crop_box(pts, source[0].shape)
        picks = [int(n * k / 5) for k in (1, 2, 3, 4)]
        sheet(
            bench.args.sheets / "bank_grace_hopper.png",
            [
                [source[t][y1:y2, x1:x2], out_p[t][y1:y2, x1:x2], out_b[t][y1:y2, x1:x2]]
                for t in picks
            ],
        )
    finally:
        forget_store(work / "bank-store")


def speed(bench: Bench, fx, Old, work: Path) -> None:
    """4. streamed renders at 1080x1920 with the bank in use; the bank's precompile."""
    from hotplate.demo_data import make_speech_audio, write_loop_video, write_wav
    from pipeline.catalog import bank_plan
    from pipeline.hot import load_assets, load_bank
    from pipeline.precompile.run import precompile
    from pipeline.render import renderers
    from pipeline.render.video import render_video

    frames = 12 if bench.quick else LOOP
    seconds = 1.0 if bench.quick else 20.0
    clip_seconds = bench.args.clip_seconds
    store = open_store(work / "speed-store")
    try:
        loop = write_loop_video(work / "loop.mp4", n_frames=frames, size=(1080, 1920))
        t0 = time.perf_counter()
        avatar = precompile(loop, Recipe(), store).avatar
        loop_seconds = time.perf_counter() - t0
        # a talking clip of the same presenter at the same size, for the bank
        assets = load_assets(store, avatar)
        speech = work / "clip.wav"
        write_wav(speech, make_speech_audio(clip_seconds, 16000, seed=7), 16000)
        still = fx.still_assets(assets.load_frame(0))
        clip = render_video(still, speech, work / "speech.mp4").out_path
        t0 = time.perf_counter()
        report = precompile(clip, Recipe(max_frames=0), store, bank=True)
        bank_seconds = time.perf_counter() - t0
        bench.figure(
            f"bank precompile, {clip_seconds:g} s talking clip 1080x1920",
            bank_seconds,
            "s",
            baseline=f"the loop's own precompile ({frames} frames)",
            baseline_value=loop_seconds,
            better="lower",
            inputs={"clip_frames": report.counts.get("frames"), "load": round(load(bench), 1)},
        )
        assets.bank = load_bank(store, bank_plan(store, clip, Recipe(max_frames=0), "loop").avatar)
        wav = work / "talk.wav"
        write_wav(wav, make_speech_audio(seconds, 48000, seed=3), 48000)
        fps = {}
        for label in ("bank", "procedural", "old"):
            keep = renderers.load_renderer
            if label == "old":
                renderers.load_renderer = lambda *a, **k: Old()
            run_assets = assets if label == "bank" else _without_bank(assets)
            try:
                rep = render_video(
                    run_assets, wav, work / f"{label}.mp4", sink=lambda kind, data: None
                )
            finally:
                renderers.load_renderer = keep
            fps[label] = rep.render_fps
        mouth_cost(bench, assets, Old, wav, frames)
        inputs = {
            "loop_frames": frames,
            "resolution": "1080x1920",
            "audio_seconds": seconds,
            "streamed": True,
            "load": round(load(bench), 1),
        }
        bench.figure(
            "hot streamed render with the bank",
            fps["bank"],
            "frames/s",
            baseline="the old warp renderer",
            baseline_value=fps["old"],
            inputs=inputs,
            note=f"{fps['bank'] / FPS:.2f}x real time at 25 fps",
        )
        bench.figure(
            "hot streamed render, procedural mouth",
            fps["procedural"],
            "frames/s",
            baseline="the old warp renderer",
            baseline_value=fps["old"],
            inputs=inputs,
            note=f"{fps['procedural'] / FPS:.2f}x real time at 25 fps",
        )
    finally:
        forget_store(work / "speed-store")


def mouth_cost(bench: Bench, assets, Old, wav: Path, frames: int) -> None:
    """The mouth alone, per 1080x1920 frame: CPU time of this thread (so other jobs on
    the machine count less than in wall time), the stored frames decoded before; each
    renderer timed ROUNDS times in turn, its least kept (the least disturbed by others)."""
    from pipeline.render.audio import load_audio
    from pipeline.render.renderers.warp import WarpRenderer

    audio = load_audio(wav, SR)
    n = min(frames, 60)
    stored = [assets.load_frame(i) for i in range(n)]
    renderers = {
        "bank": (WarpRenderer(), assets),
        "procedural": (WarpRenderer(), _without_bank(assets)),
        "interior before": (old_interior_renderer(bench)(), _without_bank(assets)),
        "old": (Old(), _without_bank(assets)),
    }
    cost: dict[str, float] = {}
    for renderer, run_assets in renderers.values():
        renderer.prepare(run_assets, audio, SR, n, FPS)
    for _ in range(ROUNDS):
        for label, (renderer, _) in renderers.items():
            start = time.thread_time()
            for t in range(n):  # what the render loop gets: a frame it may write into
                if label == "old":
                    renderer.render(t, t, stored[t])
                else:
                    renderer.render(t, t, stored[t].copy(), inplace=True)
            ms = (time.thread_time() - start) / n * 1000
            cost[label] = min(cost.get(label, ms), ms)
    inputs = {"frames": n, "loop_frames": frames, "load": round(load(bench), 1)}
    for label in ("bank", "procedural"):
        bench.figure(
            f"mouth per 1080x1920 frame, {label}",
            cost[label],
            "ms CPU",
            baseline="the old warp renderer (returns a whole-frame copy)",
            baseline_value=cost["old"],
            better="lower",
            inputs=inputs,
        )
    bench.figure(
        "mouth per 1080x1920 frame, procedural interior",
        cost["procedural"],
        "ms CPU",
        baseline=f"the interior before issue 31 ({INTERIOR_BASELINE})",
        baseline_value=cost["interior before"],
        better="lower",
        inputs=inputs,
    )


def _without_bank(assets):
    import dataclasses

    return dataclasses.replace(assets, bank=None)


# -- the interior sheet: stills with and without a bank, beside real open mouths -------

CELL = (1.7, 1.15)  # a crop's width and height in mouth widths, about the lips' centre
CELL_MOUTH = 80  # px a mouth is wide in a crop at 1x (the test faces' and clips' size)
OPENINGS = (0.35, 0.65, 1.0)  # the procedural mouth's openness on each test face
SHEET_FACES = ("astronaut", "grace_hopper", "luispedro", "takeo", "breakingbad_jesse")
SHEET_CLIPS = ("ocasio_cortez", "markey", "radio2")
HELD_OUT = 0.6  # a clip's first 60 % makes the bank; a frame after it is the still


def mouth_cell(image: np.ndarray, points: np.ndarray, label: str) -> np.ndarray:
    """The mouth of `image` about the referee's `points`, scaled so the mouth is
    CELL_MOUTH px wide, shown at 2x (nearest), labelled."""
    import cv2

    w = float(np.linalg.norm(points[54] - points[48]))
    c = points[48:68].mean(0)
    k = CELL_MOUTH / w
    size = (int(CELL[0] * CELL_MOUTH), int(CELL[1] * CELL_MOUTH))
    m = np.array([[k, 0, size[0] / 2 - k * c[0]], [0, k, size[1] * 0.45 - k * c[1]]])
    cell = cv2.warpAffine(image, m, size, flags=cv2.INTER_AREA, borderMode=cv2.BORDER_REPLICATE)
    cell = cv2.resize(cell, None, fx=2, fy=2, interpolation=cv2.INTER_NEAREST)
    for colour, thick in (((0, 0, 0), 3), ((255, 255, 255), 1)):
        cv2.putText(cell, label, (6, 18), cv2.FONT_HERSHEY_SIMPLEX, 0.5, colour, thick)
    return cell


def grid(path: Path, rows: list[list[np.ndarray]]) -> None:
    """Rows of cells, padded to the widest row with grey, as PNG."""
    import cv2

    cols = max(len(r) for r in rows)
    blank = np.full_like(rows[0][0], 64)
    img = np.concatenate([np.concatenate(r + [blank] * (cols - len(r)), 1) for r in rows], 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])


def footage_clip(bench: Bench, name: str):
    """(frames, fps, audio at the bank's rate) of a real talking clip in --footage."""
    import av

    from pipeline.mouth.bank import FEATURE_RATE
    from pipeline.render.audio import load_audio

    path = bench.args.footage / f"{name}.mp4"
    if not path.is_file():
        return None
    with av.open(str(path)) as c:
        fps = float(c.streams.video[0].average_rate)
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(c.streams.video[0])]
    return frames, fps, load_audio(path, FEATURE_RATE)


def clip_bank(fx, frames: list[np.ndarray], audio: np.ndarray, fps: float, key: str):
    """The mouth bank of `frames` and their own `audio`, built as the bank stage builds
    it (the face mesh's points on each frame, RetinaFace's box)."""
    from pipeline.mouth.bank import MouthBank, build_bank
    from pipeline.nets.landmarks import load_landmarker

    mesh = load_landmarker("facemesh", None)
    lms = np.stack([np.asarray(mesh.predict(f, fx.detect_box(f)), np.float32) for f in frames])
    built = build_bank(len(frames), iter(frames), lms, audio, fps)
    return MouthBank.from_arrays(key, built.arrays, built.meta)


def interior_sheet(bench: Bench, faces, fx) -> None:
    """docs/mouth_sheet.png: a real clip's held-out frames beside the same presenter's
    still rendered with the bank of the clip's first 60 % and without one (the
    procedural mouth), at the clip's own audio; then the test faces' stills at three
    openings of the procedural mouth; each crop 2x."""
    import dataclasses

    from pipeline.mouth.bank import FEATURE_RATE
    from pipeline.render.renderers.warp import WarpRenderer
    from testkit.referee import referee_points
    from testkit.render_fixtures import speech

    rows: list[list[np.ndarray]] = []
    clips = SHEET_CLIPS[:1] if bench.quick else SHEET_CLIPS
    for name in clips:
        got = footage_clip(bench, name)
        if got is None:
            print(f"sheet: no clip {name} in {bench.args.footage} (its row is left out)")
            continue
        frames, fps, audio = got
        cut = int(HELD_OUT * len(frames))
        bank = clip_bank(fx, frames[:cut], audio[: int(cut / fps * FEATURE_RATE)], fps, name)
        rest = frames[cut:]
        truth = [referee_points(f) for f in rest]
        gaps = np.array([fx.lip_gap(p) if p is not None else np.nan for p in truth])
        k = int(np.nanargmin(gaps))  # the still: the held-out frame with the mouth most shut
        still = rest[k]
        still.flags.writeable = False
        assets = fx.still_assets(still)
        assets.bank = bank
        held = audio[int(cut / fps * FEATURE_RATE) :]
        made = {}
        for label, run in (
            ("bank", assets),
            ("procedural", dataclasses.replace(assets, bank=None)),
        ):
            r = WarpRenderer()
            r.prepare(run, held, FEATURE_RATE, len(rest), fps)
            made[label] = r
        # the moments the true mouth is most open, a few frames apart
        order = [int(t) for t in np.argsort(-np.nan_to_num(gaps, nan=-1.0))]
        picks: list[int] = []
        for t in order:
            if all(abs(t - p) > 6 for p in picks):
                picks.append(t)
            if len(picks) == 2:
                break
        pts = truth[k]
        row = [mouth_cell(still, pts, f"{name} still")]
        for t in sorted(picks):
            row += [
                mouth_cell(rest[t], truth[t], f"true t={t}"),
                mouth_cell(made["bank"].render(t, 0, still), pts, "bank"),
                mouth_cell(made["procedural"].render(t, 0, still), pts, "no bank"),
            ]
        rows.append(row)
    audio = speech(3.0, SR, seed=3)
    pending: list[np.ndarray] = []  # two test faces to a row
    for name in SHEET_FACES[:2] if bench.quick else SHEET_FACES:
        s = faces.samples((name,), ("upright",))[0]
        assets = fx.still_assets(s.image, "facemesh", fx.detect_box(s.image, s.truth.mean(0)))
        r = WarpRenderer()
        r.prepare(assets, audio, SR, 75, FPS)
        opening = r.openness()
        row = [mouth_cell(s.image, s.truth, f"{name} still")]
        for o in OPENINGS:
            t = int(np.argmin(np.abs(opening - o)))
            row.append(mouth_cell(r.render(t, 0, s.image), s.truth, f"open {opening[t]:.2f}"))
        if pending:
            rows.append(pending + row)
            pending = []
        else:
            pending = row
    if pending:
        rows.append(pending)
    path = bench.args.sheet or (
        bench.args.sheets / "interior_quick.png"
        if bench.quick
        else ROOT / "docs" / "mouth_sheet.png"
    )  # a quick run's sheet never replaces the manual's
    grid(path, rows)
    print(f"interior sheet: {path}")


def main(bench: Bench) -> None:
    try:
        from testkit import faces
        from testkit import mouth_fixtures as fx
    except ImportError:
        bench.missing("the test faces and fixtures (testkit/), run from the checkout")
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2 cores)")
    from pipeline.render.renderers.warp import WarpRenderer
    from testkit.render_fixtures import speech

    Old = old_renderer(bench)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        text = "Peter Piper picked a peck of pickled peppers." if bench.quick else fx.SENTENCES
        wav = fx.espeak(text, work / "speech.wav")  # no espeak-ng: one line, exit 2
        interior_sheet(bench, faces, fx)
        if bench.args.sheet_only:
            return
        placement_and_sheets(bench, faces, fx, Old, WarpRenderer, speech(3.0, SR, seed=3))
        sync(bench, faces, fx, Old, WarpRenderer, wav)
        bank(bench, faces, fx, wav, work)
        speed(bench, fx, Old, work)
    print(f"sheets in {bench.args.sheets}")


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"clip_seconds": 2.0})

"""The mouth bank held out on real talking footage, as the lip-sync papers evaluate.

    .venv/bin/python bench/bench_mouth_real.py [--quick] [--json FILE] [--clips NAME ...]
                                               [--seconds S] [--bank-seconds S ...]
                                               [--sheets DIR] [--docs-sheet PNG]

Per clip of testkit/footage_manifest.toml (real people speaking to camera, their own
recorded sound): its first 60 % (video and audio) is the persona's `speech.mp4`, from
which precompile builds the mouth bank; the held-out frame of the remaining 40 % whose
mouth is most closed (by the referee) is the persona's still (`portrait.png`); the
remaining 40 %'s audio is rendered onto that still by the warp renderer (`lip_sync`, as
`hotplate render` does). A clip whose first 60 % is longer than one of `--bank-seconds`
(GRID's 40 s clip; HDTF's 8 s ones are not) is run again with the bank from only that
many seconds just before the held-out part, on the same held-out frames: how much of
the presenter's speech the bank needs. The output is compared with the clip's true frames over the
held-out part, against three baselines rendered the same way: the frozen still (the
portrait shown unchanged), the library (the same persona with no `speech.mp4`, so no
bank: the default mouth library's real mouths, `pipeline/render/mouth/library.py`) and
the procedural mouth (no bank and no library: `HOTPLATE_MOUTH_LIBRARY=off`, the
painted interior).

Everything is judged by the referee (dlib's 68 points, testkit/referee.py), never by the
renderer's face mesh. Each frame is aligned to the canonical face (a similarity fitted
to the referee's eyes and nose, `pipeline.mouth.lips`; one unit is the distance between
the eye centres), which takes out the true head's motion:

- lip gap r: Pearson's r over the held-out frames of the referee's inner-lip gap over
  the mouth's width, output against truth (a frozen mouth does not move: its r is 0);
- LMD: the mean distance of the 20 lip points (48-67) from the truth's, aligned, in
  canonical units (x100: hundredths of the eye distance);
- SSIM of the mouth crop (canonical x -0.7..0.7, y 0.7..1.5, greyscale, 80 px a unit);
- inside FD: how far the colours inside the mouth are from the truth's, the Frechet
  distance between Gaussians fitted to the Lab pixels (L 0-100) of the mouth crops
  inside the referee's inner-lip outline (60-67) on each image, pooled over the
  held-out frames where the truth's mouth is open (lip gap over OPEN): what a mouth
  shows when it opens, teeth, cavity and tongue against a drawing's flat colours.

Beside the renders, the ear alone (`pipeline/mouth/ear.py`, trained once on GRID's
talker, no bank) against the truth's lip gap on the held-out frames, with today's
whole-file drive (the phones' opening table, `visemes.phone_opening`) as its baseline;
and the same on each clip of several people's sentences (testkit's `grid_others`: GRID
talkers it never heard), each sentence heard whole, as a mean over them.

Beside them, not a baseline but a bound: the bank driven by the truth's own mouth
shapes (the renderer's landmarker on the held-out frames), entries chosen by the same
search and composited by the same patch ("bank, true shapes"): what the bank renders
when its audio model is perfect, so a shortfall of the bank can be put on the audio
model or on the mouths.

It prints a table per clip (bank, library, procedural, still, bank with true shapes), records each figure against each
baseline, and writes a sheet per clip (`--sheets`, PNG, 2x): true, bank, library, procedural and
still crops (and the bank with the true shapes) at the held-out frames where the truth opens widest and at its median.
`--docs-sheet` writes one sheet for the manual: each clip's widest-open row.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from harness import ROOT, Bench, run_bench  # first: it puts the checkout on sys.path

from cachestore.store import forget_store, open_store
from pipeline.precompile.recipe import Recipe

HOLD_OUT = 0.4  # the share of each clip held out (the bank learns from the rest)
BANK_SECONDS = (4.8, 12.0)  # shorter banks a long clip is also run with (HDTF's are 4.8 s)
CANON = (-0.7, 0.7, 0.7, 1.5)  # canonical x1, x2, y1, y2 of the mouth crop SSIM is on
PX = 80.0  # crop pixels per canonical unit
LIP_POINTS = list(range(48, 68))
METHODS = ("bank", "library", "procedural", "still", "oracle")
OPEN = 0.08  # lip gap over mouth width: a truth frame whose inside the FD pools
SYNC_LAGS = range(-6, 7)  # frames a clip's pictures may sit from its sound (`footage_sync`)
BASELINES = {
    "library": "the mouth library (same still, no bank)",
    "procedural": "the procedural mouth (same still, no bank, no library)",
    "still": "the frozen still",
}


def add_arguments(ap) -> None:
    ap.add_argument("--clips", nargs="+", default=None, help="clip names (default: all)")
    ap.add_argument(
        "--seconds", type=float, default=0.0, help="use the first S s of each clip (0: all)"
    )
    ap.add_argument("--step", type=int, default=1, help="judge every STEP-th held-out frame")
    ap.add_argument(
        "--bank-seconds",
        type=float,
        nargs="*",
        default=list(BANK_SECONDS),
        help="also run each clip whose first 60 %% is longer than S s with the bank from"
        " only its last S s before the held-out part (the same held-out frames): how much"
        " of the presenter's speech the bank needs",
    )
    ap.add_argument("--sheets", type=Path, default=ROOT / "bench" / "out" / "mouth_real")
    ap.add_argument(
        "--docs-sheet", type=Path, default=None, help="one sheet: each clip's widest-open row"
    )


def canonical(points: np.ndarray) -> np.ndarray:
    """(2, 3) the similarity taking the referee's points to the canonical face."""
    from pipeline.mouth.lips import STABLE, similarity, template

    idx = list(STABLE)
    return similarity(points[idx], template()[idx])


def mouth_crop(image: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The canonical mouth crop of `image` (RGB), by the referee's `points` on it."""
    import cv2

    x1, x2, y1, y2 = CANON
    m = canonical(points) * PX
    m[:, 2] -= np.array([x1 * PX, y1 * PX])
    size = (int(round((x2 - x1) * PX)), int(round((y2 - y1) * PX)))
    return cv2.warpAffine(image, m, size, flags=cv2.INTER_AREA, borderMode=cv2.BORDER_REPLICATE)


def judged(frames, fx) -> list[dict | None]:
    """Per frame: the referee's points, lip gap, aligned lips and mouth crop (None where
    the referee finds no face)."""
    from pipeline.mouth.lips import apply
    from testkit.referee import referee_points

    out = []
    for image in frames:
        pts = referee_points(image)
        if pts is None:
            out.append(None)
            continue
        lips = apply(canonical(pts), pts[LIP_POINTS])
        crop = mouth_crop(image, pts)
        out.append(
            {
                "gap": fx.lip_gap(pts),
                "lips": lips,
                "crop": crop,
                "inside": inside_lab(crop, lips[12:20]),
            }
        )
    return out


def inside_lab(crop: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """(N, 3) float32 Lab (L 0-100) of a mouth crop's pixels inside the inner-lip outline
    `inner` (8, 2), in canonical units."""
    import cv2

    x1, _, y1, _ = CANON
    poly = np.round((inner - [x1, y1]) * PX).astype(np.int32)
    mask = np.zeros(crop.shape[:2], np.uint8)
    cv2.fillPoly(mask, [poly], 1)
    lab = cv2.cvtColor(crop.astype(np.float32) / 255.0, cv2.COLOR_RGB2Lab)
    return lab[mask > 0]


def inside_fd(truth: list[dict | None], made: list[dict | None]) -> float:
    """The Frechet distance between the Lab pixels inside the mouth of the truth and of
    a render (`inside_lab`), pooled over the frames where the truth is open past OPEN
    and both have a face (nan where either shows under 50 pixels)."""
    from scipy.linalg import sqrtm

    pairs = [
        (t["inside"], m["inside"])
        for t, m in zip(truth, made, strict=True)
        if t is not None and m is not None and t["gap"] > OPEN
    ]
    a = np.concatenate([t for t, _ in pairs]) if pairs else np.zeros((0, 3))
    b = np.concatenate([m for _, m in pairs]) if pairs else np.zeros((0, 3))
    if a.shape[0] < 50 or b.shape[0] < 50:
        return float("nan")
    ca, cb = np.cov(a.T), np.cov(b.T)
    root = sqrtm(ca @ cb).real
    return float(((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(ca + cb - 2.0 * root))


def scores(truth: list[dict | None], made: list[dict | None]) -> dict[str, float]:
    """r of the lip gap, LMD (x100 canonical units) and mouth-crop SSIM over the frames
    both have a face in."""
    import cv2
    from skimage.metrics import structural_similarity

    both = [(t, m) for t, m in zip(truth, made, strict=True) if t is not None and m is not None]
    if len(both) < 10:
        raise ValueError(f"the referee found a face in only {len(both)} frames of both")
    gt = np.array([t["gap"] for t, _ in both])
    gm = np.array([m["gap"] for _, m in both])
    r = 0.0 if gm.std() < 1e-9 or gt.std() < 1e-9 else float(np.corrcoef(gt, gm)[0, 1])
    lmd = float(np.mean([np.linalg.norm(t["lips"] - m["lips"], axis=1).mean() for t, m in both]))
    grey = [
        (cv2.cvtColor(t["crop"], cv2.COLOR_RGB2GRAY), cv2.cvtColor(m["crop"], cv2.COLOR_RGB2GRAY))
        for t, m in both
    ]
    ssim = float(np.mean([structural_similarity(a, b, data_range=255) for a, b in grey]))
    fd = inside_fd(truth, made)
    return {"r": r, "lmd": 100.0 * lmd, "ssim": ssim, "fd": fd, "frames": len(both)}


def held_part(bench: Bench, name: str, fx) -> dict:
    """One clip decoded, cut at 60 %, its held-out frames judged and its still chosen:
    what every run of the clip (`held_out`, whatever its bank) shares."""
    from testkit import footage

    clip = footage.load(name)
    n = clip.frames.shape[0]
    if bench.args.seconds:
        n = min(n, int(round(bench.args.seconds * clip.fps)))
    split = int(round((1.0 - HOLD_OUT) * n))
    truth_frames = clip.frames[split : n : bench.args.step]
    truth = judged(truth_frames, fx)
    gaps = np.array([np.inf if t is None else t["gap"] for t in truth])
    still = truth_frames[int(np.argmin(gaps))]  # the held-out frame with the mouth most shut
    return {
        "clip": clip,
        "n": n,
        "split": split,
        "frames": truth_frames,
        "truth": truth,
        "gaps": gaps,
        "still": still,
        "sync": footage_sync(clip, split, fx),
    }


def shifted(x: np.ndarray, lag: int) -> np.ndarray:
    """`x` (T,) moved `lag` frames later (NaN where it has no value)."""
    out = np.full(x.shape, np.nan)
    if lag >= 0:
        out[lag:] = x[: x.size - lag]
    else:
        out[:lag] = x[-lag:]
    return out


def footage_sync(clip, split: int, fx) -> dict:
    """How far the clip's pictures sit from its sound, read on the bank's part only
    (frames before `split`): the lag within SYNC_LAGS frames at which the ear's opening
    (the clip's audio heard whole) best follows the referee's lip gap there, and that r.
    A diagnostic of the footage, not of a render: a renderer cannot know a recording's
    offset, and a render of new speech must not carry one."""
    from pipeline.mouth.ear import load as load_ear

    ear = load_ear().openness(clip.audio, clip.sr, clip.fps, clip.frames.shape[0])
    gaps = fx.referee_gaps(list(clip.frames[:split]))
    r = {lag: correlation(shifted(ear, lag)[:split], gaps) for lag in SYNC_LAGS}
    best = max(r, key=r.get)
    return {"lag": best, "r": r[best], "r0": r[0]}


def runs(bench: Bench, names: list[str], fx) -> Iterator[tuple[str, float, dict]]:
    """(clip, bank seconds, its `held_part`) for each run: each clip with its whole first
    60 % as the bank (0 s), then with each of `--bank-seconds` shorter than that; one
    clip decoded at a time."""
    for clip in names:
        part = held_part(bench, clip, fx)
        for seconds in (0.0, *bench.args.bank_seconds):
            if not seconds or seconds * part["clip"].fps < part["split"]:
                yield clip, seconds, part


def held_out(bench: Bench, name: str, fx, work: Path, part: dict, first: int = 0) -> dict:
    """One run of a clip: the bank from frames `first` to the cut of its `held_part`, the
    rest rendered four ways and judged. The library's and the procedural mouth's renders
    do not depend on the bank: the clip's first run keeps them in `part` for the others."""
    import cv2

    from hotplate.demo_data import write_wav
    from pipeline.catalog import persona_bank
    from pipeline.lip_sync import LipSyncRequest, lip_sync
    from pipeline.precompile.run import precompile_source
    from pipeline.render.mouth.library import ENV as LIBRARY_ENV
    from testkit import footage

    clip, n, split, still = part["clip"], part["n"], part["split"], part["still"]
    truth_frames, truth, gaps = part["frames"], part["truth"], part["gaps"]

    root = work / "personas"
    for persona in (name, f"{name}-nobank"):
        (root / persona).mkdir(parents=True)
        cv2.imwrite(str(root / persona / "portrait.png"), cv2.cvtColor(still, cv2.COLOR_RGB2BGR))
    speech = footage.write_clip(
        root / name / "speech.mp4",
        clip.frames[first:split],
        clip.audio[clip.samples_at(first) : clip.samples_at(split)],
        clip.sr,
        clip.fps,
    )
    wav = write_wav(
        work / f"{name}.wav", clip.audio[clip.samples_at(split) : clip.samples_at(n)], clip.sr
    )
    store = open_store(work / f"{name}-store")
    recipe = Recipe(max_frames=0)
    outputs = {}
    try:
        precompile_source(speech, recipe, store)
        found = persona_bank(store, root, name, recipe)
        if found is None:
            bench.missing(f"a mouth bank from {name}'s first 60 % (precompile made an empty one)")
        for method, persona in (
            ("bank", name),
            ("library", f"{name}-nobank"),
            ("procedural", f"{name}-nobank"),
        ):
            if method in part:
                outputs[method] = part[method]
                continue
            out = work / f"{name}-{method}.mp4"
            before = os.environ.pop(LIBRARY_ENV, None)
            if method == "procedural":
                os.environ[LIBRARY_ENV] = "off"  # the painted interior
            try:
                outcome = lip_sync(
                    store, root, recipe, LipSyncRequest(persona, "default", wav, out, fps=clip.fps)
                )
            finally:
                os.environ.pop(LIBRARY_ENV, None)
                if before is not None:
                    os.environ[LIBRARY_ENV] = before
            if (outcome.bank is not None) != (method == "bank"):
                bench.missing(
                    f"{persona}: a render {'with' if method == 'bank' else 'without'} the bank"
                )
            outputs[method] = fx.video_frames(out)[: n - split : bench.args.step]
        part.setdefault("procedural", outputs["procedural"])
        part.setdefault("library", outputs["library"])
        outputs["oracle"] = true_shapes_render(
            store, root / name / "portrait.png", found[0], truth_frames, clip, recipe, fx
        )
        late = int((store.get_avatar(found[0]).get("sound_late") or {}).get("late", 0))
        held_audio = clip.audio[clip.samples_at(split) : clip.samples_at(n)]
        steps = audio_model(store, root / name / "portrait.png", found[0], held_audio, clip, recipe)
    finally:
        forget_store(work / f"{name}-store")
    k = min(len(truth_frames), *(len(v) for v in outputs.values()))
    truth, truth_frames = truth[:k], truth_frames[:k]
    if "procedural judged" not in part:
        part["procedural judged"] = judged(outputs["procedural"][:k], fx)
        part["library judged"] = judged(outputs["library"][:k], fx)
        part["still judged"] = judged([still], fx)[0]
    made = {m: judged(outputs[m][:k], fx) for m in ("bank", "oracle")}
    made["procedural"] = part["procedural judged"][:k]
    made["library"] = part["library judged"][:k]
    made["still"] = [part["still judged"]] * k
    outputs["still"] = [still] * k
    got = {m: scores(truth, made[m]) for m in METHODS}
    truth_gaps = gaps[:k]
    chain = {
        what: correlation(series[:: bench.args.step][:k], truth_gaps)
        for what, series in steps.items()
        if what not in ("target", "cue_name", "share")
    }
    chain["search"] = correlation(steps["shown"], steps["target"])
    lag = part["sync"]["lag"]  # the ear with the footage's offset, read on the bank's part
    # the bank aligns footage whose sound sits off its pictures (`bank.sound_offset`), so
    # its render is in step with the sound: against the truth's pictures moved as much
    bank_gaps = np.array([np.nan if m is None else m["gap"] for m in made["bank"]])
    moved = shifted(truth_gaps, int(round(late / bench.args.step)))
    chain["bank_late"], chain["bank_synced"] = late, correlation(bank_gaps, moved)
    chain["ear_synced"] = correlation(
        shifted(steps["ear"], lag)[:: bench.args.step][:k], truth_gaps
    )
    chain["chose"] = f"{steps['cue_name']} x{steps['share']:.2f}"
    # the sheet: the held-out frames where the truth opens widest, and at its median
    order = np.argsort(np.where(np.isfinite(gaps[:k]), gaps[:k], -np.inf))
    picks = [int(order[-1]), int(order[len(order) // 2])]
    rows = []
    for t in picks:
        row = [truth[t]["crop"] if truth[t] is not None else None]
        row += [made[m][t]["crop"] if made[m][t] is not None else None for m in METHODS]
        rows.append([c if c is not None else np.zeros_like(truth[t]["crop"]) for c in row])
    return {
        "scores": got,
        "chain": chain,
        "rows": rows,
        "bank_frames": split - first,
        "held_out": k,
        "held_out_seconds": round((n - split) / clip.fps, 2),
    }


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson's r where both are finite (0 where either does not move)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 10 or a[ok].std() < 1e-9 or b[ok].std() < 1e-9:
        return 0.0
    return float(np.corrcoef(a[ok], b[ok])[0, 1])


def audio_model(store, portrait: Path, bank_key: str, audio, clip, recipe) -> dict:
    """Each step from the held-out audio to the bank's mouth, as the warp renderer takes
    them (`BankMouths`): the loudness drive's opening, the cue the bank chose (loudness
    or phones, `bank.cue_opening`), the presenter's model's opening, the target (the
    model's and the cue's blend), and the opening of the entries the search shows."""
    from pipeline.catalog import plan_for
    from pipeline.hot import load_assets, load_bank
    from pipeline.mouth.bank import cue_opening
    from pipeline.render.audio import n_video_frames
    from pipeline.render.mouth.drive import mouth_drive
    from pipeline.render.mouth.from_bank import BankMouths
    from pipeline.render.silence import DEFAULT

    assets = load_assets(store, plan_for(store, portrait, recipe).avatar)
    bank = load_bank(store, bank_key)
    n_out = n_video_frames(audio.size / clip.sr, clip.fps)
    drive = mouth_drive(audio, clip.sr, clip.fps, n_out)
    mouths = BankMouths(assets, bank, audio, clip.sr, clip.fps, drive, DEFAULT)
    from pipeline.mouth.ear import load as load_ear
    from pipeline.mouth.visemes import phone_opening

    return {
        "ear": load_ear().openness(audio, clip.sr, clip.fps, n_out),  # no bank, no speaker
        "phones": phone_opening(audio, clip.sr, clip.fps, n_out),  # today's whole-file drive
        "drive": drive.open,
        "cue": cue_opening(bank.drive_cue, audio, clip.sr, clip.fps, n_out),
        "model": bank.predict(audio, clip.sr, clip.fps, n_out)[:, 0],
        "target": mouths.target[:, 0],
        "shown": mouths.shapes()[:, 0],
        "cue_name": bank.drive_cue,
        "share": bank.drive_share,
    }


def true_shapes_render(store, portrait: Path, bank_key: str, truth_frames, clip, recipe, fx):
    """The still with the bank's mouths chosen for the truth's own shapes (the renderer's
    landmarker on each held-out frame): the bank's search and patch, its target given."""
    from pipeline.catalog import plan_for
    from pipeline.hot import load_assets, load_bank
    from pipeline.mouth.lips import mouth_shape
    from pipeline.nets.landmarks import load_landmarker
    from pipeline.render.mouth.drive import mouth_drive
    from pipeline.render.mouth.from_bank import BankMouths, select
    from pipeline.render.renderers.base import paste

    assets = load_assets(store, plan_for(store, portrait, recipe).avatar)
    bank = load_bank(store, bank_key)
    marker = load_landmarker(recipe.landmarks, recipe.models_dir)
    shapes = []
    for image in truth_frames:
        lm = np.asarray(marker.predict(image, fx.detect_box(image)), np.float64)
        shapes.append(mouth_shape(lm))
    target = np.asarray(shapes, np.float32)
    silent = np.zeros(clip.sr, np.float32)  # the audio only sizes the drive; the target is given
    mouths = BankMouths(
        assets,
        bank,
        silent,
        clip.sr,
        clip.fps,
        mouth_drive(silent, clip.sr, clip.fps, len(target)),
        None,
    )
    mouths.target, mouths.entries = target, select(bank, target)
    still = assets.load_frame(0)
    return [paste(still, mouths.patch(t, 0, still)) for t in range(len(target))]


def sheet(path: Path, rows: list[list[np.ndarray]]) -> None:
    """Rows of same-sized crops (true, bank, library, procedural, still, bank with the
    true shapes) at 2x, as PNG."""
    import cv2

    img = np.concatenate([np.concatenate(r, 1) for r in rows], 0)
    img = cv2.resize(img, None, fx=2, fy=2, interpolation=cv2.INTER_NEAREST)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))


def table(results: dict[str, dict]) -> str:
    """Per clip: each metric for the bank, the library, the procedural mouth, the still
    and the bank with the truth's shapes (its bound)."""
    heads = ("bank", "lib", "proc", "still", "true")
    metrics = ("lip gap r", "LMD x100", "mouth SSIM", "inside FD (Lab)")
    lines = [
        f"{'clip':<22}{'bank':>6}{'judged':>7}" + "".join(f"{m:^42}" for m in metrics),
        f"{'':<35}" + "".join("  " + "".join(f"{h:>8}" for h in heads) for _ in metrics),
    ]
    for name, res in results.items():
        s = res["scores"]
        cells = "".join(
            "  " + "".join(f"{s[m][metric]:>8.3f}" for m in METHODS)
            for metric in ("r", "lmd", "ssim", "fd")
        )
        lines.append(f"{name:<22}{res['bank_frames']:>6}{res['held_out']:>7}{cells}")
    return "\n".join(lines)


def other_talkers(bench: Bench, footage, fx) -> None:
    """The ear alone on each clip of several people's sentences (GRID talkers it never
    heard), per sentence heard whole, against the phones' opening table."""
    named = bench.args.clips if not bench.quick else None  # --quick: two sentences of each
    for c in footage.clips():
        if c.people == 1 or (named and c.name not in named):
            continue
        heard, told = fx.ear_by_sentence(c.name, bench.args.step, 2 if bench.quick else None)
        bench.figure(
            f"{c.name}: the ear alone (no bank) vs the truth's lip gap, mean over sentences",
            float(np.mean(heard)),
            "r",
            baseline="today's whole-file drive (the phones' opening table)",
            baseline_value=float(np.mean(told)),
            inputs={
                "sentences": len(heard),
                "frames_each": c.sentence_frames,
                "people": c.people,
                "referee": "dlib 68",
            },
            note=f"per sentence: ear {', '.join(f'{r:.2f}' for r in heard)}; table "
            + ", ".join(f"{r:.2f}" for r in told),
        )


def main(bench: Bench) -> None:
    try:
        from testkit import footage
        from testkit import mouth_fixtures as fx
    except ImportError:
        bench.missing("the footage and fixtures (testkit/), run from the checkout")
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    names = bench.args.clips or [c.name for c in footage.presenters()]
    results = {}  # each clip with its whole first 60 % as the bank
    shorter = {}  # "name, bank S s": the same clip with the bank from its last S s only
    with tempfile.TemporaryDirectory() as tmp:
        for clip, seconds, part in runs(bench, names, fx):
            name = f"{clip}, bank {seconds:g} s" if seconds else clip
            work = Path(tmp) / name.replace(", ", "-").replace(" ", "")
            work.mkdir()
            first = part["split"] - int(round(seconds * part["clip"].fps)) if seconds else 0
            res = held_out(bench, clip, fx, work, part, first)
            (shorter if seconds else results)[name] = res
            sheet(bench.args.sheets / f"{name}.png", res["rows"])
            inputs = {
                "loop_frames": 1,
                "bank_frames": res["bank_frames"],
                "held_out_frames": res["held_out"],
                "referee": "dlib 68",
            }
            s = res["scores"]
            for metric, label, unit, better in (
                ("r", "lip gap r vs truth", "r", "higher"),
                ("lmd", "LMD", "x0.01 eye distance", "lower"),
                ("ssim", "mouth-crop SSIM", "SSIM", "higher"),
                ("fd", "inside-mouth colour FD", "Frechet distance, Lab", "lower"),
            ):
                for base, what in BASELINES.items():
                    ours, theirs = s["bank"][metric], s[base][metric]
                    beats = ours > theirs if better == "higher" else ours < theirs
                    bench.figure(
                        f"{name}: {label}, bank",
                        ours,
                        unit,
                        baseline=what,
                        baseline_value=theirs,
                        better=better,
                        inputs=inputs,
                        note="beats it" if beats else "does not beat it",
                    )
                ours, theirs = s["library"][metric], s["procedural"][metric]
                bench.figure(
                    f"{name}: {label}, library (no bank)",
                    ours,
                    unit,
                    baseline=BASELINES["procedural"],
                    baseline_value=theirs,
                    better=better,
                    inputs=inputs,
                    note="beats it"
                    if (ours > theirs) == (better == "higher")
                    else "does not beat it",
                )
                bench.figure(
                    f"{name}: {label}, bank with the truth's own shapes (a bound)",
                    s["oracle"][metric],
                    unit,
                    baseline="the bank (its audio model's shapes)",
                    baseline_value=s["bank"][metric],
                    better=better,
                    inputs=inputs,
                )
            c = res["chain"]
            bench.figure(
                f"{name}: the bank's audio model's opening vs the truth's lip gap",
                c["model"],
                "r",
                baseline="the loudness drive's opening",
                baseline_value=c["drive"],
                inputs=inputs,
                note=f"the bank's cue, {c['chose']}: {c['cue']:.3f}; the target (the model's"
                f" and the cue's blend) as shown by the search: {c['shown']:.3f}",
            )
            bench.figure(
                f"{name}: the ear alone (no bank) vs the truth's lip gap",
                c["ear"],
                "r",
                baseline="today's whole-file drive (the phones' opening table)",
                baseline_value=c["phones"],
                inputs=inputs,
                note="beats it" if c["ear"] > c["phones"] else "does not beat it",
            )
            sync = part["sync"]
            bench.figure(
                f"{name}: the ear alone, moved by the footage's offset, vs the truth's lip gap"
                " (a diagnostic of the footage)",
                c["ear_synced"],
                "r",
                baseline="the ear alone, not moved",
                baseline_value=c["ear"],
                inputs=inputs,
                note=f"offset {sync['lag']:+d} frames (+: the pictures after their sound), read"
                f" on the bank's part alone, where the ear follows the truth at r {sync['r']:.3f}"
                f" moved and {sync['r0']:.3f} not",
            )
            if c["bank_late"]:
                bench.figure(
                    f"{name}: lip gap r vs truth, bank, the truth's pictures moved as the"
                    " bank aligned its footage (a diagnostic of the footage)",
                    c["bank_synced"],
                    "r",
                    baseline="the same render against the truth as shot",
                    baseline_value=s["bank"]["r"],
                    inputs=inputs,
                    note=f"the bank found its footage's sound {c['bank_late']:+d} frames late"
                    " and fitted its model on it aligned",
                )
            bench.figure(
                f"{name}: the bank entries' opening vs the target's",
                c["search"],
                "r",
                inputs=inputs,
            )
    other_talkers(bench, footage, fx)
    print(table({**results, **shorter}))
    print("the chain, r against the truth's lip gap (held-out frames):")
    for name, res in {**results, **shorter}.items():
        c = res["chain"]
        print(
            f"  {name:<22} bank late {c['bank_late']:+d} (r {c['bank_synced']:6.3f} against the truth moved)"
            f"  ear {c['ear']:6.3f} (moved {c['ear_synced']:6.3f})  phones {c['phones']:6.3f}  drive {c['drive']:6.3f}  cue {c['cue']:6.3f} ({c['chose']})  "
            f"model {c['model']:6.3f}  shown {c['shown']:6.3f}  (shown vs target {c['search']:.3f})"
        )
    for metric, label, better in (
        ("r", "lip gap r", "higher"),
        ("lmd", "LMD", "lower"),
        ("ssim", "SSIM", "higher"),
        ("fd", "inside FD", "lower"),
    ):
        for base in BASELINES:
            wins = sum(
                (r["scores"]["bank"][metric] > r["scores"][base][metric]) == (better == "higher")
                for r in results.values()
            )
            print(f"{label}: the bank beats {base} on {wins} of {len(results)} clips")
        wins = sum(
            (r["scores"]["library"][metric] > r["scores"]["procedural"][metric])
            == (better == "higher")
            for r in results.values()
        )
        mean = {
            m: float(np.nanmean([r["scores"][m][metric] for r in results.values()]))
            for m in METHODS
        }
        print(
            f"{label}: the library beats the procedural mouth on {wins} of {len(results)}"
            " clips; means " + ", ".join(f"{m} {v:.3f}" for m, v in mean.items())
        )
    if bench.args.docs_sheet is not None:
        sheet(bench.args.docs_sheet, [r["rows"][0] for r in results.values()])  # widest open
        print(f"sheet of every clip in {bench.args.docs_sheet}")
    print(
        f"sheets in {bench.args.sheets} (columns: true, bank, library, procedural, still,"
        " bank with true shapes)"
    )


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={"clips": ["katie_hill"], "seconds": 4.0, "step": 3, "bank_seconds": []},
    )

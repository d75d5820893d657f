"""The landmarks stage: the face mesh (the default) against the fitted-68 (the old default).

    .venv/bin/python bench/bench_landmarks.py [--frames 150 250] [--quick] [--json FILE]

1. Speed: a generated 1080x1920 presenter loop of each `--frames` length is precompiled
   into a real store twice, under the default recipe (landmarks `facemesh`) and under
   `landmarks = "retinaface"` (the old default); the figure is the landmarks stage's own
   time from the precompile report (it makes the crops in the same pass), per frame, with
   the old default as the baseline. The decode and track stages are shared, so they are
   built once, outside the figures.
2. The face mesh's two runtimes, on the same .tflite: LiteRT (what the default runs) and
   onnxruntime (converted at load with tflite2onnx): milliseconds per face (three passes),
   load time, the largest difference between their meshes, and the size each adds to an
   install beyond what hotplate already needs.
3. Accuracy on the test faces (testkit/faces.py), judged by the referee (dlib's 68 points, on
   the upright source, carried through each variant's map): the median lip error
   (corners and inner lips) per face, as a fraction of the inter-ocular distance, the
   fitted-68 as the baseline in the same run.

`--sheet FILE` also writes a PNG of every sample's mouth at 2x: the mesh's outer lips
(yellow) and inner lips (blue), its 68 points' lips (red) and the referee's (green).

Figures only, no asserts (tests/pipeline/test_facemesh.py asserts the accuracy bound).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from harness import Bench, run_bench  # first: it puts the checkout on sys.path

from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.nets.detectors import load_detector
from pipeline.nets.landmarks import load_landmarker
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile

SIZE = (1080, 1920)
OLD = "retinaface"  # the old default: 68 points fitted to RetinaFace's five


def add_arguments(ap) -> None:
    ap.add_argument(
        "--frames", type=int, nargs="+", default=[150, 250], help="loop lengths (frames)"
    )
    ap.add_argument("--sheet", type=Path, metavar="FILE", help="write the mouths' sheet here")


def stage_seconds(report, name: str) -> float:
    return next(s.seconds for s in report.stages if s.name == name and not s.hit)


def speed(bench: Bench, frames: int, work: Path) -> None:
    loop = write_loop_video(work / f"loop{frames}.mp4", n_frames=frames, size=SIZE)
    store = open_store(work / f"store{frames}")
    try:
        seconds = {}
        for landmarks in (OLD, "facemesh"):  # the first also builds decode and track
            report = precompile(loop, Recipe(landmarks=landmarks, max_frames=frames), store)
            seconds[landmarks] = stage_seconds(report, "landmarks")
    finally:
        forget_store(work / f"store{frames}")
    inputs = {"loop_frames": frames, "resolution": f"{SIZE[0]}x{SIZE[1]}", "recipe": "default"}
    bench.figure(
        "landmarks stage (facemesh, with the crops it makes)",
        1000 * seconds["facemesh"] / frames,
        "ms/frame",
        baseline="the old default, landmarks=retinaface (fitted-68), same loop",
        baseline_value=1000 * seconds[OLD] / frames,
        better="lower",
        inputs=inputs,
    )


def installed_mb(*top_levels: str) -> float:
    total = 0
    for name in top_levels:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for root, _, files in os.walk(next(iter(spec.submodule_search_locations))):
            total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total / 1e6


def runtimes(bench: Bench, samples, detector) -> None:
    from pipeline.nets.facemesh import FaceMesh

    for name in ("ai_edge_litert", "tflite2onnx", "onnxruntime"):
        if importlib.util.find_spec(name) is None:
            bench.missing(f"package {name} (`just setup` installs it)")
    boxes = [faces_box(s, detector) for s in samples]
    nets, ms, load = {}, {}, {}
    for runtime in ("litert", "onnx"):
        start = time.perf_counter()
        nets[runtime] = FaceMesh(runtime)
        load[runtime] = time.perf_counter() - start
        nets[runtime].mesh(samples[0].image, boxes[0])  # warm
        start = time.perf_counter()
        meshes = [nets[runtime].mesh(s.image, b) for s, b in zip(samples, boxes, strict=True)]
        ms[runtime] = 1000 * (time.perf_counter() - start) / len(samples)
        nets[runtime] = np.stack(meshes)
    inputs = {"faces": len(samples), "passes": 3, "threads": 1}
    bench.figure(
        "face mesh on onnxruntime (tflite2onnx at load)",
        ms["onnx"],
        "ms/face",
        baseline="LiteRT, the default's runtime",
        baseline_value=ms["litert"],
        better="lower",
        inputs=inputs,
    )
    bench.figure(
        "face mesh load, onnxruntime (converts the .tflite)",
        load["onnx"],
        "s",
        baseline="LiteRT",
        baseline_value=load["litert"],
        better="lower",
    )
    bench.figure(
        "largest mesh difference, onnxruntime vs LiteRT",
        float(np.abs(nets["onnx"][..., :2] - nets["litert"][..., :2]).max()),
        "px",
        better="lower",
        inputs=inputs,
    )
    bench.figure(
        "install size added: ai-edge-litert",
        installed_mb("ai_edge_litert"),
        "MB",
        better="lower",
        note="onnxruntime is a dependency already; the ONNX path adds tflite2onnx + tflite: "
        f"{installed_mb('tflite2onnx', 'tflite'):.1f} MB",
    )


def faces_box(sample, detector):
    from testkit import faces

    return faces.face_box(sample, detector)


def accuracy(bench: Bench, samples, detector) -> None:
    from testkit.referee import lip_error

    new, old = load_landmarker("facemesh", None), load_landmarker(OLD, None)
    per_face: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for s in samples:
        box = faces_box(s, detector)
        per_face[s.source.name][0].append(lip_error(new.predict(s.image, box), s.truth))
        per_face[s.source.name][1].append(lip_error(old.predict(s.image, box), s.truth))
    every = (
        [e for a, _ in per_face.values() for e in a],
        [e for _, b in per_face.values() for e in b],
    )
    for name, (a, b) in [*per_face.items(), ("every test face", every)]:
        bench.figure(
            f"lip error, {name}",
            float(np.median(a)),
            "x inter-ocular",
            baseline="fitted-68 (the old default), same boxes",
            baseline_value=float(np.median(b)),
            better="lower",
            inputs={"samples": len(a), "referee": "dlib 68 (face-recognition-models)"},
        )


def mouth_sheet(path: Path, samples, detector, columns: int = 6) -> None:
    """Each sample's mouth, 2x (the mouth's width is a third of its 300-px tile)."""
    import cv2

    from pipeline.nets import mesh_topology as topo
    from pipeline.nets.facemesh import FaceMeshLandmarker
    from testkit.referee import lip_error

    model, tiles, side = FaceMeshLandmarker(), [], 300
    contours = (
        (topo.LIPS_OUTER_UPPER, (255, 255, 0)),
        (topo.LIPS_OUTER_LOWER, (255, 255, 0)),
        (topo.LIPS_INNER_UPPER, (0, 160, 255)),
        (topo.LIPS_INNER_LOWER, (0, 160, 255)),
    )
    for s in samples:
        mesh = model.predict_mesh(s.image, faces_box(s, detector))
        points = topo.mesh_to_68(mesh)
        centre = s.truth[48:68].mean(0)
        k = side / (2.2 * np.linalg.norm(s.truth[54] - s.truth[48]))
        m = np.array([[k, 0, side / 2 - k * centre[0]], [0, k, side / 2 - k * centre[1]]])
        tile = cv2.warpAffine(s.image, m, (side, side), flags=cv2.INTER_CUBIC)

        def to_tile(p, m=m):
            return np.round(np.asarray(p)[:, :2] @ m[:, :2].T + m[:, 2]).astype(np.int32)

        for contour, colour in contours:
            cv2.polylines(tile, [to_tile(mesh[list(contour)])], False, colour, 1, cv2.LINE_AA)
        for p in to_tile(s.truth[48:68]):
            cv2.circle(tile, tuple(int(v) for v in p), 3, (0, 255, 0), -1)
        for p in to_tile(points[48:68]):
            cv2.circle(tile, tuple(int(v) for v in p), 2, (255, 0, 0), -1)
        label = f"{s.name[:26]} {lip_error(points, s.truth):.3f}"
        cv2.putText(tile, label, (3, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (255, 255, 255), 1)
        tiles.append(tile)
    while len(tiles) % columns:
        tiles.append(np.zeros_like(tiles[0]))
    rows = [np.concatenate(tiles[i : i + columns], 1) for i in range(0, len(tiles), columns)]
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(np.concatenate(rows, 0), cv2.COLOR_RGB2BGR))
    print(f"wrote {path}", flush=True)


def main(bench: Bench) -> None:
    try:
        from testkit import faces
    except ImportError:
        bench.missing("the test faces (testkit/faces.py), run from the checkout")
    detector = load_detector("retinaface")
    if bench.quick:
        samples = faces.samples(("astronaut", "grace_hopper"), ("upright", "roll-30"))
    else:
        samples = faces.samples()
    accuracy(bench, samples, detector)
    if bench.args.sheet is not None:
        mouth_sheet(bench.args.sheet, samples, detector)
    runtimes(bench, samples, detector)
    with tempfile.TemporaryDirectory() as tmp:
        for frames in bench.args.frames:
            speed(bench, frames, Path(tmp))


if __name__ == "__main__":
    run_bench(main, __doc__, add_arguments, quick={"frames": [12]})

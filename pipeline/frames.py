"""Stored frames: how the decode stage names them and how they are read back."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from cachestore.store import Store
from pipeline.parallel import ordered_map


class FrameSource:
    """Stored frames by index, decoded on demand (the source file is never reopened)."""

    def __init__(self, store: Store, blobs: dict[str, str], full_side: int) -> None:
        self.store, self.full_side = store, full_side
        self.digests = [blobs[k] for k in sorted(k for k in blobs if k.startswith("frame/"))]

    def __len__(self) -> int:
        return len(self.digests)

    def _blob(self, i: int) -> np.ndarray:
        with self.store.read() as r:
            return r.array(self.digests[i]).copy()  # the JPEG bytes, small; decoded outside the txn

    def __call__(self, i: int) -> np.ndarray:
        from pipeline.media import decode_frame

        return decode_frame(self._blob(i))

    def proxy(self, i: int, proxy: int) -> tuple[np.ndarray, float]:
        from pipeline.media import decode_proxy

        return decode_proxy(self._blob(i), self.full_side, proxy)

    def each(self) -> Iterator[np.ndarray]:
        """Every frame in order, decoded two at a time ahead of the consumer."""
        return ordered_map(self, range(len(self)), ahead=4)


def frame_name(i: int) -> str:
    return f"frame/{i:06d}"

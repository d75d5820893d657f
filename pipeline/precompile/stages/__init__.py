"""The precompile stages, one module each (decode, track, per_frame: landmarks, crops and
masks in one pass, still, latents; bank for a mouth bank), and what every stage shares: a stage is looked up by its
key and computed only on a miss (`StageRunner`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from cachestore.store import Store
from pipeline.precompile.plan import Plan

# progress(stage, done, total); total 0 = unknown
Progress = Callable[[str, int, int], None]


@dataclass
class StageResult:
    name: str
    key: str
    hit: bool
    seconds: float = 0.0
    nbytes: int = 0


class StageRunner:
    """Looks each stage up by key; computes and stores it only on a miss."""

    def __init__(self, store: Store, keys: Plan, report: Any, force: bool) -> None:
        self.store, self.keys, self.report, self.force = store, keys, report, force

    def stage(self, name: str, compute: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]]):
        key = self.keys.stages[name]
        found = None if self.force else self.store.get_stage(key)
        if found is not None and self.store.stage_ok(key):
            self.report.stages.append(StageResult(name, key, True, 0.0, found.nbytes))
            return found
        start = time.perf_counter()
        arrays, meta = compute()
        record = self.store.put_stage(
            key, name, arrays, {**meta, "seconds": time.perf_counter() - start}
        )
        self.report.stages.append(
            StageResult(name, key, False, time.perf_counter() - start, record.nbytes)
        )
        return record

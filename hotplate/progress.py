"""One progress bar per stage, on stderr, only when it is a terminal (or forced)."""

from __future__ import annotations

import sys
from typing import Any


class StageBars:
    """A `progress(stage, done, total)` callable that draws a tqdm bar per stage."""

    def __init__(self, prefix: str = "", enabled: bool | None = None) -> None:
        self.prefix = prefix
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.bars: dict[str, Any] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        from tqdm import tqdm

        bar = self.bars.get(stage)
        if bar is None:
            for other in self.bars.values():
                other.close()
            bar = self.bars[stage] = tqdm(
                total=total or None,
                desc=f"{self.prefix}{stage:>9}",
                unit="f",
                leave=False,
                file=sys.stderr,
            )
        if total and bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()

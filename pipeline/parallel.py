"""An ordered, bounded parallel map on threads, for work that releases the GIL
(OpenCV's JPEG codec and resizes, PyAV): two cores for the price of one loop."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(
    fn: Callable[[T], R], items: Iterable[T], workers: int | None = None, ahead: int = 8
) -> Iterator[R]:
    """fn over items in order, at most `ahead` in flight, so memory stays bounded."""
    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        for item in items:
            pending.append(pool.submit(fn, item))
            if len(pending) >= ahead:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()

"""`hotplate sync`'s progress bar counts jobs by the log's fields, not by its wording."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from hotplate.cli.watch import SyncProgress

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def test_a_file_joining_a_job_does_not_count_as_another_job():
    progress = SyncProgress(verbose=False)
    progress.bar = tqdm(total=0, file=io.StringIO())
    progress("queued", "ann/a.png", "job 1 for content 0123456789ab", job=1)
    progress(
        "queued", "bob/b.png", "joins job 1: same content as ann/a.png", job=1, same_as="ann/a.png"
    )
    progress("job-start", "ann/a.png", "job 1, attempt 1/3, worker pid 7", job=1)
    progress("job-done", "ann/a.png", "job 1 hot in 0.10 s; 2 source(s)", job=1)
    assert (progress.bar.total, progress.bar.n) == (1, 1)
    progress.close()

"""Job records learn an owner: a jobs.sqlite written before owners existed gets the column
on open and its rows read back with no owner (only the admin token may delete those)."""

import sqlite3

import pytest

from hotplate.serve.records import COLUMNS, Job, JobRecords

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)


def test_an_old_jobs_table_gets_the_owner_column(tmp_path):
    path = tmp_path / "jobs.sqlite"
    old = [c for c in COLUMNS if c != "owner"]
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE jobs ({', '.join(old)})")
        row = {"id": "feedbeef", "kind": "render", "persona": "astro", "attire": "studio"}
        row |= {"backend": "warp", "created": 1.0, "state": "done"}
        db.execute(
            f"INSERT INTO jobs ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
            list(row.values()),
        )
    records = JobRecords(path)
    job = records.get("feedbeef")
    assert job is not None and job.owner is None and job.state == "done"
    records.save(Job("cafe0001", "render", "astro", "studio", None, "warp", 2.0, owner="c-1"))
    assert records.get("cafe0001").owner == "c-1"

from __future__ import annotations

import pytest

from cachestore.store import forget_store


@pytest.fixture
def personas(tmp_path):
    path = tmp_path / "personas"
    path.mkdir()
    return path


@pytest.fixture
def cache(tmp_path):
    path = tmp_path / "store"
    yield path
    forget_store(path)


@pytest.fixture
def joblog(tmp_path, monkeypatch):
    """Where tests.watcher.testjobs records each job (the env var reaches spawned workers)."""
    path = tmp_path / "jobs.jsonl"
    monkeypatch.setenv("HOTPLATE_TEST_JOBLOG", str(path))
    return path

"""package_present while another thread imports the package: cv2's loader swaps its
native module into sys.modules with __spec__ None, and importlib.util.find_spec raises
ValueError on that; the server's thumbnail route (which asks whether a backend's packages
are present while another request's thread imports cv2) answered 500 with it
(test_serve_map_growth). A real, fresh interpreter imports cv2 while a thread asks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import sys, threading
from pipeline.nets.backends import package_present
errors, answers, stop = [], set(), threading.Event()

def ask():
    while not stop.is_set():
        try:
            answers.add(package_present("cv2"))
        except Exception as exc:
            errors.append(repr(exc))
            return

asker = threading.Thread(target=ask)
asker.start()
import cv2  # noqa: F401
stop.set()
asker.join()
print(errors[:1], sorted(answers))
"""


def test_a_package_being_imported_by_another_thread_is_present():
    for _ in range(3):  # the window is the length of cv2's import: hit it every run seen
        out = subprocess.run(
            [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, timeout=120
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split("]")[0] == "[", out.stdout  # no error raised
        assert "False" not in out.stdout, out.stdout  # never said absent while importing

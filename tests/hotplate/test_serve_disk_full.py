"""A full disk while an upload is saved: the request gets a one-line 507, the partial file
is removed (before, it was left behind), and once space is back the next upload works.
The server's data dir is a real 1 MiB tmpfs (mounting one needs root)."""

import os
import subprocess

import numpy as np
import pytest

from hotplate.demo_data import write_wav
from testkit.serve_helpers import Server, assert_problem, make_world, post_render, speech

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    mount = tmp_path_factory.mktemp("small-disk")
    if os.geteuid() != 0:
        reason = "mounting a tmpfs needs root"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI runs as root")
        pytest.skip(reason)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_gets_507_and_leaves_no_partial_upload(small_disk, tmp_path):
    root = make_world(tmp_path, attires=("studio",))
    big = write_wav(root / "big.wav", np.zeros(16000 * 40, np.float32), 16000)  # 1.3 MB
    speech(root / "two.wav", 2.0)
    args = ("--workers", "1", "--max-upload-mb", "5", "--data", str(small_disk))
    with Server(root, *args) as srv, srv.client() as c:
        answer = post_render(c, "/v1/renders", big)
        assert_problem(answer, 507, "disk is full")
        assert str(small_disk) not in answer.text
        assert list((small_disk / "uploads").iterdir()) == []  # the partial file is gone
        done = post_render(c, "/v1/lip-sync", root / "two.wav")  # the space came back
        assert done.status_code == 200, done.text

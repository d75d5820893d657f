"""The phone recogniser's worker process (`pipeline/mouth/phone_worker.py`): it hears what
this process hears, a worker that dies loses nothing, and it ends with its parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.mouth import phone_worker
from pipeline.mouth.recogniser import hear
from pipeline.render.audio import load_audio
from testkit.mouth_fixtures import espeak

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def speech(tmp_path):
    return load_audio(
        espeak("Peter Piper picked a peck of pickled peppers.", tmp_path / "s.wav"), 48000
    )


@pytest.fixture
def fresh_worker(monkeypatch):
    """This process's worker state, restored after the test (one that breaks it would
    make every later test hear in process)."""
    monkeypatch.setattr(phone_worker, "_broken", False)
    monkeypatch.setattr(phone_worker, "_worker", None)
    yield
    if phone_worker._worker is not None:
        phone_worker._worker.stdin.close()
        phone_worker._worker.wait()


def test_the_worker_hears_what_this_process_hears(speech, fresh_worker):
    got = phone_worker.hear_apart(speech, 48000)
    assert phone_worker.worker_pid() is not None  # heard there, not here
    assert got == hear(speech, 48000) and len(got) > 5


def test_a_worker_that_dies_loses_no_piece(speech, fresh_worker, capfd):
    want = phone_worker.hear_apart(speech, 48000)
    os.kill(phone_worker.worker_pid(), signal.SIGKILL)
    assert phone_worker.hear_apart(speech, 48000) == want  # heard in process instead
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "phone worker failed" in err[0] and "in process" in err[0], err
    assert phone_worker.worker_pid() is None  # not trusted again


def test_a_stalled_worker_is_given_up_and_the_piece_heard_here(
    speech, fresh_worker, capfd, monkeypatch
):
    """A worker that is stopped, not dead (its pipe stays open), answers nothing: the wait
    is bounded, the worker killed, the piece heard in process, and the next piece too."""
    want = phone_worker.hear_apart(speech, 48000)
    pid = phone_worker.worker_pid()
    monkeypatch.setattr(phone_worker, "REPLY_WITHIN", 1.0)
    monkeypatch.setattr(phone_worker, "REPLY_PER_SECOND", 0.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        assert phone_worker.hear_apart(speech, 48000) == want
    finally:
        if _state(pid) not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no answer in 1 s" in err[0] and "in process" in err[0], err
    assert _state(pid) in (None, "Z")  # killed, not left stopped
    assert phone_worker.worker_pid() is None
    assert phone_worker.hear_apart(speech, 48000) == want


def _state(pid: int) -> str | None:
    """The process's state letter (Z: ended, not yet reaped), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def _assert_ends(pid: int) -> None:
    """The worker sees its stdin close and returns (within a generous deadline)."""
    deadline = time.monotonic() + 120
    while _state(pid) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _state(pid) in (None, "Z"), f"the phone worker {pid} outlived its parent"


def test_the_worker_ends_when_its_parent_is_killed(tmp_path):
    script = (
        "import sys, numpy as np\n"
        "from pipeline.mouth import phone_worker\n"
        "phone_worker.hear_apart(np.zeros(16000, np.float32), 16000)\n"
        "print(phone_worker.worker_pid(), flush=True)\n"
        "sys.stdin.read()\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    pid = int(parent.stdout.readline())
    assert _state(pid) not in (None, "Z")
    parent.kill()  # kill -9: nothing of the parent's runs
    parent.wait()
    _assert_ends(pid)


FORK_SCRIPT = """
import json, os, select, sys, threading
import numpy as np
from pipeline.mouth import phone_worker
from pipeline.mouth.recogniser import hear
from pipeline.render.audio import load_audio
speech = load_audio(sys.argv[1], 48000)
want = phone_worker.hear_apart(speech, 48000)
parent_worker = phone_worker.worker_pid()
held, release = threading.Event(), threading.Event()
def hold():  # a thread of the parent's mid-request at the fork
    with phone_worker._lock:
        held.set()
        release.wait()
holder = threading.Thread(target=hold)
holder.start()
held.wait()
fds = [phone_worker._worker.stdin.fileno(), phone_worker._worker.stdout.fileno()]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    def is_open(fd):
        try:
            os.fstat(fd)
            return True
        except OSError:
            return False
    inherited = [fd for fd in fds if is_open(fd)]  # before the child opens any of its own
    got = phone_worker.hear_apart(speech, 48000)
    os.write(w, json.dumps([got == want, phone_worker.worker_pid(), inherited]).encode())
    os._exit(0)
os.close(w)
release.set()
holder.join()
ready = select.select([r], [], [], 120)[0]
child = json.loads(os.read(r, 4096)) if ready else None
if child is None:
    os.kill(pid, 9)
os.waitpid(pid, 0)
again = phone_worker.hear_apart(speech, 48000) == want
print(json.dumps({"parent": parent_worker, "child": child, "again": again,
                  "parent_after": phone_worker.worker_pid()}))
"""


def test_a_forked_child_hears_with_a_worker_of_its_own(tmp_path):
    """A child forked while a parent's thread held the worker starts its own (the
    parent's lock and pipes are not its to use), and the parent's worker is unharmed."""
    wav = espeak("Peter Piper picked a peck of pickled peppers.", tmp_path / "s.wav")
    done = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, str(wav)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["child"] is not None, "the forked child waited on its parent's lock"
    same, child_worker, inherited = got["child"]
    assert same, "the forked child heard something else"
    assert inherited == [], f"the child kept its parent's worker pipes open: fds {inherited}"
    assert child_worker not in (None, got["parent"]), got
    assert got["again"] and got["parent_after"] == got["parent"], got


ORPHAN_SCRIPT = """
import os, sys, time
import numpy as np
from pipeline.mouth import phone_worker
phone_worker.hear_apart(np.zeros(16000, np.float32), 16000)
pid = os.fork()
if pid == 0:  # a child that outlives its parent, holding nothing of the worker's
    time.sleep(600)
    os._exit(0)
print(phone_worker.worker_pid(), pid, flush=True)
sys.stdin.read()
"""


def test_the_worker_ends_when_its_parent_dies_while_a_forked_child_lives():
    """The child closed its copy of the worker's pipes, so the parent's kill -9 still
    closes the worker's stdin and the worker ends, though the child goes on."""
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN_SCRIPT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    worker, child = (int(x) for x in parent.stdout.readline().split())
    try:
        parent.kill()
        parent.wait()
        assert _state(child) not in (None, "Z"), "the child should still be alive"
        _assert_ends(worker)
    finally:
        for pid in (child, worker):
            if _state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)

"""A forked child never ends its parent's reads (LMDB: an environment must not be used,
nor closed, after fork).

Closing the inherited handle in the child aborted the parent's read transactions in the
shared reader table, so writers in other processes reused the pages under the parent's
zero-copy view. Each case runs in a child process of the test (a crash is an exit code)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cachestore.test_map_growth import ROOT

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

# The parent reads a 1 MiB blob zero-copy, forks a child that opens the same store (and one
# that uses the inherited handle), then another process deletes the blob and writes new
# ones of the same size: the parent's view and transaction must be untouched.
PARENT = """
import json, os, subprocess, sys, threading
import numpy as np
from cachestore.errors import StoreError
from cachestore.store import open_store
cache, other, writer, holder = sys.argv[1:5]
store = open_store(cache)
rec = store.put_stage("s", "x", {"a": np.random.default_rng(1).random(1 << 17)}, {})
store.put("meta", "x", 41)
def child(fn, normal_exit=False):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            line = fn()
        except StoreError as exc:
            line = "StoreError: " + str(exc)
        except BaseException as exc:
            line = type(exc).__name__ + ": " + str(exc)
        os.write(w, line.encode())
        if normal_exit:  # unwinds the parent's `with store.read()` here, then finalizes
            sys.exit(0)
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as got:
        line = got.read()
    os.waitpid(pid, 0)
    return line
def fresh_other():
    s = open_store(other)  # a store the parent never opened: the child's own
    s.put("meta", "y", 1)
    return "ok " + str(s.read_value("meta", "y"))
def children():
    return {
        "open": child(lambda: open_store(cache) and "opened"),
        "inherited": child(lambda: str(store.read_value("meta", "x"))),
        "other": child(fresh_other),
        # children that end as programs do (sys.exit: the interpreter's own exit)
        "open_then_exit": child(lambda: open_store(cache) and "opened", normal_exit=True),
        "exit": child(lambda: "exits", normal_exit=True),
    }
def read_through(fork):  # a zero-copy view held while `fork` runs and pages are reused
    with store.read() as r:
        view = r.array(rec.blobs["a"])
        before = view.tobytes()
        lines = fork()
        subprocess.run([sys.executable, "-c", writer, cache], check=True)
        same = view.tobytes() == before
        try:
            x = r.get("meta", "x")
        except Exception as exc:
            x = type(exc).__name__
    return lines, same, x
if holder == "forking thread":
    lines, same, x = read_through(children)
else:  # another thread holds the read: in the child its transaction has no thread
    want, forked, out = threading.Event(), threading.Event(), {}
    def fork_in_main():
        want.set()
        forked.wait()
        return out["lines"]
    reader = threading.Thread(target=lambda: out.update(result=read_through(fork_in_main)))
    reader.start()
    want.wait()
    out["lines"] = children()
    forked.set()
    reader.join()
    lines, same, x = out["result"]
print(json.dumps({"lines": lines, "same": same, "x": x, "after": store.read_value("meta", "x")}))
"""

# Frees the parent's blob and writes new ones of its size, in many transactions, so that
# LMDB reuses every page no live reader holds.
WRITER = """
import sys
import numpy as np
from cachestore.store import open_store
store = open_store(sys.argv[1])
store.delete("blob", store.get_stage("s").blobs["a"])
store.delete("stage", "s")
for i in range(8):
    store.put_stage(f"n{i}", "x", {"a": np.full(1 << 17, float(i))}, {})
"""


@pytest.mark.parametrize("holder", ["forking thread", "another thread"])
def test_a_forked_child_never_ends_the_parents_reads(tmp_path, holder):
    done = subprocess.run(
        [sys.executable, "-c", PARENT, str(tmp_path / "cache"), str(tmp_path / "other")]
        + [WRITER, holder],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout)
    assert facts["same"] and facts["x"] == 41 and facts["after"] == 41, facts
    lines = facts["lines"]
    assert lines["exit"] == "exits", lines
    # the parent's store is refused in the child, in one line that names the fix
    for case in ("open", "inherited", "open_then_exit"):
        line = lines[case]
        assert line.startswith("StoreError: ") and "\n" not in line, lines
        assert str(tmp_path / "cache") in line and "spawn" in line, lines
    assert lines["other"] == "ok 1", lines  # a store the parent never opened is the child's

"""A forked child never ends its parent's reads (LMDB: an environment must not be used,
nor closed, after fork).

Closing the inherited handle in the child aborted the parent's read transactions in the
shared reader table, so writers in other processes reused the pages under the parent's
zero-copy view. Each case runs in a child process of the test (a crash is an exit code)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cachestore.test_map_growth import ROOT

# The parent reads a 1 MiB blob zero-copy, forks a child that opens the same store (and one
# that uses the inherited handle), then another process deletes the blob and writes new
# ones of the same size: the parent's view and transaction must be untouched.
PARENT = """
import json, os, subprocess, sys
import numpy as np
from cachestore.errors import StoreError
from cachestore.store import open_store
cache, other, writer = sys.argv[1], sys.argv[2], sys.argv[3]
store = open_store(cache)
rec = store.put_stage("s", "x", {"a": np.random.default_rng(1).random(1 << 17)}, {})
store.put("meta", "x", 41)
def child(fn):
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
with store.read() as r:
    view = r.array(rec.blobs["a"])
    before = view.tobytes()
    lines = {
        "open": child(lambda: open_store(cache) and "opened"),
        "inherited": child(lambda: str(store.read_value("meta", "x"))),
        "other": child(fresh_other),
    }
    subprocess.run([sys.executable, "-c", writer, cache], check=True)
    same = view.tobytes() == before
    try:
        x = r.get("meta", "x")
    except Exception as exc:
        x = type(exc).__name__
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


def test_a_forked_child_never_ends_the_parents_reads(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", PARENT, str(tmp_path / "cache"), str(tmp_path / "other"), WRITER],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout)
    assert facts["same"] and facts["x"] == 41 and facts["after"] == 41, facts
    lines = facts["lines"]
    # the parent's store is refused in the child, in one line that names the fix
    for case in ("open", "inherited"):
        line = lines[case]
        assert line.startswith("StoreError: ") and "\n" not in line, lines
        assert str(tmp_path / "cache") in line and "spawn" in line, lines
    assert lines["other"] == "ok 1", lines  # a store the parent never opened is the child's

"""The map grows while threads read: no crash, no wrong byte (issue 15, part 1).

LMDB allows `set_mapsize` only while no transaction of the process is open, and a resize
unmaps every buffer handed out before it. Before the gate, `Store.write` grew the map under
readers' feet: a 1 MiB map with four reader threads died with signal 11. Each case runs in
a child process, so a segfault is an exit code, not a dead test run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

ROOT = Path(__file__).resolve().parents[2]

# N threads read one stage's array zero-copy (summing it inside the transaction) while the
# main thread writes GROW_WRITES stages of growing size into a map that starts at 1 MiB.
IN_PROCESS = """
import json, sys, threading
import numpy as np
from cachestore.store import Store
cache, threads, writes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
store = Store(cache, map_size=1 << 20)
first = store.env.info()["map_size"]
rec = store.put_stage("fixed", "decode", {"a": np.arange(20000, dtype=np.float32)}, {})
want = float(np.arange(20000, dtype=np.float32).sum())
stop, reads, wrong = threading.Event(), [0] * threads, []
def reader(n):
    while not stop.is_set():
        with store.read() as r:
            got = float(r.array(rec.blobs["a"]).sum())
        if got != want:
            wrong.append(got)
        reads[n] += 1
pool = [threading.Thread(target=reader, args=(n,)) for n in range(threads)]
for t in pool:
    t.start()
for i in range(writes):
    store.put_stage(f"s{i}", "x", {"a": np.random.rand(4000 + 60 * i)}, {})
stop.set()
for t in pool:
    t.join()
print(json.dumps({"first": first, "last": store.env.info()["map_size"], "reads": reads,
                  "wrong": len(wrong)}))
"""

# Another process writes while this one's threads read (FrameSource, as precompile's frame
# readers do, and plain store reads, as the server's thread pool does); growth reaches the
# readers as MapResizedError, which they must adopt with no transaction of theirs open.
READERS = """
import json, sys, threading
import numpy as np
from cachestore.store import open_store
from pipeline.frames import FrameSource
cache, stop_file = sys.argv[1], sys.argv[2]
store = open_store(cache, map_size=1 << 20)
frames = store.get_stage("frames")
source = FrameSource(store, frames.blobs, 64)
want = [source(i).sum() for i in range(len(source))]
passes, wrong = [0, 0], []
import os
def frame_reader():
    while not os.path.exists(stop_file):
        got = [f.sum() for f in source.each()]  # ordered_map: several threads decode
        if got != want:
            wrong.append(1)
        passes[0] += 1
def store_reader():
    while not os.path.exists(stop_file):
        for _ in range(20):
            store.items("stage")
            store.read_value("meta", "schema")
        passes[1] += 1
pool = [threading.Thread(target=frame_reader), threading.Thread(target=store_reader),
        threading.Thread(target=store_reader)]
print("reading", flush=True)
for t in pool:
    t.start()
for t in pool:
    t.join()
print(json.dumps({"passes": passes, "wrong": len(wrong),
                  "map": store.env.info()["map_size"]}), flush=True)
"""

WRITER = """
import sys
import numpy as np
from cachestore.store import open_store
cache, writes = sys.argv[1], int(sys.argv[2])
store = open_store(cache, map_size=1 << 20)
for i in range(writes):
    store.put_stage(f"w{i}", "x", {"a": np.random.rand(5000 + 80 * i)}, {})
print(store.env.info()["map_size"])
"""


def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


@pytest.mark.slow
@pytest.mark.parametrize("threads", [2, 8])
def test_threads_read_while_the_map_grows_in_their_own_process(tmp_path, threads):
    done = run(IN_PROCESS, str(tmp_path / "cache"), str(threads), "250")
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    facts = json.loads(done.stdout)
    assert facts["last"] >= 8 * facts["first"], facts  # it grew, several times over
    assert facts["wrong"] == 0 and all(n > 0 for n in facts["reads"]), facts


@pytest.mark.slow
def test_threads_read_while_another_process_grows_the_map(tmp_path):
    import numpy as np

    from cachestore.store import open_store
    from pipeline.frames import frame_name
    from pipeline.media import encode_frame

    cache, stop = tmp_path / "cache", tmp_path / "stop"
    store = open_store(cache, map_size=1 << 20)
    rng = np.random.default_rng(0)
    frames = {
        frame_name(i): np.frombuffer(
            encode_frame(rng.integers(0, 255, (64, 48, 3), np.uint8)), np.uint8
        )
        for i in range(6)
    }
    store.put_stage("frames", "decode", frames, {})
    readers = subprocess.Popen(
        [sys.executable, "-c", READERS, str(cache), str(stop)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert readers.stdout.readline().strip() == "reading"  # an event, not a pause
        grown = [run(WRITER, str(cache), "200") for _ in range(4)]
    finally:
        stop.touch()
        out, err = readers.communicate(timeout=300)
    for w in grown:
        assert w.returncode == 0, w.stderr[-2000:]
    assert readers.returncode == 0, f"readers exit {readers.returncode}: {err[-2000:]}"
    facts = json.loads(out.strip().splitlines()[-1])
    assert facts["wrong"] == 0 and min(facts["passes"]) > 0, facts
    assert facts["map"] > 1 << 20, facts  # the readers adopted the grown map


def test_map_size_is_a_setting_and_status_shows_it(tmp_path, monkeypatch):
    from cachestore.stats import store_stats
    from cachestore.store import forget_store
    from hotplate.cli.common import open_cache
    from hotplate.settings import SettingsError, load_settings

    monkeypatch.setenv("HOTPLATE_MAP_SIZE", "2M")
    settings = load_settings(cache=tmp_path / "cache")
    assert settings.map_size == 2 << 20
    store = open_cache(settings)
    try:
        assert store_stats(store).map_size == 2 << 20
    finally:
        forget_store(tmp_path / "cache")
    monkeypatch.setenv("HOTPLATE_MAP_SIZE", "lots")
    with pytest.raises(SettingsError, match="HOTPLATE_MAP_SIZE.*map_size='lots' is not a size"):
        load_settings()


def test_status_json_reports_map_size(tmp_path):
    from tests.integrity.cli import hotplate

    (tmp_path / "personas").mkdir()
    cache = tmp_path / "cache"
    env_line = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cachestore.store import open_store; import sys;"
            "open_store(sys.argv[1], map_size=3 << 20).put('meta', 'x', 1)",
            str(cache),
        ],
        cwd=ROOT,
    )
    assert env_line.returncode == 0
    done = hotplate(tmp_path, cache, "status", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["map_size"] >= 3 << 20

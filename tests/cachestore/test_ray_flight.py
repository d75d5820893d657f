"""The cluster's single flight failing never fails a render: an error from Ray inside a
miss's pull (the flight actor gone or restarting) is one line, then a local build.

A real Ray (one local node, started in a child process) and a real nginx tier."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit.nginx import Nginx
from tests.cachestore.test_map_growth import ROOT

pytestmark = pytest.mark.slow

# Misses once through the cluster (which takes and caches the avatar's lease), kills the
# flight actor, and misses again: the cached lease now talks to a dead actor.
MISS_TWICE = """
import json, os, sys
os.environ.update({"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"})
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, namespace="hotplate",
         log_to_driver=False, logging_level="ERROR")
os.environ["HOTPLATE_RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
from cachestore.remote import ray_flight
from cachestore.remote.pull import pull_on_miss
from cachestore.remote.tier import attach
from cachestore.store import open_store
cache, url = sys.argv[1], sys.argv[2]
attach(cache, url)
store, lines, stages = open_store(cache), [], {"decode": "d" * 32}
first = pull_on_miss(store, "a" * 32, stages, lines.append)
ray.kill(ray_flight.flight_actor(create=False), no_restart=True)
try:
    second, raised = pull_on_miss(store, "a" * 32, stages, lines.append), None
except Exception as exc:
    second, raised = None, f"{type(exc).__name__}: {exc}"
print(json.dumps({"first": first, "second": second, "raised": raised, "lines": lines}))
ray.shutdown()
"""


def test_a_ray_error_inside_a_miss_is_one_line_and_a_local_build(tmp_path):
    try:
        import ray  # noqa: F401
    except ImportError:
        from testkit.preconditions import require

        require(False, "ray is not installed (pip install -e '.[dev]')")
    tier = Nginx(tmp_path / "nginx").start()
    try:
        done = subprocess.run(
            [sys.executable, "-c", MISS_TWICE, str(tmp_path / "cache"), tier.url],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
    finally:
        tier.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert facts["first"] is None and facts["second"] is None  # a miss, then a local build
    assert facts["raised"] is None, facts  # the actor's death did not escape the miss
    (line,) = [x for x in facts["lines"] if "warning" in x]
    assert "building locally" in line and "\n" not in line, facts

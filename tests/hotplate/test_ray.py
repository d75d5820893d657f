"""hotplate on a real two-node Ray cluster (`ray.cluster_utils.Cluster`, both nodes on
this machine on 127.0.0.1, one CPU each), each node with its own store
(`HOTPLATE_NODE_CACHE` in the node's environment) and a real nginx as the blob tier.

- three cold starts (each a new cluster): from the first 200 of `/readyz`, a job made
  then and its signed video URL answer through both replicas, none failing;
- the real `hotplate serve --ray` CLI deploys two replicas, one per node; a render that
  lands on one node builds, the same avatar on the other node is pulled, not built;
  requests naming an avatar (multiplexed model id) stick to one replica; four
  concurrent cold renders over HTTP make one build;
- four concurrent cold precompiles, two pinned to each node, make one build;
- `hotplate sync --ray`'s tasks push what they build;
- a replica killed mid-request gives the client an error, not a hang;
- a session's replica killed mid-socket: the socket the other replica forwards closes
  with 1011 and one line, and the session reads 404;
- SIGTERM to `hotplate serve --ray` drains: a render queued on a replica finishes whole
  (Serve's graceful shutdown, then the app's lifespan) before the app is gone;
- the whole job API (status, events, video, DELETE, the list, a stream's job) and signed
  URLs work whichever replica answers, and the page works against the deployment in
  Chromium;
- a conversation session (WHEP, the speech WebSocket, its figures, interrupt, DELETE)
  works whichever replica answers: an aiortc player gets its pictures and its speech, a
  forwarded socket gets the owner's close when the session ends, and a socket without
  its signature, from another site, or to a peer listener without the secret is refused;
- the page's Talk mode in Chromium against the two replicas: a clip said, interrupted,
  the session ended;
- a wait for another node's build ends at the caller's flight_wait;
- /readyz says 503 while a wanted replica cannot start (three wanted, two placed).

Bounded for a 2-core CI: one cluster for the module (the cold starts make their own,
before it exists: they come first), 8-frame 270x480 loops. The
deployment has a token: the page and signed URLs are tested as a studio runs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from cachestore.store import forget_store, open_store
from hotplate.cli.common import invocation
from hotplate.demo_data import make_speech_audio
from testkit.environment import environ_set
from testkit.nginx import Nginx
from testkit.serve_helpers import free_port, make_world, speak, speech

pytestmark = pytest.mark.slow

# Ray on 127.0.0.1 (read when ray is imported: set before), and no usage report sent
LOOPBACK_ONLY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
READY = 300.0  # seconds: a cluster, Serve and two replicas starting on 2 busy cores
TOKEN = "token-of-the-cluster"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TALK_STARTS = 16  # Talk sessions started at most until a WHEP offer lands on the other replica

# a loop's build makes the two records a render reads, each a miss where it is built and a
# pull where it is not: the avatar and its mouth bank (every loop is asked whether it talks
# at its build, and one judged not talking gets an empty bank record saying why)
LOOP_RECORDS = 2


def ray_or_fail():
    try:
        import ray  # noqa: F401
        import ray.serve  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("ray[serve] is not installed; CI must have it (pip install -e '.[dev]')")
        pytest.skip("ray[serve] is not installed (pip install 'hotplate[ray]')")


def start_cluster(caches: dict[str, Path]):
    """Two nodes on this machine, one store each (`HOTPLATE_NODE_CACHE`), resources n1
    and n2 naming them; LOOPBACK_ONLY must be in os.environ already."""
    from ray.cluster_utils import Cluster

    env = {
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
        # the one proxy (head node) spreads over both nodes' replicas rather than
        # preferring its own node's: the test needs requests to reach both nodes
        "RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
        # and it asks both replicas their queue at each request: with its 10 s cache, a
        # replica whose entry went stale is passed over for the one just used: on a busy
        # machine a session's WHEP offer went to its owner in 31 starts of 48 (three runs
        # of 16; 20 of 48 without the cache)
        "RAY_SERVE_QUEUE_LENGTH_CACHE_TIMEOUT_S": "0",
    }
    common = {"num_cpus": 2, "include_dashboard": False}
    c = Cluster(
        initialize_head=True,
        head_node_args={
            **common,
            # a head's dashboard agent listens on 52365 unless told otherwise: a free
            # port, so that a cluster of another test process beside this one cannot
            # hold it (the worker node's agent gets a free one from cluster_utils)
            "dashboard_agent_listen_port": 0,
            "resources": {"n1": 1},
            "env_vars": {**env, "HOTPLATE_NODE_CACHE": str(caches["n1"])},
        },
    )
    del common["include_dashboard"]
    c.add_node(
        **common, resources={"n2": 1}, env_vars={**env, "HOTPLATE_NODE_CACHE": str(caches["n2"])}
    )
    return c


@contextlib.contextmanager
def loopback_ray():
    """Every Ray process of the test (nodes, drivers, replicas, workers) inherits these:
    Ray then takes 127.0.0.1 as each node's address, not the first interface's."""
    with environ_set(LOOPBACK_ONLY):
        ray_or_fail()
        yield


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with loopback_ray():
        import ray

        root = tmp_path_factory.mktemp("ray")
        make_world(root, ("studio", "gala", "beach", "dusk", "noon"))
        speech(root / "speech.wav", 1.0)
        speech(root / "long.wav", 30.0, seed=1)
        tier = Nginx(root / "nginx").start()
        caches = {"n1": root / "node1", "n2": root / "node2"}
        c = start_cluster(caches)
        ray.init(address=c.address, namespace="hotplate", log_to_driver=False)
        nodes = {
            n["NodeID"]: name
            for n in ray.nodes()
            for name in ("n1", "n2")
            if name in n["Resources"]
        }
        yield {"root": root, "tier": tier, "caches": caches, "nodes": nodes, "address": c.address}
        ray.shutdown()
        c.shutdown()
        tier.stop()


def counters(cache: Path) -> dict[str, int]:
    if not (cache / "data.mdb").exists():
        return {}
    store = open_store(cache, readonly=True)
    try:
        return {k[6:]: v for k, v in store.items("meta") if k.startswith("count:")}
    finally:
        forget_store(cache)


def hotplate_env(cluster, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HOTPLATE_REMOTE": cluster["tier"].url, "OMP_NUM_THREADS": "1"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def served(cluster):
    """The real `hotplate serve --ray` CLI, two replicas, one per node."""
    root, port = cluster["root"], free_port()
    cmd = invocation(root / "personas", root / "driver-cache", "serve", "--port", str(port))
    cmd += ["--ray", cluster["address"], "--replicas", "2", "--per-node", "1"]
    log = open(root / "serve.log", "wb")
    env = hotplate_env(cluster, HOTPLATE_TOKEN=TOKEN)
    proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY
    while True:
        assert proc.poll() is None, (root / "serve.log").read_text()[-3000:]
        if ready(url):
            break
        assert time.monotonic() < deadline, (root / "serve.log").read_text()[-3000:]
        time.sleep(0.5)
    yield {**cluster, "url": url, "proc": proc}
    proc.send_signal(signal.SIGINT)  # the CLI takes its app down (if no test did)
    proc.wait(timeout=120)


def render(url: str, root: Path, attire: str, audio: str = "speech.wav", timeout: float = 300.0):
    with open(root / audio, "rb") as f:
        return httpx.post(
            url + "/v1/lip-sync",
            data={"persona": "astro", "attire": attire},
            files={"audio": (audio, f, "audio/wav")},
            headers=AUTH,
            timeout=timeout,
        )


@pytest.fixture(scope="module")
def cold_world(tmp_path_factory):
    """The personas and the speech the cold starts share: inputs, not state."""
    root = tmp_path_factory.mktemp("cold")
    make_world(root, ("studio",))
    speech(root / "speech.wav", 1.0)
    return root


def entered(response: httpx.Response) -> str:
    """The replica Serve sent a request to: the one that forwarded it, else the one that
    answered it."""
    headers = response.headers
    return headers.get("x-hotplate-forwarded-by") or headers.get("x-hotplate-replica", "?")


def read_job(url: str, job: str) -> dict:
    """One read through whichever replicas Serve picks: the job's status, a signed URL
    of its video, that URL opened (409 until the video exists, 206 then; a signature
    the owner does not accept is a 403, a job it cannot find a 404)."""
    status = httpx.get(url + job, headers=AUTH, timeout=60)
    signed = httpx.get(url + "/v1/sign", params={"path": job + "/video"}, headers=AUTH, timeout=60)
    video = None
    if signed.status_code == 200:
        video = httpx.get(url + signed.json()["url"], headers={"Range": "bytes=0-99"}, timeout=60)
    return {"status": status, "signed": signed, "video": video}


def reads_through_both(url: str, job: str, owner: str, video_codes: tuple[int, ...]) -> list:
    """Reads of `job`, four at a time (a replica takes two at once: Serve spreads them),
    until both replicas have answered a status and opened a signed video URL, and a URL
    signed by the replica that does not own the job has opened (at most 64 reads)."""
    from concurrent.futures import ThreadPoolExecutor

    def whole(reads: list) -> bool:
        ok = [r for r in reads if good(r, video_codes)]
        statuses = {entered(r["status"]) for r in ok}
        videos = {entered(r["video"]) for r in ok}
        crossed = any(r["signed"].headers["x-hotplate-replica"] != owner for r in ok)
        return len(statuses) == 2 and len(videos) == 2 and crossed

    reads: list = []
    with ThreadPoolExecutor(4) as pool:
        while not whole(reads) and len(reads) < 64:
            reads += pool.map(lambda _: read_job(url, job), range(4))
    return reads


def good(read: dict, video_codes: tuple[int, ...]) -> bool:
    video = read["video"]
    return (
        read["status"].status_code == 200
        and read["signed"].status_code == 200
        and video is not None
        and video.status_code in video_codes
    )


def described(read: dict) -> str:
    return ", ".join(
        f"{name} {r.status_code} via {entered(r)}" for name, r in read.items() if r is not None
    )


@pytest.mark.parametrize("start", [1, 2, 3])
def test_a_cold_two_replica_start_answers_every_read_from_its_first_ready(
    cold_world, tmp_path, start
):
    """A cold start (a new two-node cluster, so a new Serve, a new peer book and new
    replicas; a new store and data dir), three in a row: from the moment /readyz first
    answers 200, a job made then is read, and its video opened through a signed URL,
    through both replicas, and none of those reads fails; later, its video (206) through
    both. (On a first cold start 12 of 24 job reads and signed video GETs failed right
    after /readyz said ready: issue 33.)"""
    with loopback_ray():
        c = start_cluster({"n1": tmp_path / "node1", "n2": tmp_path / "node2"})
        port = free_port()
        cmd = invocation(cold_world / "personas", tmp_path / "cache", "serve", "--port", str(port))
        cmd += ["--ray", c.address, "--replicas", "2", "--per-node", "1"]
        cmd += ["--data", str(tmp_path / "data")]
        log_path = tmp_path / "serve.log"
        env = {**os.environ, "HOTPLATE_TOKEN": TOKEN, "OMP_NUM_THREADS": "1"}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=log)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + READY
            while not ready(url):  # the first 200, then at once:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.05)
            first_ready = time.monotonic()
            with open(cold_world / "speech.wav", "rb") as f:
                made = httpx.post(
                    url + "/v1/renders",
                    data={"persona": "astro", "attire": "studio"},
                    files={"audio": ("speech.wav", f, "audio/wav")},
                    headers=AUTH,
                    timeout=60,
                )
            assert made.status_code == 202, made.text
            job, owner = made.headers["location"], made.headers["x-hotplate-replica"]
            early = reads_through_both(url, job, owner, (409, 206))
            seconds = time.monotonic() - first_ready
            failed = [described(r) for r in early if not good(r, (409, 206))]
            assert not failed, f"{len(failed)} of {len(early)} reads failed: {failed}"
            replicas = {entered(r[k]) for r in early for k in ("status", "video")}
            assert len(replicas) == 2 and owner in replicas, replicas
            print(
                f"start {start}: {len(early)} reads through both replicas, none failed, "
                f"{seconds:.2f} s from the first ready answer"
            )
            while (state := httpx.get(url + job, headers=AUTH, timeout=60).json())["state"] in (
                "queued",
                "running",
            ):
                assert time.monotonic() < deadline + READY, state
                time.sleep(0.2)  # a client polling its job
            assert state["state"] == "done", state
            late = reads_through_both(url, job, owner, (206,))
            failed = [described(r) for r in late if not good(r, (206,))]
            assert not failed, f"{len(failed)} of {len(late)} reads failed: {failed}"
            assert all(len(r["video"].content) == 100 for r in late)
            body = httpx.get(url + "/readyz", timeout=30).json()
            assert body["replicas"] == body["replicas_whole"] == 2, body
        finally:
            proc.send_signal(signal.SIGINT)  # the CLI takes its app down
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=120)
            proc.kill()
            c.shutdown()


def test_a_render_builds_on_one_node_and_the_other_node_pulls(served):
    root, url, nodes, caches = served["root"], served["url"], served["nodes"], served["caches"]
    first = render(url, root, "studio")
    assert first.status_code == 200, first.text
    assert first.headers["x-hotplate-cache"] == "jit"
    builder = nodes[first.headers["x-hotplate-node"]]
    assert counters(caches[builder])["misses"] == LOOP_RECORDS
    # the render worker that built it joined the cluster for the single flight
    assert replica_children_in_cluster(), "no render worker joined the cluster as a driver"
    # Serve spreads unrouted requests by queue length: ask until the other node answers
    other = None
    for _ in range(24):
        again = render(url, root, "studio")
        assert again.status_code == 200, again.text
        if nodes[again.headers["x-hotplate-node"]] != builder:
            other = nodes[again.headers["x-hotplate-node"]]
            break
    assert other is not None, "Serve never routed to the second replica"
    seen = counters(caches[other])
    # both pulled from the builder's node (the bank too), neither built again anywhere
    assert seen.get("misses", 0) == 0 and seen["pulls"] == LOOP_RECORDS, seen
    assert counters(caches[builder])["misses"] == LOOP_RECORDS


def test_requests_naming_an_avatar_stick_to_the_replica_that_has_it(served):
    """Serve's model multiplexing with the avatar's names as the model id: without the
    header requests spread over both replicas (the test above relies on it), with it
    they all go to the replica that served that avatar first."""
    root, url, nodes = served["root"], served["url"], served["nodes"]
    seen = set()
    for _ in range(10):  # spread at random over 2 replicas, 10 land on one 1 time in 512
        with open(root / "speech.wav", "rb") as f:
            response = httpx.post(
                url + "/v1/lip-sync",
                data={"persona": "astro", "attire": "studio"},
                files={"audio": ("speech.wav", f, "audio/wav")},
                headers={**AUTH, "serve_multiplexed_model_id": "astro/studio"},
                timeout=300,
            )
        assert response.status_code == 200, response.text
        seen.add(nodes[response.headers["x-hotplate-node"]])
    assert len(seen) == 1, seen


def test_four_concurrent_cold_renders_over_http_make_one_precompile(served):
    root, url, nodes, caches = served["root"], served["url"], served["nodes"], served["caches"]
    before = {n: counters(c) for n, c in caches.items()}
    responses: list = [None] * 4

    def call(i: int) -> None:
        responses[i] = render(url, root, "noon")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert all(r is not None and r.status_code == 200 for r in responses), responses
    after = {n: counters(c) for n, c in caches.items()}
    built = sum(after[n].get("misses", 0) - before[n].get("misses", 0) for n in caches)
    assert built == LOOP_RECORDS, (before, after)  # each record built once, in one node
    served_by = {nodes[r.headers["x-hotplate-node"]] for r in responses}
    print(f"four cold renders served by {sorted(served_by)}")
    if len(served_by) == 2:  # Serve spread them: the node that did not build pulled
        pulled = sum(after[n].get("pulls", 0) - before[n].get("pulls", 0) for n in caches)
        assert pulled == LOOP_RECORDS, (before, after)


def test_the_job_api_answers_whichever_replica_serve_picks(served):
    """A job lives on one replica; Serve sends each request to either. Status, events,
    a signed video (Range), the list, a stream's job and DELETE all answer, and some of
    them were forwarded by the replica that did not own the job (16 of 24 failed)."""
    root, url = served["root"], served["url"]
    forwarded = answered = 0
    with httpx.Client(base_url=url, headers=AUTH, timeout=300) as c:
        with open(root / "speech.wav", "rb") as f:
            made = c.post(
                "/v1/renders",
                data={"persona": "astro", "attire": "studio"},
                files={"audio": ("speech.wav", f, "audio/wav")},
            )
        assert made.status_code == 202, made.text
        job = made.json()
        owner = made.headers["x-hotplate-node"]
        with open(root / "speech.wav", "rb") as f:
            with c.stream(
                "POST",
                "/v1/lip-sync/stream",
                data={"persona": "astro", "attire": "studio"},
                files={"audio": ("speech.wav", f, "audio/wav")},
            ) as streamed:
                assert streamed.status_code == 200
                stream_job, events = (
                    streamed.headers["x-hotplate-job"],
                    streamed.headers["x-hotplate-events"],
                )
                assert len(streamed.read()) > 1000
        deadline = time.monotonic() + 300
        while (state := c.get(job["status_url"])).json()["state"] not in ("done", "failed"):
            assert state.status_code == 200 and time.monotonic() < deadline, state.text
            time.sleep(0.2)  # a client polling
        job = state.json()
        assert job["state"] == "done", job
        for _ in range(24):  # each read on whichever replica Serve picks
            state = c.get(job["status_url"])
            assert state.status_code == 200 and state.json()["state"] == "done", state.text
            assert state.headers["x-hotplate-node"] == owner  # answered by the owner
            signed = c.get("/v1/sign", params={"path": job["video_url"]}).json()["url"]
            video = httpx.get(url + signed, headers={"Range": "bytes=0-99"}, timeout=60)
            assert video.status_code == 206 and len(video.content) == 100, video.text
            sse_url = url + c.get("/v1/sign", params={"path": events}).json()["url"]
            lines = []
            with httpx.stream("GET", sse_url, timeout=60) as sse:
                assert sse.status_code == 200
                for line in sse.iter_lines():
                    lines.append(line)
                    if line.startswith("data:"):
                        break
            assert "event: done" in lines and json.loads(lines[-1][5:])["id"] == stream_job
            listed = [r["id"] for r in c.get("/v1/renders").json()["renders"]]
            assert job["id"] in listed and stream_job in listed
            for answer in (state, video):
                forwarded += "x-hotplate-forwarded-by" in answer.headers
                answered += 1
        deleted = c.delete(job["status_url"])
        assert deleted.status_code == 200 and deleted.json()["deleted"] is True
        assert c.get(job["status_url"]).status_code == 404
    print(f"{forwarded} of {answered} job reads forwarded to the owner")
    assert 0 < forwarded < answered


def test_a_session_answers_whichever_replica_serve_picks(served):
    """A session lives on one replica (its worker holds the peer connection); Serve sends
    each of its requests to either. The WHEP offer, the speech WebSocket (signed), its
    figures, an interrupt and DELETE all answer, the player gets pictures and the speech
    it sent, and some requests and sockets were forwarded by the other replica (without
    forwarding, the speech sockets that landed there closed with "no live session")."""
    import asyncio

    from testkit.webrtc_peer import WhepPeer, audio_since, rms

    url = served["url"]
    said = (make_speech_audio(0.6, 24000, 3) * 32767).astype("<i2").tobytes()

    async def run() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as c:
            made = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
            assert made.status_code == 201, made.text
            s, owner = made.json(), made.headers["x-hotplate-replica"]
            peer = WhepPeer()
            try:
                answer = await peer.connect(c, s["whep"])
                assert answer.status_code == 201, answer.text
                await asyncio.wait_for(peer.received.first_video.wait(), 60)
                routes = {"forwarded": 0, "direct": 0}
                # a forwarded socket, left open until the session has ended: the last one
                # opened (a session has one speech socket; a newer one replaces it)
                kept = None
                for _ in range(16):  # sockets and reads until both routes were taken
                    spoke = time.monotonic()
                    ws = await speak(url, s, said)
                    by = ws.response.headers.get("x-hotplate-forwarded-by")
                    figures = await c.get(f"/v1/sessions/{s['id']}")
                    assert figures.status_code == 200, figures.text
                    assert figures.headers["x-hotplate-replica"] == owner  # the owner's
                    routes["forwarded" if by else "direct"] += 1
                    routes[
                        "forwarded" if "x-hotplate-forwarded-by" in figures.headers else "direct"
                    ] += 1
                    # the speech reached the owner's worker, and the player hears it
                    deadline = time.monotonic() + 30
                    while rms(audio_since(peer.received, spoke)) < 500:
                        assert time.monotonic() < deadline, "the speech was not heard"
                        await asyncio.sleep(0.1)
                    if by and min(routes.values()) >= 2:
                        kept = ws
                        break
                    await ws.close()
                assert min(routes.values()) >= 2 and kept is not None, routes
                unsigned = url.replace("http", "ws", 1) + s["speech"].split("?")[0]
                import websockets

                with pytest.raises(Exception, match="1008|403"):
                    async with websockets.connect(unsigned) as ws:
                        await ws.send(json.dumps({"sample_rate": 24000, "channels": 1}))
                        await ws.recv()
                # another site's page may not open it, on either replica (the owner's
                # guard judges the Origin a forwarded socket carries)
                for _ in range(6):
                    with pytest.raises(Exception, match="403"):
                        signed = url.replace("http", "ws", 1) + s["speech"]
                        async with websockets.connect(signed, origin="http://evil.example"):
                            pass
                # a replica's peer listener takes no socket without the peer secret
                import ray

                book = ray.get_actor("hotplate-peers", namespace="hotplate")
                for listener in (await book.all.remote()).values():
                    bare = listener.replace("http", "ws", 1) + s["speech"]
                    with pytest.raises(Exception, match="403"):
                        async with websockets.connect(bare):
                            pass
                assert (await c.post(s["interrupt"])).status_code == 204
                assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
                for _ in range(4):  # gone on both replicas
                    gone = await c.get(f"/v1/sessions/{s['id']}")
                    assert gone.status_code == 404, gone.text
                # the socket forwarded before the end: the owner's error and its close
                # (4410, the session ended, and the reason) come through the other replica
                error = json.loads(await asyncio.wait_for(kept.recv(), 20))
                assert error["type"] == "error" and "ended" in error["detail"], error
                await asyncio.wait_for(kept.wait_closed(), 20)
                assert kept.close_code == 4410 and "ended" in kept.close_reason
            finally:
                await peer.close()
            return routes["forwarded"], routes["direct"]

    forwarded, direct = asyncio.run(run())
    print(f"session: {forwarded} requests and sockets forwarded to the owner, {direct} direct")


def test_the_page_works_against_two_replicas_in_chromium(served, tmp_path):
    """The editors' page (token prompt, a render, progress over a signed EventSource, the
    signed video playing, the renders table), each request on whichever replica."""
    from testkit.preconditions import require

    require(CHROMIUM, "needs Debian's chromium (just setup installs it)")
    from playwright.sync_api import sync_playwright

    wav = speech(tmp_path / "line.wav", 1.0)
    with sync_playwright() as p:
        args = ["--no-sandbox"] if os.geteuid() == 0 else []
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        page = browser.new_page(viewport={"width": 1360, "height": 980})
        errors, nodes = [], set()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda dialog: dialog.accept(TOKEN))
        page.on("response", lambda r: nodes.add(r.headers.get("x-hotplate-node")))
        page.goto(served["url"] + "/")
        card = page.get_by_test_id("card-astro-studio")
        card.wait_for(timeout=60_000)
        card.click()
        page.set_input_files("#audio", str(wav))
        page.uncheck("#stream")  # the whole file: its video is a signed <video src>
        page.click("#render")
        page.wait_for_function(
            "() => document.getElementById('progress-pct').textContent === '100%'",
            timeout=240_000,
        )
        page.wait_for_function(
            "() => document.getElementById('player').readyState >= 2", timeout=60_000
        )
        duration = page.evaluate("document.getElementById('player').duration")
        assert abs(duration - 1.0) <= 0.1, duration
        page.wait_for_selector("#renders tr .pill.done", timeout=30_000)
        assert page.inner_text("#error") == ""
        browser.close()
    assert errors == []
    print(f"the page was answered by nodes {sorted(n for n in nodes if n)}")


def test_talk_mode_in_chromium_against_two_replicas(served, tmp_path):
    """The page's Talk mode (token prompt, POST /v1/sessions, WHEP with trickled
    candidates, "Say the clip" over the speech socket, interrupt over the data channel,
    the session ended), each request on whichever replica, until the page's WHEP offer
    went to the replica that did not make the session (Serve picks: 1 in 2 a start, so
    TALK_STARTS miss together 1 run in 2**TALK_STARTS)."""
    from playwright.sync_api import sync_playwright

    from hotplate.demo_data import write_wav
    from testkit import page_frames
    from testkit.preconditions import require

    require(CHROMIUM, "needs Debian's chromium (just setup installs it)")
    microphone = tmp_path / "quiet.wav"  # the clip speaks, not the microphone
    write_wav(microphone, np.zeros(48000, np.float32), 48000)
    clip = speech(tmp_path / "clip.wav", 8.0)  # 200 frames if it played whole
    url = served["url"]

    def figures(session: str) -> dict:
        answer = httpx.get(f"{url}/v1/sessions/{session}", headers=AUTH, timeout=30)
        assert answer.status_code == 200, answer.text
        return answer.json()

    with sync_playwright() as p:
        args = page_frames.talk_args(microphone)
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args, headless=True)
        page = browser.new_page(viewport={"width": 1360, "height": 980})
        errors, forwarded = [], []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("dialog", lambda dialog: dialog.accept(TOKEN))
        page.on(
            "response",
            lambda r: (
                forwarded.append(r.url)
                if "/whep" in r.url and r.headers.get("x-hotplate-forwarded-by")
                else None
            ),
        )
        page.goto(url + "/")
        card = page.get_by_test_id("card-astro-studio")
        card.wait_for(timeout=60_000)
        card.click()
        starts = 0
        while starts < TALK_STARTS:  # sessions started until one's WHEP offer was forwarded
            starts += 1
            page.click("#talk")
            page.wait_for_function(
                "() => window.hotplateTalk.connected"
                " && document.getElementById('player').readyState >= 2",
                timeout=120_000,
            )
            if forwarded:
                break
            page.click("#talk")  # ends it
            page.wait_for_function("() => window.hotplateTalk.state === 'idle'", timeout=30_000)
        assert forwarded, f"no WHEP offer of {starts} went to the other replica"
        assert page.evaluate("document.getElementById('player').videoWidth") == 270
        session = page.evaluate("window.hotplateTalk.id")
        page.set_input_files("#audio", str(clip))
        page.click("#say")
        deadline = time.monotonic() + 60
        while figures(session)["speaking_frames"] == 0:  # the clip reached the worker
            assert time.monotonic() < deadline, "the clip never reached the session"
            time.sleep(0.2)
        page.click("#interrupt")
        # the mouth stops: speaking frames stop growing well before the clip's 200
        deadline, last = time.monotonic() + 60, -1
        while (now := figures(session)["speaking_frames"]) != last:
            assert time.monotonic() < deadline, "the session went on speaking"
            last = now
            time.sleep(1.0)
        assert last < 150, f"{last} frames spoken: the interrupt did not stop the clip"
        page.click("#talk")  # ends the session
        page.wait_for_function("() => window.hotplateTalk.state === 'idle'", timeout=30_000)
        assert page.inner_text("#error") == ""
        browser.close()
    assert errors == []
    for _ in range(4):  # gone on both replicas
        gone = httpx.get(f"{url}/v1/sessions/{session}", headers=AUTH, timeout=30)
        assert gone.status_code == 404, gone.text
    print(f"talk: WHEP forwarded at start {starts}; {last} frames spoken of 200")


def test_four_concurrent_cold_precompiles_across_both_nodes_make_one(cluster):
    import ray

    from hotplate.cluster.serve import settings_env
    from hotplate.cluster.sync import build_one
    from hotplate.settings import load_settings

    root, caches = cluster["root"], cluster["caches"]
    settings = load_settings(personas=root / "personas", cache=root / "unused")
    settings.remote = cluster["tier"].url
    env = {"env_vars": settings_env(settings)}
    task = ray.remote(num_cpus=0.25)(build_one)
    path = str(root / "personas" / "astro" / "gala.mp4")
    before = {n: counters(c).get("misses", 0) for n, c in caches.items()}
    refs = [
        task.options(resources={node: 0.01}, runtime_env=env).remote("astro", "gala", "M", path)
        for node in ("n1", "n2", "n1", "n2")
    ]
    results = ray.get(refs, timeout=600)
    assert all(r.state != "failed" for r in results), [r.error for r in results]
    assert sorted(r.state for r in results).count("built") == 1, [r.state for r in results]
    after = {n: counters(c).get("misses", 0) for n, c in caches.items()}
    assert sum(after.values()) - sum(before.values()) == LOOP_RECORDS, (before, after)
    # the node that did not build pulled it once
    assert {cluster["nodes"][r.node] for r in results} == {"n1", "n2"}


def test_a_wait_for_another_nodes_build_ends_at_flight_wait(cluster, tmp_path, monkeypatch):
    """Another node holds the cluster's lease on an avatar and never finishes: a
    precompile here waits for it at most its own flight_wait, says whom it waits for,
    then builds itself. (It waited ray_flight's 900 s whatever its caller's flight_wait.)"""
    import ray

    from cachestore.remote.ray_flight import ADDRESS_ENV, flight_actor
    from cachestore.remote.tier import attach
    from hotplate.settings import load_settings
    from pipeline.catalog import plan_for
    from pipeline.precompile.run import precompile

    root = cluster["root"]
    source = root / "personas" / "astro" / "beach.mp4"
    monkeypatch.setenv(ADDRESS_ENV, cluster["address"])  # this process takes part
    settings = load_settings(None, personas=root / "personas", cache=tmp_path / "cache")
    store = open_store(settings.cache)
    attach(settings.cache, cluster["tier"].url)
    key = plan_for(store, source, settings.recipe).avatar
    actor, other = flight_actor(), "elsewhere:/another/store"
    assert ray.get(actor.acquire.remote(key, other, 600.0)) is None
    said, outcome = [], {}

    def build() -> None:
        outcome["report"] = precompile(
            source, settings.recipe, store, flight_wait=2.0, on_wait=said.append
        )

    thread = threading.Thread(target=build, daemon=True)
    try:
        thread.start()
        thread.join(timeout=240)
        assert not thread.is_alive(), "the precompile waited past its flight_wait"
    finally:
        ray.get(actor.release.remote(key, other))
        thread.join(timeout=600)
        forget_store(settings.cache)
    assert any(f"waiting for {other} (another node)" in line for line in said), said
    assert not outcome["report"].hit  # built here once the wait was over


def test_sync_on_ray_pushes_what_it_builds(cluster):
    root = cluster["root"]
    cmd = invocation(root / "personas", root / "driver-cache", "sync", "--ray", cluster["address"])
    result = subprocess.run(
        cmd, cwd=root, env=hotplate_env(cluster), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr
    assert ", 0 failed on" in result.stdout and "built" in result.stdout, result.stdout
    assert "[6/6]" in result.stderr, result.stderr  # five loops and the portrait
    # every file is on the tier now: a fresh store pulls them all, building none
    pull = subprocess.run(
        invocation(root / "personas", root / "fresh", "pull"),
        cwd=root,
        env=hotplate_env(cluster),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pull.returncode == 0, pull.stderr
    assert "6 pulled" in pull.stdout, pull.stdout


def test_replica_killed_mid_request_is_an_error_not_a_hang(served):
    from cachestore.leases import live_leases

    root, url, caches = served["root"], served["url"], served["caches"]
    outcome: dict = {}

    def call() -> None:
        try:
            outcome["response"] = render(url, root, "dusk", "long.wav", timeout=240)
        except httpx.HTTPError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    leases, deadline = [], time.monotonic() + 240
    while not leases and time.monotonic() < deadline and thread.is_alive():
        leases = [info for c in caches.values() for info in live_leases(c, clean=False)]
        time.sleep(0.05)
    assert leases, f"the render never started: {outcome}"
    kill_replica_of(leases[0].holder.pid)  # the render worker's
    thread.join(timeout=300)
    assert not thread.is_alive(), "the client hung after its replica died"
    # a clean error (5xx, or the connection dropped by the proxy) or a retry that
    # succeeded; the client's own timeout would be the hang this test is about
    assert not isinstance(outcome.get("error"), httpx.TimeoutException), outcome
    response = outcome.get("response")
    assert response is None or response.status_code >= 500 or response.status_code == 200, outcome
    # Serve starts a new replica and the service answers again
    print(f"client saw: {outcome}")  # which of the two, in the -s output
    wait_back(url, "after its replica died")


def test_a_forwarded_speech_socket_ends_in_one_line_when_its_owner_dies(served):
    """The session's replica is killed (kill -9) while a speech socket the other replica
    forwards to it is open: that socket closes with 1011 and one line saying why (not a
    hang, not a bare 1006), and the session then reads 404, not a hang."""
    import asyncio

    from cachestore.leases import live_leases
    from hotplate.cluster.peers import GONE

    url, caches = served["url"], served["caches"]
    said = (make_speech_audio(0.4, 24000, 5) * 32767).astype("<i2").tobytes()

    async def run() -> tuple[int, str]:
        async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=120) as c:
            made = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
            assert made.status_code == 201, made.text
            s = made.json()
            kept = None
            for _ in range(16):  # until Serve sends a socket to the replica that forwards
                ws = await speak(url, s, said)
                if ws.response.headers.get("x-hotplate-forwarded-by"):
                    kept = ws
                    break
                await ws.close()
            assert kept is not None, "no speech socket was forwarded in 16"
            # the session's worker holds the only lease
            holders = {i.holder.pid for cache in caches.values() for i in live_leases(cache)}
            assert len(holders) == 1, f"leases held by {holders}: not the session's alone"
            kill_replica_of(holders.pop())
            await asyncio.wait_for(kept.wait_closed(), 120)
            gone = await c.get(f"/v1/sessions/{s['id']}")
            assert gone.status_code == 404, gone.text
            return kept.close_code, kept.close_reason

    code, reason = asyncio.run(run())
    print(f"the forwarded socket closed: {code} {reason!r}")
    assert (code, reason) == (1011, GONE)
    wait_back(url, "after the session's replica died")


def kill_replica_of(worker: int) -> None:
    """kill -9 the Serve replica a render worker (pid) runs under: its parent."""
    replica = parent(worker)
    assert "ServeReplica" in Path(f"/proc/{replica}/cmdline").read_text(errors="replace")
    os.kill(replica, signal.SIGKILL)


def wait_back(url: str, why: str) -> None:
    """Until /readyz says 200 again (Serve starts a new replica), READY s at most."""
    deadline = time.monotonic() + READY
    while not ready(url):
        assert time.monotonic() < deadline, f"the deployment did not come back {why}"
        time.sleep(0.5)


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def replica_children_in_cluster() -> list[int]:
    """Live Ray drivers whose parent is a Serve replica: its render workers."""
    import ray

    found = []
    for job in ray._private.state.jobs():
        pid = int(job.get("DriverPid") or 0)
        if job.get("IsDead") or not pid or not Path(f"/proc/{pid}").exists():
            continue
        cmdline = Path(f"/proc/{parent(pid)}/cmdline").read_text(errors="replace")
        if "ServeReplica" in cmdline:
            found.append(pid)
    return found


def ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=30).status_code == 200
    except httpx.TransportError:
        return False


def serve_controller_pid() -> int:
    """This cluster's Serve controller actor's process, from the cluster's own actor
    table: a scan of /proc for `ray::ServeController` could find (and stop) another
    test process's cluster's controller."""
    import ray

    alive = [
        a["Pid"]
        for a in ray._private.state.actors().values()
        if a["ActorClassName"] == "ServeController" and a["State"] == "ALIVE"
    ]
    assert len(alive) == 1, f"this cluster's live ServeController actors' pids: {alive}"
    cmdline = Path(f"/proc/{alive[0]}/cmdline").read_bytes()
    assert cmdline.startswith(b"ray::ServeController"), cmdline[:80]
    return alive[0]


def test_a_stopped_controller_makes_readyz_503_not_a_hang(served):
    """Serve's controller stopped (SIGSTOP: alive, answering nothing): `/readyz` answers
    503 within the readiness bound, not when the prober gives up, then 200 once it is
    back."""
    url, pid = served["url"], serve_controller_pid()
    assert ready(url)
    os.kill(pid, signal.SIGSTOP)
    try:
        answer = httpx.get(url + "/readyz", timeout=30)  # hung without the bound
        assert answer.status_code == 503, answer.text
        assert answer.json()["replicas_running"] == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_back(url, "after SIGCONT")


def test_sigterm_drains_the_replicas_a_queued_render_finishes_whole(served):
    """Last in the module: it takes the app down."""
    root, url, proc = served["root"], served["url"], served["proc"]
    with open(root / "long.wav", "rb") as f:
        queued = httpx.post(
            url + "/v1/renders",
            data={"persona": "astro", "attire": "studio"},
            files={"audio": ("long.wav", f, "audio/wav")},
            headers=AUTH,
            timeout=300,
        )
    assert queued.status_code == 202, queued.text
    job_id = queued.json()["id"]
    proc.send_signal(signal.SIGTERM)  # Serve stops the replicas gracefully
    assert proc.wait(timeout=300) == 0, (root / "serve.log").read_text()[-3000:]
    import sqlite3

    found = []
    for db in root.glob("node*-serve/replica-*/jobs.sqlite"):
        with sqlite3.connect(db) as c:
            found += c.execute("SELECT state, video FROM jobs WHERE id = ?", (job_id,)).fetchall()
    assert len(found) == 1, found
    state, video = found[0]
    assert state == "done" and video and Path(video).stat().st_size > 0, found


def test_readyz_says_503_while_a_wanted_replica_cannot_start(cluster, tmp_path):
    """Three replicas wanted, at most one per node, two nodes: two start, the third
    never can. Once both report (the body counts them), /readyz is still 503, whichever
    replica answers: ready means every replica wanted is up, not the one that answered."""
    from ray import serve

    # a Serve of its own, on its own port: the module's (if any) keeps its first port
    serve.shutdown()
    root, port = cluster["root"], free_port()
    cmd = invocation(root / "personas", tmp_path / "cache", "serve", "--port", str(port))
    cmd += ["--ray", cluster["address"], "--replicas", "3", "--per-node", "1"]
    cmd += ["--data", str(tmp_path / "data")]
    log_path = tmp_path / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=hotplate_env(cluster), stdout=log, stderr=log)
    url, answers = f"http://127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + READY
        while True:  # until both replicas that can start run (Serve) and agree (probe)
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, (answers[-3:], log_path.read_text()[-3000:])
            try:
                answer = httpx.get(url + "/readyz", timeout=30)
            except httpx.TransportError:
                answer = None
            if answer is not None and answer.headers.get("content-type") == "application/json":
                answers.append((answer.status_code, answer.json()))
                body = answer.json()
                if body.get("replicas_whole") == body.get("replicas_running") == 2:
                    break
            time.sleep(0.2)
        replicas = set()
        for _ in range(8):  # each replica says so
            answer = httpx.get(url + "/readyz", timeout=30)
            body = answer.json()
            assert answer.status_code == 503 and body["ready"] is False, body
            assert body["replicas"] == 3 and body["replicas_running"] == 2, body
            replicas.add(answer.headers["x-hotplate-replica"])
        print(f"/readyz 503 from {len(replicas)} replicas: {body}")
    finally:
        proc.send_signal(signal.SIGINT)  # the CLI takes its app down
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=120)
        proc.kill()

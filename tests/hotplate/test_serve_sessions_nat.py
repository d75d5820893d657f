"""A conversation session through a real NAT (testkit/nat.py: Linux network namespaces,
nftables masquerading the player's private network): `hotplate serve` in the server's
namespace, listening on its own address (so it offers every interface's candidates, as
on a host), and an aiortc player in the player's namespace offering only its private
address, which the server cannot reach. ICE forms through the NAT's mapping: the
server learns the player's outside address from its checks (`prflx`), the player gets
pictures and hears the turn it spoke, and the session's figures say the media went to
that address. Then both ends behind NATs (testkit.nat.TwoNats), a real STUN server
(coturn) between them. Needs root, iproute2, nftables and coturn (`just setup` installs
them)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest

from hotplate.cli.common import invocation
from testkit.nat import (
    NET_TO_SERVER,
    PLAYER,
    PLAYER_OUTSIDE,
    SERVER,
    SERVER_OUTSIDE,
    Nat,
    TwoNats,
)
from testkit.serve_helpers import make_world
from testkit.turn import Coturn

pytestmark = pytest.mark.slow
PORT = 8700  # the server's namespace is its own: any port is free there
TOKEN = "token-behind-the-nat"  # a server beyond loopback needs one
ENV = {"HOTPLATE_SESSION_ICE_TIMEOUT": "10", "OMP_NUM_THREADS": "1", "HOTPLATE_TOKEN": TOKEN}

# run in the player's namespace: waits for the server, plays a session with a turn of
# speech, prints what it saw as JSON
PLAYER_SCRIPT = """
import asyncio, json, sys, time, httpx
from hotplate.demo_data import make_speech_audio
from testkit.serve_helpers import speak
from testkit.webrtc_peer import WhepPeer, audio_since, rms

async def until(check, seconds, what):
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        await asyncio.sleep(0.2)

async def main(url, player, token, stun):
    auth = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=auth) as c:
        async def ready():
            try:
                return (await c.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False
        await until(ready, 120, "the server in its namespace")
        pre = await c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"})
        job = pre.json()
        async def built():
            return (await c.get(job["status_url"])).json()["state"] in ("done", "failed")
        await until(built, 300, "the precompile")
        r = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
        assert r.status_code == 201, r.text
        s = r.json()
        peer = WhepPeer(host=(player,), stun=stun or None)
        answer = await peer.connect(c, s["whep"])
        assert answer.status_code == 201, answer.text
        await asyncio.wait_for(peer.received.first_video.wait(), 60)
        spoke = time.monotonic()
        pcm = (make_speech_audio(1.0, 24000, 0) * 32767).astype("<i2").tobytes()
        ws = await speak(url, s, pcm)
        async def heard():
            return rms(audio_since(peer.received, spoke)) > 500
        await until(heard, 30, "the turn's speech at the player")
        async def pictures():
            return len(peer.received.video) >= 50
        await until(pictures, 30, "2 s of pictures")
        await ws.close()
        figures = (await c.get(f"/v1/sessions/{s['id']}")).json()
        assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
        sdp = peer.pc.localDescription.sdp
        await peer.close()
        print(json.dumps({
            "offered": [x for x in sdp.splitlines() if x.startswith("a=candidate")],
            "answered": [x for x in answer.text.splitlines() if x.startswith("a=candidate")],
            "pictures": len(peer.received.video),
            "ice": figures["ice"],
        }), flush=True)

asyncio.run(main(*sys.argv[1:5]))
"""


def play_through(nat: Nat, root, url: str, serve_args: list[str], stun: str = "") -> dict:
    """`hotplate serve` in the server's namespace and PLAYER_SCRIPT in the player's: what
    the player saw (its last line's JSON), and the server's log."""
    serve = invocation(root / "personas", root / "cache", "serve")
    serve += ["--host", SERVER, "--port", str(PORT), *serve_args]
    log = open(root / "serve.log", "wb")
    server = subprocess.Popen(
        nat.command(nat.server, serve), cwd=root, env={**os.environ, **ENV}, stdout=log, stderr=log
    )
    out, err = open(root / "player.out", "w"), open(root / "player.err", "w")
    player = subprocess.Popen(
        nat.command(nat.player, [sys.executable, "-c", PLAYER_SCRIPT, url, PLAYER, TOKEN, stun]),
        stdout=out,
        stderr=err,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        # the player's own waits are bounded; a server that exits ends it at once
        while player.poll() is None and server.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                player.wait(timeout=1.0)
    finally:
        if player.poll() is None:
            player.kill()
            player.wait()
        server.terminate()
        server.wait(timeout=60)
        for f in (log, out, err):
            f.close()
    said = (root / "serve.log").read_text(errors="replace")
    failed = (root / "player.err").read_text(errors="replace")
    assert player.returncode == 0, failed[-3000:] + said[-2000:]
    assert "session " in said and " ended after " in said
    seen = json.loads((root / "player.out").read_text().strip().splitlines()[-1])
    print(seen)
    assert seen["pictures"] >= 50, seen
    return seen


def test_a_player_behind_a_nat_plays_a_session(tmp_path):
    root = make_world(tmp_path)
    with Nat() as nat:
        seen = play_through(nat, root, f"http://{SERVER}:{PORT}", [])
    # the player offered only its private address; the server answered with its own
    assert seen["offered"] and all(f" {PLAYER} " in x for x in seen["offered"]), seen
    assert any(f" {SERVER} " in x for x in seen["answered"]), seen
    # the media went to the address the NAT gave the player, learnt from its checks
    assert seen["ice"]["selected"] == "prflx", seen


def test_both_ends_behind_nats_play_a_session(tmp_path):
    """The server behind a NAT of its own too (testkit.nat.TwoNats), its API reached on
    its router's forwarded port, and a real STUN server (coturn) between the two NATs
    named to both (`--ice-server`): each learns its NAT's outside address, and the media
    passes only where both sides' checks opened their NATs' mappings."""
    root = make_world(tmp_path)
    with TwoNats(PORT) as nat:
        with Coturn(
            tmp_path / "stun", "hot", "plate", NET_TO_SERVER, nat.command(nat.net, [])
        ) as c:
            url = f"http://{SERVER_OUTSIDE}:{PORT}"
            # the router's address is the name the player uses, as a proxy's would be
            serve_args = ["--ice-server", c.stun, "--allowed-host", SERVER_OUTSIDE]
            seen = play_through(nat, root, url, serve_args, stun=c.stun)

    def outside(lines: list[str], address: str) -> bool:
        return any(f" {address} " in x and " typ srflx" in x for x in lines)

    # each side's answer or offer carried its NAT's outside address, from the STUN server
    assert outside(seen["offered"], PLAYER_OUTSIDE), seen
    assert outside(seen["answered"], SERVER_OUTSIDE), seen
    # and the media went to the player's outside address: its own candidate, or the same
    # address learnt from its checks first
    assert seen["ice"]["selected"] in ("srflx", "prflx"), seen

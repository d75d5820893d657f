"""`POST /v1/lip-sync` with backend=musetalk on an upstream-layout `models/` folder (tiny
random weights): the service chooses the recipe by the same rule as `hotplate render`, so
it finds upstream's `sd-vae/` instead of asking for `sd-vae-ft-mse/` and answering 503.

The detector is dlib's and the landmarks the default ones, set in the settings
(HOTPLATE_*): random S3FD weights find no face, and the folder has no DWPose weights. The
landmarks are the default value, set explicitly: musetalk's DWPose must not replace them
(it did, then 503 for weights nobody asked for). Everything else is what musetalk implies (BiSeNet, v1.5
crops, sd-vae/).
"""

import pytest

from pipeline.precompile.recipe import Recipe
from testkit.serve_helpers import (
    Server,
    make_world,
    mp4_facts,
    post_render,
    precompiled,
    speak,
    speech,
)
from tests.pipeline.parity_fixtures import save_upstream_models

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = make_world(tmp_path_factory.mktemp("serve-musetalk"), n_frames=6)
    speech(root / "one.wav", 1.0)
    save_upstream_models(root / "models")
    return root


def test_lip_sync_with_musetalk_on_an_upstream_models_folder(world, tmp_path):
    env = {"HOTPLATE_DETECTOR": "dlib", "HOTPLATE_LANDMARKS": Recipe().landmarks}
    env["HOTPLATE_MODELS"] = str(world / "models")
    with Server(world, "--workers", "1", env=env) as srv, srv.client() as client:
        response = post_render(client, "/v1/lip-sync", world / "one.wav", backend="musetalk")
        assert response.status_code == 200, response.text
        assert response.headers["x-hotplate-cache"] == "jit"
        facts = mp4_facts(response.content, tmp_path / "mt.mp4")
        assert facts["video"] == "h264" and facts["audio"] == "aac"
        assert abs(facts["seconds"] - 1.0) <= 0.05


def test_a_conversation_session_renders_with_musetalk(world):
    """A conversation session on a server whose renderer is musetalk (the same tiny
    upstream-layout weights): the loop plays at rest between turns (the stored frames), a
    turn's pictures carry musetalk's mouth (random weights: the mouth region is not the
    stored one) with the speech's sound, then rest again. On CPU a frame takes whisper on
    its window (~0.3 s), so the session runs behind its clock: pictures are counted, not
    timed."""
    import asyncio

    import httpx

    from cachestore.store import forget_store, open_store
    from hotplate.demo_data import make_speech_audio
    from pipeline.hot import load_assets
    from testkit.mouth_reader import AT_REST, MouthReader
    from testkit.webrtc_peer import WhepPeer, audio_since, rms

    env = {"HOTPLATE_DETECTOR": "dlib", "HOTPLATE_LANDMARKS": Recipe().landmarks}
    env.update(HOTPLATE_MODELS=str(world / "models"), HOTPLATE_RENDERER="musetalk")
    pcm = (make_speech_audio(1.0, 24000, 0) * 32767).astype("<i2").tobytes()

    async def pictures(peer: WhepPeer, n: int) -> None:
        deadline = asyncio.get_running_loop().time() + 180
        while len(peer.received.video) < n:
            assert asyncio.get_running_loop().time() < deadline, f"{n} pictures in 180 s"
            await asyncio.sleep(0.05)

    async def run(srv: Server, reader: MouthReader) -> dict:
        async with httpx.AsyncClient(base_url=srv.url, timeout=300) as c:
            r = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
            assert r.status_code == 201, r.text
            s = r.json()
            peer = WhepPeer()
            assert (await peer.connect(c, s["whep"])).status_code == 201
            await pictures(peer, 10)
            ws = await speak(srv.url, s, pcm)
            spoke, at = len(peer.received.video), peer.received.video[-1][0]
            await pictures(peer, spoke + 50)
            await ws.close()
            figures = (await c.get(f"/v1/sessions/{s['id']}")).json()
            assert (await c.delete(f"/v1/sessions/{s['id']}")).status_code == 204
            await peer.close()
        video = peer.received.video
        score = [reader.read(y)[1] for _, y in video]
        assert max(score[:spoke]) < AT_REST  # listening: the stored frames
        assert max(score[spoke : spoke + 35]) > 2 * AT_REST  # the turn: musetalk's mouths
        # at rest again: the stored frames (test_conversation), which VP8 at 1.5 Mbit/s
        # takes a second or more to clean of the mouths' traces (5.3-6.8 here, 2.6-4.0
        # before the turn)
        assert max(score[spoke + 40 :]) < 2 * AT_REST
        assert rms(audio_since(peer.received, at)) > 500
        return figures

    with Server(world, "--workers", "1", env=env) as srv:
        avatar = precompiled(srv)
        store = open_store(world / "cache")
        try:
            figures = asyncio.run(run(srv, MouthReader(load_assets(store, avatar))))
        finally:
            forget_store(world / "cache")
    # (behind its clock, the session sends late pictures in bursts and its video track
    # keeps only the newest: a dropped picture here is the CPU's, not musetalk's)
    assert figures["speaking_frames"] >= 25, figures

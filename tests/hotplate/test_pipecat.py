"""A real Pipecat pipeline with the hotplate service (issue 47 item 4): espeak-ng's
voice as the TTS service, a scripted two-turn reply in place of a language model, the
avatar service, and a recorder where a transport would be; interrupted once, offline.
Then the same service through Pipecat's own WebRTC transport (SmallWebRTC) to a real
aiortc player on loopback. The pictures are judged by their pixels (testkit/mouth_reader.py), not by what the
service says it drew."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path, PosixPath

import numpy as np
import pytest
from pipecat.frames.frames import (
    EndFrame,
    InterruptionFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from hotplate.cli.common import invocation
from hotplate.integrations.pipecat import HotplateVideoService
from hotplate.integrations.pipecat.espeak import EspeakTTSService
from testkit.mouth_reader import AT_REST, OPEN, MouthReader
from testkit.serve_helpers import make_world

pytestmark = pytest.mark.slow

RATE = 24000  # the pipeline's output rate (Pipecat's default)
TURNS = (
    "Hello. I am the presenter, and I can hear you now.",
    "Let me tell you a much longer story, about a fox who jumped over a very lazy dog, "
    "again and again, all through the long summer afternoon.",
)
# over WebRTC the pictures are VP8's: a mouth at rest reads up to ~5 (its first
# pictures, as the encoder ramps up, up to ~6); the browser test's bound
WEBRTC_REST = 7.0
WAIT = 300.0  # s: a bound on every wait, never a timing under test


class Recorder(FrameProcessor):
    """Where the transport would be: every frame that reaches it, in order, with events
    a test waits on."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, object]] = []  # (kind, payload)
        self.changed = asyncio.Event()

    async def process_frame(self, frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, OutputImageRawFrame):
            self.seen.append(("image", frame))
        elif isinstance(frame, TTSAudioRawFrame):
            self.seen.append(("audio", frame))
        elif isinstance(frame, (TTSStartedFrame, TTSStoppedFrame, InterruptionFrame)):
            self.seen.append((type(frame).__name__, frame))
        self.changed.set()
        await self.push_frame(frame, direction)

    async def until(self, what, why: str) -> None:
        deadline = time.monotonic() + WAIT
        while not what():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"never {why}: {self.kinds()[-20:]}")
            await asyncio.wait_for(self.changed.wait(), left)

    def kinds(self) -> list[str]:
        return [k for k, _ in self.seen]

    def count(self, kind: str) -> int:
        return sum(k == kind for k, _ in self.seen)


class World(PosixPath):
    """The test's folder, and `avatar`: its hot avatar's key."""

    avatar = ""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A personas folder whose loop is hot."""
    root = World(make_world(tmp_path_factory.mktemp("pipecat")))
    loop = root / "personas" / "astro" / "studio.mp4"
    precompile = invocation(root / "personas", root / "cache", "precompile", str(loop))
    done = subprocess.run(precompile, check=True, capture_output=True, text=True, timeout=600)
    root.avatar = done.stdout.split("avatar ")[-1].split()[0]  # its key, as it printed it
    return root


@pytest.fixture(scope="module")
def reader(world):
    """What a picture's mouth is, read from its pixels (testkit/mouth_reader.py)."""
    from cachestore.store import forget_store, open_store
    from pipeline.hot import load_assets

    try:
        return MouthReader(load_assets(open_store(world / "cache"), world.avatar))
    finally:
        forget_store(world / "cache")


async def poll(what, why: str, alive) -> None:
    """Until `what()`; fails if `alive()` stops being true first, or after WAIT s."""
    deadline = time.monotonic() + WAIT
    while not what():
        assert time.monotonic() < deadline and alive(), f"never {why}"
        await asyncio.sleep(0.02)


def espeak_seconds(text: str, tmp_path) -> float:
    from pipeline.render.audio import load_audio
    from testkit.mouth_fixtures import espeak

    return load_audio(espeak(text, tmp_path / "turn.wav"), 16000).size / 16000


async def converse(world) -> tuple[Recorder, HotplateVideoService, int]:
    """The two turns: listen a second, turn 1 in full, listen a second, turn 2 cut a
    second in by an interruption, listen a second, end. Returns the recorder, the
    service, and the index in `seen` where the interruption reached the recorder."""
    tts = EspeakTTSService()
    avatar = HotplateVideoService(
        "astro", "studio", personas=world / "personas", cache=world / "cache"
    )
    rec = Recorder()
    task = PipelineWorker(
        Pipeline([tts, avatar, rec]), params=PipelineParams(audio_out_sample_rate=RATE)
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(task)
    run = asyncio.create_task(runner.run())
    images = lambda: rec.count("image")  # noqa: E731
    try:
        await rec.until(lambda: images() >= 25, "a second of listening")
        await task.queue_frame(TTSSpeakFrame(TURNS[0]))
        await rec.until(lambda: rec.count("TTSStoppedFrame") == 1, "turn 1 ended")
        mark = images()
        await rec.until(lambda: images() >= mark + 25, "a second of listening after turn 1")
        spoken = rec.count("audio")
        await task.queue_frame(TTSSpeakFrame(TURNS[1]))
        await rec.until(lambda: rec.count("audio") >= spoken + 25, "a second of turn 2")
        await task.queue_frame(InterruptionFrame())
        await rec.until(lambda: rec.count("InterruptionFrame") == 1, "the interruption")
        cut = rec.kinds().index("InterruptionFrame")
        await rec.until(lambda: images() >= rec.kinds()[:cut].count("image") + 25, "rest")
        await task.queue_frame(EndFrame())
        await asyncio.wait_for(run, WAIT)
    finally:
        if not run.done():
            await task.cancel()
            await run
    return rec, avatar, cut


def test_a_pipecat_pipeline_speaks_two_turns_through_the_avatar_and_is_interrupted(world, tmp_path):
    from cachestore.store import forget_store, open_store
    from pipeline.hot import load_assets
    from pipeline.yuv import frame_from_rgb, planes

    rec, avatar, cut = asyncio.run(converse(world))
    store = open_store(world / "cache")
    try:
        reader = MouthReader(load_assets(store, avatar.avatar))
    finally:
        forget_store(world / "cache")

    def mouth(image: OutputImageRawFrame) -> float:
        rgb = np.frombuffer(image.image, np.uint8).reshape(image.size[1], image.size[0], 3)
        return reader.read(planes(frame_from_rgb(rgb))[0])[1]

    seen, kinds = rec.seen, rec.kinds()
    stop_1 = kinds.index("TTSStoppedFrame")
    images = [(i, f) for i, (k, f) in enumerate(seen) if k == "image"]
    assert all(f.size == avatar.size and f.sync_with_audio for _, f in images)

    # every picture that carries speech comes right after its own audio: audio, image
    for i, (kind, frame) in enumerate(seen):
        if kind == "audio":
            assert frame.sample_rate == RATE and len(frame.audio) == 2 * RATE // 25
            assert kinds[i + 1] == "image", kinds[i - 3 : i + 3]
    speaking = {i + 1 for i, k in enumerate(kinds) if k == "audio"}

    # turn 1 said in full: its audio is espeak-ng's length for it (to a frame or two),
    # and the held TTSStoppedFrame comes after its last audio
    turn_1 = [f for k, f in seen[:stop_1] if k == "audio"]
    said = sum(len(f.audio) for f in turn_1) / 2 / RATE
    assert abs(said - espeak_seconds(TURNS[0], tmp_path)) <= 3 / 25, said
    assert "audio" not in kinds[stop_1:][: kinds[stop_1:].index("image") + 1]

    # the mouth opens while it speaks and rests while it listens
    before = [mouth(f) for i, f in images if i < kinds.index("audio")]
    talking = [mouth(f) for i, f in images if i in speaking and i < stop_1]
    listening = [mouth(f) for i, f in images if stop_1 < i < cut and i not in speaking]
    assert before and max(before) < AT_REST, before
    assert np.mean(np.array(talking) > OPEN) > 0.3, np.round(talking, 1)
    assert listening and max(listening[2:]) < AT_REST, listening  # 2 frames close the mouth

    # interrupted: at most one frame of speech after the interruption reached the
    # transport's place, then silence and a mouth at rest; turn 2 was not said in full
    after = kinds[cut:]
    assert after.count("audio") <= 1, after[:10]
    rest = [mouth(f) for i, f in images if i > cut][2:]
    assert rest and max(rest) < AT_REST, rest
    turn_2 = sum(len(f.audio) for k, f in seen[stop_1:cut] if k == "audio") / 2 / RATE
    assert 0.9 <= turn_2 < espeak_seconds(TURNS[1], tmp_path) - 1.0, turn_2
    assert kinds.count("TTSStoppedFrame") <= 2  # the interrupted turn's stop is dropped
    print(
        f"{len(images)} pictures {avatar.size}; turn 1 said {said:.2f} s, its mouth open "
        f"(> {OPEN}) in {np.mean(np.array(talking) > OPEN):.0%} of its frames; listening at "
        f"most {max(listening[2:]):.1f}; turn 2 cut after {turn_2:.2f} s, "
        f"{after.count('audio')} audio frame(s) after the interruption"
    )


async def over_smallwebrtc(world) -> tuple[list, list, float, HotplateVideoService]:
    """The avatar through Pipecat's own WebRTC transport to an aiortc player on
    loopback: a second of listening, one turn, a second of listening. Returns what the
    player decoded (video, audio: (arrived, data)), when the turn was asked for, and
    the service."""
    from aiortc import RTCSessionDescription
    from pipecat.transports.base_transport import TransportParams
    from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
    from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport

    from testkit.webrtc_peer import WhepPeer

    peer = WhepPeer(audio_first=True)  # ICE on loopback only, no STUN
    conn = SmallWebRTCConnection(ice_servers=[])
    await conn.initialize(sdp=await peer.offer(), type="offer")
    await peer.pc.setRemoteDescription(RTCSessionDescription(conn.get_answer()["sdp"], "answer"))
    avatar = HotplateVideoService(
        "astro", "studio", personas=world / "personas", cache=world / "cache"
    )
    width, height = await asyncio.to_thread(avatar.prepare)
    transport = SmallWebRTCTransport(
        conn,
        TransportParams(
            audio_out_enabled=True,
            video_out_enabled=True,
            video_out_framerate=25,  # the loop's rate: the transport draws its latest picture
            video_out_width=width,
            video_out_height=height,
        ),
    )
    worker = PipelineWorker(
        Pipeline([transport.input(), EspeakTTSService(), avatar, transport.output()]),
        params=PipelineParams(audio_out_sample_rate=48000),
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    got = peer.received

    def until(what, why: str):
        return poll(what, why, lambda: not run.done())

    try:
        await until(lambda: len(got.video) >= 25, "a second of pictures")
        asked = time.monotonic()
        await worker.queue_frame(TTSSpeakFrame(TURNS[0]))
        await until(lambda: avatar.speaking_frames > 0, "speech")
        await until(lambda: avatar._conv.queued_seconds() == 0, "the turn said")
        mark = len(got.video)
        await until(lambda: len(got.video) >= mark + 25, "a second after the turn")
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(run, WAIT)
    finally:
        if not run.done():
            await worker.cancel()
            await run
        await peer.close()
    return list(got.video), list(got.audio), asked, avatar


def test_the_avatar_plays_through_pipecats_own_webrtc_transport(world, reader):
    """Pictures and sound reach a real WebRTC player through SmallWebRTCTransport: the
    mouth rests while it listens, opens while the turn is heard, and rests again."""
    video, audio, asked, avatar = asyncio.run(over_smallwebrtc(world))
    mouths = [(at, reader.read(luma)[1]) for at, luma in video]
    loud = [at for at, pcm in audio if np.sqrt(np.mean(pcm.astype(np.float64) ** 2)) > 300]
    assert loud, "no speech reached the player"
    heard, quiet = loud[0], loud[-1]
    before = [m for at, m in mouths if at < asked]
    during = [m for at, m in mouths if heard <= at <= quiet]
    after = [m for at, m in mouths if at > quiet + 0.2]
    assert before and max(before) < WEBRTC_REST, before
    assert np.mean(np.array(during) > OPEN) > 0.3, np.round(during, 1)
    assert after and max(after) < WEBRTC_REST, after
    print(
        f"{len(video)} pictures {avatar.size} over WebRTC; speech heard for "
        f"{quiet - heard:.2f} s, the mouth open in {np.mean(np.array(during) > OPEN):.0%} "
        f"of its pictures; at rest before and after (at most {max(before + after):.1f})"
    )


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipecat_agent.py"


def example(world, *args: str) -> list[str]:
    return [
        sys.executable, str(EXAMPLE), "--personas", str(world / "personas"),
        "--cache", str(world / "cache"), "--persona", "astro", "--attire", "studio", *args,
    ]  # fmt: skip


def test_the_example_agent_records_a_scripted_conversation_offline(world, tmp_path):
    """examples/pipecat_agent.py --out: two scripted replies in espeak-ng's voice, the
    second interrupted, written to an MP4 whose sound is speech, then silence."""
    import av

    out = tmp_path / "talk.mp4"
    done = subprocess.run(
        example(world, "--out", str(out)), capture_output=True, text=True, timeout=WAIT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"wrote {out}" in done.stdout
    with av.open(str(out)) as c:
        pictures = sum(1 for _ in c.decode(video=0))
    with av.open(str(out)) as c:
        sound = np.concatenate([f.to_ndarray().reshape(-1) for f in c.decode(audio=0)])
        rate = c.streams.audio[0].rate
    seconds = [np.sqrt(np.mean(sound[i : i + rate] ** 2)) for i in range(0, sound.size, rate)]
    assert pictures >= 25 * 6 and abs(sound.size / rate - pictures / 25) < 0.2
    assert max(seconds) > 0.02 and min(seconds[:1]) < 0.002, np.round(seconds, 3)


def test_the_example_agent_serves_a_conversation_over_pipecats_webrtc(world, reader):
    """examples/pipecat_agent.py --port: its page, and a real WebRTC player that
    connects through POST /offer, asks on the data channel (the mouth opens), and
    interrupts (it rests)."""
    import httpx
    from aiortc import RTCSessionDescription

    from testkit.serve_helpers import free_port
    from testkit.webrtc_peer import WhepPeer

    port = free_port()
    proc = subprocess.Popen(
        example(world, "--port", str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )

    async def talk() -> dict:
        peer = WhepPeer(audio_first=True, channel=True)
        got, seen = peer.received, {}

        def until(what, why: str):
            return poll(what, why, lambda: proc.poll() is None)

        def mouth_since(t: float) -> list[float]:
            return [reader.read(luma)[1] for at, luma in got.video if at > t]

        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as c:
                seen["page"] = (await c.get("/")).text
                answer = await c.post("/offer", json={"sdp": await peer.offer(), "type": "offer"})
            sdp = answer.json()
            await peer.pc.setRemoteDescription(RTCSessionDescription(sdp["sdp"], sdp["type"]))
            await until(lambda: len(got.video) >= 25, "a second of pictures")
            await peer.wait_open(WAIT)
            seen["idle"] = mouth_since(0)
            asked = time.monotonic()
            peer.channel.send(json.dumps({"type": "ask"}))
            await until(lambda: any(m > OPEN for m in mouth_since(asked)), "an open mouth")
            cut = time.monotonic()
            peer.channel.send(json.dumps({"type": "interrupt"}))
            await until(lambda: len(mouth_since(cut)) >= 50, "two seconds after the interrupt")
            seen["after"] = mouth_since(cut)
        finally:
            await peer.close()
        return seen

    try:
        assert proc.stdout.readline().startswith(f"open http://127.0.0.1:{port}/")
        seen = asyncio.run(talk())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert "RTCPeerConnection" in seen["page"] and 'createDataChannel("chat")' in seen["page"]
    assert max(seen["idle"]) < WEBRTC_REST, seen["idle"]
    # the interrupt reaches the avatar through the data channel and Pipecat's pipeline:
    # a second after it, the mouth rests
    assert max(seen["after"][25:]) < WEBRTC_REST, np.round(seen["after"], 1)

"""A voice agent with a hotplate face, offline: a Pipecat pipeline whose "language
model" is a script (SCRIPT, one reply per question), whose voice is espeak-ng, and
whose face is `HotplateVideoService` (hotplate.integrations.pipecat).

    pip install -e '.[pipecat]'      # and: apt-get install espeak-ng
    python examples/pipecat_agent.py --persona ada --attire studio --out talk.mp4
    python examples/pipecat_agent.py --persona ada --attire studio --port 8765

--out: no browser; the agent answers the script's first two questions, the second
interrupted two seconds in, and what a transport would have sent is written to the
MP4. --port: Pipecat's own WebRTC transport (SmallWebRTC) behind a page at
http://127.0.0.1:PORT/ : Connect, then Ask for the next reply, Interrupt to cut it.
The avatar must be in --personas (made hot just in time if it is not). ICE offers
loopback and this host's addresses, and asks no STUN server.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from pathlib import Path

import numpy as np

SCRIPT = (
    "Hello! I am your presenter. Ask me anything, and I will answer from my script.",
    "Our studio renders every loop once, then keeps it hot, so I can answer you at once. "
    "I could go on about that for quite a while, if nobody stopped me.",
    "That is all my script says. Thank you for listening.",
)
RATE = 24000  # the pipeline's output sample rate


def build(args, transport=None, sink=None):
    """(worker, avatar, tts): the pipeline input -> voice -> face -> output."""
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker

    from hotplate.integrations.pipecat import HotplateVideoService
    from hotplate.integrations.pipecat.espeak import EspeakTTSService

    avatar = HotplateVideoService(
        args.persona, args.attire, personas=args.personas, cache=args.cache
    )
    tts = EspeakTTSService()
    stages = [tts, avatar]
    stages = [transport.input(), *stages, transport.output()] if transport else [*stages, sink]
    worker = PipelineWorker(Pipeline(stages), params=PipelineParams(audio_out_sample_rate=RATE))
    return worker, avatar


async def record(args) -> None:
    """--out: two replies, the second interrupted, written to an MP4."""
    from PIL import Image
    from pipecat.frames.frames import (
        EndFrame,
        InterruptionFrame,
        OutputImageRawFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
    )
    from pipecat.processors.frame_processor import FrameProcessor
    from pipecat.workers.runner import WorkerRunner

    from pipeline.render.encode import Mp4Writer

    class Recorder(FrameProcessor):
        """Where a transport would be: each picture (as JPEG) and the audio before it."""

        def __init__(self) -> None:
            super().__init__()
            self.pictures: list[bytes] = []
            self.audio: list[np.ndarray] = []
            self.pending = np.zeros(0, np.int16)
            self.picture = asyncio.Event()

        async def process_frame(self, frame, direction) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.pending = np.frombuffer(frame.audio, np.int16)
            elif isinstance(frame, OutputImageRawFrame):
                w, h = frame.size
                rgb = np.frombuffer(frame.image, np.uint8).reshape(h, w, 3)
                jpeg = io.BytesIO()
                Image.fromarray(rgb).save(jpeg, "JPEG", quality=90)
                self.pictures.append(jpeg.getvalue())
                self.audio.append(self.pending)
                self.pending = np.zeros(0, np.int16)
                self.picture.set()
            await self.push_frame(frame, direction)

        async def frames(self, n: int) -> None:
            """Until n more pictures have passed (the avatar's own clock)."""
            goal = len(self.pictures) + n
            while len(self.pictures) < goal:
                self.picture.clear()
                await self.picture.wait()

    sink = Recorder()
    worker, avatar = build(args, sink=sink)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    await sink.frames(25)  # a second of listening
    await worker.queue_frame(TTSSpeakFrame(SCRIPT[0]))
    while avatar.speaking_frames == 0 or avatar.speaking:
        await sink.frames(1)
    await sink.frames(25)
    await worker.queue_frame(TTSSpeakFrame(SCRIPT[1]))
    while avatar.speaking_frames == 0 or not avatar.speaking:
        await sink.frames(1)
    await sink.frames(50)  # two seconds into the reply
    await worker.queue_frame(InterruptionFrame())
    await sink.frames(25)
    await worker.queue_frame(EndFrame())
    await run

    per_frame = RATE // int(round(avatar.fps))
    audio = np.concatenate(
        [np.pad(a, (0, per_frame - a.size)) if a.size < per_frame else a for a in sink.audio]
    )
    w, h = avatar.size
    with Mp4Writer(
        args.out, w, h, avatar.fps, audio=audio.astype(np.float32) / 32768, sample_rate=RATE
    ) as out:
        for jpeg in sink.pictures:
            out.write(np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")))
    print(f"wrote {args.out}: {len(sink.pictures)} pictures {w}x{h} at {avatar.fps:g} fps")


PAGE = """<!doctype html><meta charset=utf-8><title>hotplate + Pipecat</title>
<video id=v autoplay playsinline style="max-height:80vh;background:#000"></video><p>
<button id=go>Connect</button> <button id=ask disabled>Ask</button>
<button id=cut disabled>Interrupt</button> <span id=state></span>
<script>
let pc, dc;
go.onclick = async () => {
  pc = new RTCPeerConnection();
  pc.addTransceiver("audio", {direction: "recvonly"});
  pc.addTransceiver("video", {direction: "recvonly"});
  dc = pc.createDataChannel("chat");
  dc.onopen = () => { ask.disabled = cut.disabled = false; };
  pc.ontrack = (e) => { v.srcObject = e.streams[0]; };
  pc.onconnectionstatechange = () => { state.textContent = pc.connectionState; };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((ok) => pc.iceGatheringState === "complete" ? ok() :
    pc.addEventListener("icegatheringstatechange", () =>
      pc.iceGatheringState === "complete" && ok()));
  const r = await fetch("/offer", {method: "POST", headers: {"content-type": "application/json"},
    body: JSON.stringify({sdp: pc.localDescription.sdp, type: pc.localDescription.type})});
  await pc.setRemoteDescription(await r.json());
};
ask.onclick = () => dc.send(JSON.stringify({type: "ask"}));
cut.onclick = () => dc.send(JSON.stringify({type: "interrupt"}));
</script>"""


async def serve(args) -> None:
    """--port: the page, and POST /offer: one conversation per connection."""
    from aiohttp import web
    from pipecat.frames.frames import EndFrame, InterruptionFrame, TTSSpeakFrame
    from pipecat.transports.base_transport import TransportParams
    from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
    from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
    from pipecat.workers.runner import WorkerRunner

    from hotplate.serve.rtc import configure_ice

    configure_ice(None)  # this host's addresses and loopback (aioice leaves loopback out)
    runner = WorkerRunner(handle_sigint=False)
    running = asyncio.create_task(runner.run(auto_end=False))

    async def page(_request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def offer(request) -> web.Response:
        body = await request.json()
        conn = SmallWebRTCConnection(ice_servers=[])
        await conn.initialize(sdp=body["sdp"], type=body["type"])
        params = TransportParams(audio_out_enabled=True, video_out_enabled=True)
        transport = SmallWebRTCTransport(conn, params)
        worker, avatar = build(args, transport=transport)
        w, h = await asyncio.to_thread(avatar.prepare)
        params.video_out_width, params.video_out_height = w, h
        params.video_out_framerate = 25
        replies = iter(SCRIPT)

        @transport.event_handler("on_app_message")
        async def on_message(_transport, message, _sender) -> None:
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "ask":
                await worker.queue_frame(TTSSpeakFrame(next(replies, SCRIPT[-1])))
            elif kind == "interrupt":
                await worker.queue_frame(InterruptionFrame())

        @transport.event_handler("on_client_disconnected")
        async def on_gone(_transport, _client) -> None:
            await worker.queue_frame(EndFrame())

        await runner.add_workers(worker)
        return web.json_response(conn.get_answer())

    app = web.Application()
    app.add_routes([web.get("/", page), web.post("/offer", offer)])
    site = web.AppRunner(app)
    await site.setup()
    await web.TCPSite(site, args.host, args.port).start()
    print(f"open http://{args.host}:{args.port}/ (Ctrl-C ends)", flush=True)
    await running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--persona", required=True, help="a persona in --personas")
    parser.add_argument("--attire", default="default", help="its attire (default: default)")
    parser.add_argument("--personas", type=Path, help="the personas folder (settings' if unset)")
    parser.add_argument("--cache", type=Path, help="the store (settings' if unset)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", type=Path, help="record a scripted conversation to this MP4")
    mode.add_argument("--port", type=int, help="serve a page and Pipecat's WebRTC transport")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
    args = parser.parse_args(argv)
    try:
        asyncio.run(record(args) if args.out else serve(args))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

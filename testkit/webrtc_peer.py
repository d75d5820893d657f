"""A real WebRTC player for the conversation sessions' tests and benches: an aiortc peer
on loopback that POSTs its offer to a session's WHEP URL and keeps what it receives,
decoded (pictures as luma planes, audio as int16 mono at 48 kHz), with the monotonic
time each arrived; it can send a microphone track (samples played in real time) and
messages on a data channel."""

from __future__ import annotations

import asyncio
import fractions
import time
from dataclasses import dataclass, field

import numpy as np

RATE = 48000
CHUNK = 960  # 20 ms
CLOCKS = {"video": 90000, "audio": 48000}  # RTP clock rates (Opus: 48 kHz)
NTP_TO_UNIX = 2208988800  # s from 1900 to 1970


@dataclass
class Received:
    video: list = field(default_factory=list)  # (arrived, luma (h, w) uint8)
    audio: list = field(default_factory=list)  # (arrived, int16 mono samples)
    # each one's media time, s: its RTP timestamp, from its track's first (aiortc's
    # receiver starts each track at 0; the server stamps both from one frame count)
    video_media: list = field(default_factory=list)
    audio_media: list = field(default_factory=list)
    first_video: asyncio.Event = field(default_factory=asyncio.Event)
    # per kind: the first packet's RTP timestamp (media time 0), and each RTCP sender
    # report as (RTP timestamp, the sender's wall clock it pairs it with (unix s), the
    # receiver's wall clock when it came (unix s)): what a browser syncs the tracks by
    origins: dict = field(default_factory=dict)
    reports: dict = field(default_factory=dict)
    payload_bytes: dict = field(default_factory=dict)  # per kind: RTP payload bytes received


def without_candidates(sdp: str) -> str:
    """`sdp` with its candidate lines left out, as a player that trickles offers."""
    keep = [line for line in sdp.splitlines(keepends=True) if not _candidate_line(line)]
    return "".join(keep)


def trickle_fragment(sdp: str) -> str:
    """The trickle ICE fragment (RFC 8840) of `sdp`'s first m-line, bundled: its ICE
    credentials, m-line, mid, candidates and end-of-candidates."""
    head, _, rest = sdp.partition("\r\nm=")
    first = ("m=" + rest).split("\r\nm=")[0].split("\r\n")
    lines = head.split("\r\n") + first
    pick = [next(x for x in lines if x.startswith(p)) for p in ("a=ice-ufrag:", "a=ice-pwd:")]
    pick += [first[0], next(x for x in first if x.startswith("a=mid:"))]
    pick += [x for x in first if _candidate_line(x)]
    return "\r\n".join(pick) + "\r\n"


def _candidate_line(line: str) -> bool:
    return line.startswith(("a=candidate:", "a=end-of-candidates"))


def microphone(samples: np.ndarray):
    """An audio track playing `samples` (int16 mono, 48 kHz) in real time, then silence."""
    import av
    from aiortc.mediastreams import MediaStreamTrack

    class Microphone(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.at = 0
            self.start: float | None = None

        async def recv(self):
            if self.start is None:
                self.start = time.monotonic()
            due = self.start + self.at / RATE
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            chunk = samples[self.at : self.at + CHUNK]
            chunk = np.concatenate([chunk, np.zeros(CHUNK - chunk.size, np.int16)])
            frame = av.AudioFrame.from_ndarray(chunk[None, :], format="s16", layout="mono")
            frame.sample_rate, frame.pts = RATE, self.at
            frame.time_base = fractions.Fraction(1, RATE)
            self.at += CHUNK
            return frame

    return Microphone()


class WhepPeer:
    """connect() -> the WHEP answer's response; `received` fills as media arrives."""

    def __init__(
        self,
        mic: np.ndarray | None = None,
        channel: bool = False,
        audio_first: bool = False,
        relay: tuple[str, str, str] | None = None,
        host: tuple[str, ...] = ("127.0.0.1",),
        stun: str | None = None,
        video_codecs: tuple[str, ...] | None = None,
    ) -> None:
        """`audio_first`: the audio m-line before the video's, as a browser's Pipecat
        client offers (Pipecat's SmallWebRTC transport takes the first for audio).
        `relay`: (TURN URL, username, password): this peer offers only a relay candidate
        on that server and sends and receives through it (ICE's "relay" policy), as a
        player behind a NAT that lets nothing else through. `host`: the addresses it
        gathers its host candidates on (loopback by default). `stun`: a STUN server's URL,
        which gives it a candidate on its NAT's outside address (server reflexive).
        `video_codecs`: the only video codecs it offers, in this order ("VP8", "H264");
        None: aiortc's (VP8, then H.264)."""
        from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection
        from aiortc.rtcconfiguration import RTCIceTransportPolicy

        from hotplate.serve.rtc import configure_ice

        configure_ice(list(host))
        # no ICE servers but those named: aiortc's default (None) asks a public STUN server
        servers = [RTCIceServer(urls=[stun])] if stun else []
        policy = RTCIceTransportPolicy.ALL
        if relay is not None:
            url, username, password = relay
            servers = [RTCIceServer(urls=[url], username=username, credential=password)]
            policy = RTCIceTransportPolicy.RELAY
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=servers, iceTransportPolicy=policy))
        self.received = Received()
        self.tasks: list[asyncio.Task] = []
        self.channel = self.pc.createDataChannel("control") if channel else None
        if not audio_first:
            self.pc.addTransceiver("video", direction="recvonly")
        if mic is not None:
            self.pc.addTrack(microphone(mic))
        else:
            self.pc.addTransceiver("audio", direction="recvonly")
        if audio_first:
            self.pc.addTransceiver("video", direction="recvonly")
        if video_codecs is not None:
            from aiortc import RTCRtpReceiver

            caps = RTCRtpReceiver.getCapabilities("video").codecs
            wanted = [c for name in video_codecs for c in caps if c.name == name]
            rtx = [c for c in caps if c.name == "rtx"]
            for t in self.pc.getTransceivers():
                if t.kind == "video":
                    t.setCodecPreferences(wanted + rtx)
        self.pc.on("track", self._on_track)

    def _on_track(self, track) -> None:
        self.tasks.append(asyncio.ensure_future(self._read(track)))

    async def _read(self, track) -> None:
        from aiortc.mediastreams import MediaStreamError

        r = self.received
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            now = time.monotonic()
            known = frame.pts is not None and frame.time_base is not None
            media = float(frame.pts * frame.time_base) if known else None
            if track.kind == "video":
                r.video.append((now, luma(frame)))
                r.video_media.append(media)
                r.first_video.set()
            else:
                pcm = frame.to_ndarray().reshape(-1, len(frame.layout.channels))[:, 0]
                r.audio.append((now, pcm.astype(np.int16)))
                r.audio_media.append(media)

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return self.pc.localDescription.sdp

    async def connect(self, client, whep: str, answer: bool = True, candidates: str = "offer"):
        """POST the offer; with `answer`, apply the answer (False: a peer that never
        completes ICE). `candidates`: "offer" (in it), "patch" (an offer without them,
        then WHEP's trickle PATCH of them, before this peer starts its checks) or "none"
        (the server learns this peer's address from its checks alone)."""
        from aiortc import RTCSessionDescription

        sdp = await self.offer()
        self.offered = time.monotonic()
        offered = sdp if candidates == "offer" else without_candidates(sdp)
        r = await client.post(whep, content=offered, headers={"content-type": "application/sdp"})
        if r.status_code == 201 and candidates == "patch":
            fragment = trickle_fragment(sdp)
            headers = {"content-type": "application/trickle-ice-sdpfrag"}
            patched = await client.patch(r.headers["location"], content=fragment, headers=headers)
            assert patched.status_code == 204, patched.text
        if r.status_code == 201 and answer:
            await self.pc.setRemoteDescription(RTCSessionDescription(r.text, "answer"))
            for receiver in self.pc.getReceivers():
                self._watch_reports(receiver)
        return r

    def _watch_reports(self, receiver) -> None:
        """Keep the track's first RTP timestamp and its sender reports (Received): aiortc's
        receiver keeps neither where a test can read it, so its two packet handlers are
        wrapped."""
        from aiortc.rtp import RtcpSrPacket

        kind, r = receiver.track.kind, self.received
        on_rtp, on_rtcp = receiver._handle_rtp_packet, receiver._handle_rtcp_packet

        async def rtp(packet, *args, **kwargs):
            r.origins.setdefault(kind, packet.timestamp)
            r.payload_bytes[kind] = r.payload_bytes.get(kind, 0) + len(packet.payload)
            return await on_rtp(packet, *args, **kwargs)

        async def rtcp(packet):
            if isinstance(packet, RtcpSrPacket):
                info = packet.sender_info
                sent = info.ntp_timestamp / (1 << 32) - NTP_TO_UNIX
                r.reports.setdefault(kind, []).append((info.rtp_timestamp, sent, time.time()))
            return await on_rtcp(packet)

        receiver._handle_rtp_packet, receiver._handle_rtcp_packet = rtp, rtcp

    async def wait_open(self, timeout: float = 30.0) -> None:
        """Until the data channel is open."""
        deadline = time.monotonic() + timeout
        while self.channel.readyState != "open":
            if time.monotonic() > deadline:
                raise AssertionError("the data channel did not open")
            await asyncio.sleep(0.05)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await self.pc.close()


def sender_clock(received: Received, kind: str, media: float) -> float | None:
    """The sender's wall clock (unix s) its first report pairs with `kind`'s media time
    `media` (s from the track's first packet), or None before any report came."""
    reports, origin = received.reports.get(kind), received.origins.get(kind)
    if not reports or origin is None or media is None:
        return None
    rtp, sent, _ = reports[0]
    ticks = (origin + round(media * CLOCKS[kind]) - rtp) % (1 << 32)
    if ticks >= 1 << 31:  # before the report
        ticks -= 1 << 32
    return sent + ticks / CLOCKS[kind]


def av_offsets(received: Received) -> list[tuple[float, float]]:
    """(sender's clock, offset) per received picture: its arrival minus when the sound
    of the same instant by the sender's reports (as a browser pairs them) played, had
    each audio frame played as it arrived; s, positive when the picture is late.
    Pictures whose sound never came are left out."""
    starts = np.array(
        [
            np.nan if (c := sender_clock(received, "audio", m)) is None else c
            for m in received.audio_media
        ]
    )
    arrived = np.array([t for t, _ in received.audio])
    lengths = np.array([a.size for _, a in received.audio]) / RATE
    out = []
    for (t, _), m in zip(received.video, received.video_media, strict=True):
        at = sender_clock(received, "video", m)
        if at is None or not starts.size:
            continue
        k = int(np.searchsorted(starts, at, side="right")) - 1
        if k < 0 or at - starts[k] > lengths[k]:
            continue
        out.append((at, t - (arrived[k] + (at - starts[k]))))
    return out


def luma(frame) -> np.ndarray:
    """The Y plane of a decoded picture (as stored frames are compared: limited range)."""
    if frame.format.name != "yuv420p":
        frame = frame.reformat(format="yuv420p")
    return frame.to_ndarray()[: frame.height].copy()


def audio_since(received: Received, since: float) -> np.ndarray:
    parts = [a for t, a in received.audio if t >= since]
    return np.concatenate(parts) if parts else np.zeros(0, np.int16)


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) if samples.size else 0.0

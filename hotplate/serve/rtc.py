"""WebRTC out of a `Conversation` (aiortc; the `[webrtc]` extra): one peer connection
carrying the avatar's video and audio, and taking the browser's microphone and a data
channel in. It runs in the render worker that holds the session (talk.py).

- `FramePump` is the session's clock: a thread calls `Conversation.next_frame()` at the
  conversation's rate (frame t is due t / fps after the first) and hands each frame's
  picture and audio to the two tracks at the same moment, so the receiver gets both
  with timestamps of one clock. A frame that comes late is sent late, never skipped
  (the audio must not jump); a track that is not read keeps only the newest pictures.
  A picture is sent as soon as it is rendered; its sound goes on the clock, AUDIO_LEAD
  after its frame was due, whatever the render took. `interrupt()` renders the next
  frame at once, not when it was due (0-40 ms later), and stamps it CUT_STAMP after the
  picture before it: a receiver that has not shown that one yet shows this one in its
  place, with its mouth at rest, and one that has shows it at once. Its sound stays on
  the clock. It also silences the sound rendered before it and not yet sent (up to a frame
  and AUDIO_LEAD of it), faded out over FADE_OUT: the sound stops at once, not after
  what was queued. The pump runs one frame ahead of its clock at most: an interrupt that
  comes while the frame before was itself rendered at one drops the speech (the next
  frame rests) but waits for the clock. Each woke it before, and a burst (a client that
  interrupts on every microphone chunk: 100 a second for 1 s) rendered 93 frames in
  that second and then none for the 68 frames (2.7 s) it had run ahead, picture and
  sound frozen.
- `AvatarVideoTrack` / `AvatarAudioTrack`: aiortc's tracks fed by the pump (video at
  90 kHz, audio 20 ms frames of 48 kHz mono). What the pump hands them waits in a
  queue of each: the pictures' keeps the newest VIDEO_QUEUE, the sound's the newest
  AUDIO_QUEUE (1 s), and a peer whose answer sends no sound (a video-only offer, or
  audio the player only sends) gets none queued at all: nothing would ever read it,
  and 400 MB of it an hour piled up. Dropping the oldest, not refusing the newest,
  keeps the sound on the pump's clock, as the pictures are: what is dropped was due a
  second ago, and a receiver conceals the gap its timestamps show.
- `answer(offer)`: the peer connection for a WHEP offer (recvonly, or sendrecv audio
  with the microphone), its tracks added, the answer with every host candidate in it
  (the server does not trickle: WHEP players and the page take one answer; a player may
  trickle its own candidates after its offer, trickle.py).
- `configure_ice(addresses, ...)`: which local addresses are candidates. aioice leaves
  127.0.0.1 out of its host candidates (aioice.ice.get_host_addresses skips it, with no
  option to keep it), so a server bound to loopback would offer none: the function is
  replaced by one that returns the addresses the server was told to use. Consent checks
  are made every second (aioice's default: 5 s, failing after 6), so a peer that
  vanishes is noticed in CONSENT_FAILURES seconds.
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

log = logging.getLogger("hotplate.serve")

VIDEO_CLOCK = 90000
AUDIO_RATE = 48000
AUDIO_CHUNK = 960  # samples per audio frame sent (20 ms, Opus's frame)
VIDEO_QUEUE = 3  # pictures a track holds when its reader is slow; older ones are dropped
AUDIO_QUEUE = 50  # 20 ms pieces of sound (1 s) queued at most; older ones are dropped
CONSENT_INTERVAL = 1.0  # s between consent checks (aioice's default: 5)
CONSENT_FAILURES = 4  # failed checks before the peer counts as gone
CATCH_UP = 0.5  # s: a pump this far behind its clock resumes from now, not in a burst
# s after its frame was due that a frame's sound is sent. A render takes 9-10 ms (p50)
# and 15-17 ms (p99) at 540x960; sound sent as each render came out arrived with that
# jitter, and chromium's NetEq buffered it against it: its target 40 ms, a sound's wait
# 55 ms. Sent on the clock, 20 and 29 ms, and the pictures, which the page holds to
# their sound, wait as much less (docs/notebook/sessions.md, "Sound on the pump's clock").
# A render later than this sends its sound at once.
AUDIO_LEAD = 0.02
FADE_OUT = 0.005  # s: an interrupt's cut into sound already rendered, not a click
# s after the picture before it that an interrupt's picture is stamped. Stamped when its
# render began, chromium showed it 11 ms longer after it arrived than other pictures,
# queued behind the picture before it (arrived 8-15 ms earlier, not shown yet); so
# stamped, 81 ms after the POST against 100 (docs/notebook/sessions.md, "An interrupt's
# picture takes the place of the one before it").
CUT_STAMP = 0.002
MIC_MAX_QUEUED = 0.3  # s: microphone speech queued past this is dropped (clock drift)
# A muted track's sound, once through Opus, is +-1 and not zeros (chromium's was, each
# frame): treated as speech it queued 0.3 s ahead of a clip said over the speech
# socket. -72 dBFS: far under any room a microphone hears.
MUTED_PEAK = 8
# the encoder's bitrate ceiling by profile (aiortc's VP8 default ceiling is 1.5 Mbit/s)
MAX_BITRATE = {"preview": 1_500_000, "export": 4_000_000}


@dataclass
class PumpStats:
    frames: int = 0
    speaking: int = 0
    late: int = 0  # frames rendered more than one frame period after they were due
    dropped: int = 0  # pictures a slow track never took
    audio_dropped: int = 0  # 20 ms pieces of sound a slow track never took
    audio_peak: int = 0  # the most pieces of sound ever queued at once
    cuts: int = 0  # frames rendered at an interrupt, ahead of the clock
    stalls: int = 0  # times the pump fell CATCH_UP s behind and resumed from now
    render_seconds: float = 0.0
    render_cpu: float = 0.0  # CPU s of the renders (the pump's thread), a frame's copy included
    first_frame: float | None = None  # monotonic time the first frame was handed over
    onsets: list = field(default_factory=list)  # (speech_onset, handed over) per turn start


def configure_ice(addresses: Sequence[str] | None) -> None:
    """Host candidates from `addresses` (None: every interface's address and loopback),
    and consent checks every CONSENT_INTERVAL s (module doc)."""
    from aioice import ice

    found = ice.get_host_addresses
    if not hasattr(found, "hotplate"):

        def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
            chosen = host_addresses.chosen
            if chosen is None:
                return [*found(use_ipv4, use_ipv6), *(["127.0.0.1"] if use_ipv4 else [])]
            return [a for a in chosen if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

        host_addresses.hotplate = True
        ice.get_host_addresses = host_addresses
    ice.get_host_addresses.chosen = list(addresses) if addresses else None
    ice.CONSENT_INTERVAL = CONSENT_INTERVAL
    ice.CONSENT_FAILURES = CONSENT_FAILURES


def configure_bitrate(profile: str) -> None:
    """The video encoders' bitrate range: the profile's ceiling, VP8's floor, the same for
    H.264 and VP8 (rtc_codecs.py)."""
    from aiortc.codecs import h264, vpx

    vpx.MAX_BITRATE = h264.MAX_BITRATE = MAX_BITRATE.get(profile, MAX_BITRATE["preview"])
    h264.MIN_BITRATE = vpx.MIN_BITRATE


def _tracks_base():
    from aiortc.mediastreams import MediaStreamTrack

    return MediaStreamTrack


class FramePump:
    """The conversation's clock (module doc). `start()` once the peer is connected."""

    def __init__(self, conv, loop: asyncio.AbstractEventLoop) -> None:
        self.conv, self.loop = conv, loop
        self.stats = PumpStats()
        self.video: asyncio.Queue = asyncio.Queue()
        self.audio: asyncio.Queue = asyncio.Queue()
        # the sound is queued only for a track that sends it (audio_track, `answer`)
        self.send_audio = False
        self.stop_event = threading.Event()
        self.wake = threading.Event()  # an interrupt or a stop: the pump waits no longer
        self.failed: BaseException | None = None
        self.cut = -1.0  # monotonic time of the last interrupt (`interrupt`)
        self.on_failure: Callable[[BaseException], None] | None = None
        self.thread = threading.Thread(target=self._run, name="talk-pump", daemon=True)

    def start(self) -> None:
        if not self.thread.is_alive() and not self.stop_event.is_set():
            self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.wake.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5.0)

    def interrupt(self) -> None:
        """The conversation's interrupt, and the sound it rendered before it, not yet sent,
        silenced (module doc). Called on the event loop's thread, as the tracks read."""
        self.conv.interrupt()
        self.cut = time.monotonic()
        self.wake.set()

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # noqa: BLE001 - ends the session, said once
            self.failed = exc
            if self.on_failure is not None:
                self.loop.call_soon_threadsafe(self.on_failure, exc)

    def _loop(self) -> None:
        period = 1.0 / self.conv.fps
        start = time.monotonic()
        t = 0
        stamped = -1  # the last picture's pts
        early = False  # this frame is rendered at an interrupt, ahead of the clock
        while not self.stop_event.is_set():
            due = start + t * period
            wait = due - time.monotonic()
            early = self._until(due, interruptible=not early)  # one frame ahead at most
            if self.stop_event.is_set():
                return
            if -wait > CATCH_UP:  # far behind (a stalled machine): resume from now
                start -= wait
                due -= wait
                self.stats.stalls += 1
            began, cpu = time.monotonic(), time.thread_time()
            frame = self.conv.next_frame()
            # a new object per frame (the conversation's interface), so stamping its pts
            # touches no other picture; its pixels, at rest a shared loop frame's, are
            # not copied (3 MB a frame at 1080x1920)
            picture = frame.video
            if early and stamped >= 0:  # in the place of the one before it (module doc)
                stamped += int(round(CUT_STAMP * VIDEO_CLOCK))
            else:
                stamped = max(stamped + 1, int(round(t * period * VIDEO_CLOCK)))
            picture.pts = stamped
            picture.time_base = fractions.Fraction(1, VIDEO_CLOCK)
            done = time.monotonic()
            s = self.stats
            s.render_seconds += done - began
            s.render_cpu += time.thread_time() - cpu
            s.frames += 1
            s.cuts += early
            s.speaking += frame.speaking
            if done - due > period:
                s.late += 1
            if s.first_frame is None:
                s.first_frame = done
            self.loop.call_soon_threadsafe(self._hand_over, frame, picture, t, due, began, done)
            t += 1

    def _until(self, due: float, interruptible: bool) -> bool:
        """Wait until `due` (monotonic s); True where an interrupt (if `interruptible`;
        one frame ahead of the clock at most, module doc) or a stop ended it sooner."""
        while (left := due - time.monotonic()) > 0:
            if self.wake.wait(left):
                self.wake.clear()
                if interruptible or self.stop_event.is_set():
                    return True
        return False

    def _hand_over(self, frame, picture, t: int, due: float, began: float, done: float) -> None:
        while self.video.qsize() >= VIDEO_QUEUE:
            self.video.get_nowait()
            self.stats.dropped += 1
        self.video.put_nowait(picture)
        spf = self.conv.samples_per_frame
        for at in range(0, spf if self.send_audio else 0, AUDIO_CHUNK):  # each at its time
            while self.audio.qsize() >= AUDIO_QUEUE:
                self.audio.get_nowait()
                self.stats.audio_dropped += 1
            chunk = frame.audio[at : at + AUDIO_CHUNK]
            self.audio.put_nowait((t * spf + at, chunk, due + AUDIO_LEAD + at / AUDIO_RATE, began))
        self.stats.audio_peak = max(self.stats.audio_peak, self.audio.qsize())
        if frame.speaking and frame.speech_onset is not None:
            onsets = self.stats.onsets
            if not onsets or onsets[-1][0] != frame.speech_onset:
                onsets.append((frame.speech_onset, done))
                del onsets[:-100]


def video_track(pump: FramePump):
    class AvatarVideoTrack(_tracks_base()):
        kind = "video"

        async def recv(self):
            return await pump.video.get()

    return AvatarVideoTrack()


def audio_track(pump: FramePump):
    """The pump's sound as aiortc's track; from here on the pump queues it."""
    import av

    pump.send_audio = True

    class AvatarAudioTrack(_tracks_base()):
        kind = "audio"
        faded = -1.0  # the interrupt whose cut the sound last faded out at

        async def recv(self):
            # sent as a microphone would, 20 ms apart on the pump's clock (AUDIO_LEAD),
            # not both of a picture's at once: a receiver buffers sound by its jitter
            pts, samples, due, began = await pump.audio.get()
            await asyncio.sleep(due - time.monotonic())
            if began < pump.cut:  # its frame began to render before an interrupt: silenced
                samples = faded_out(samples, first=self.faded < pump.cut)
                self.faded = pump.cut
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(samples[None, :]), format="s16", layout="mono"
            )
            frame.sample_rate = AUDIO_RATE
            frame.pts = pts
            frame.time_base = fractions.Fraction(1, AUDIO_RATE)
            return frame

    return AvatarAudioTrack()


def faded_out(samples: np.ndarray, first: bool) -> np.ndarray:
    """Silence in place of `samples`; the first chunk after a cut fades out over FADE_OUT
    from where the sound sent before it ended, so the cut is not a click."""
    out = np.zeros_like(samples)
    if first:
        n = min(int(FADE_OUT * AUDIO_RATE), samples.size)
        out[:n] = samples[:n] * np.linspace(1.0, 0.0, n, endpoint=False)
    return out


async def feed_microphone(track, conv) -> None:
    """The browser's microphone into the conversation, until the track ends. What
    arrives while more than MIC_MAX_QUEUED s is queued is dropped: the sender's clock
    and this one drift apart, and the avatar must not fall behind the speaker. A muted
    track (MUTED_PEAK) is not queued: the page mutes the microphone while a clip is said
    over the speech socket, whose turn it would cut into and delay."""
    from aiortc.mediastreams import MediaStreamError

    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        if conv.queued_seconds() > MIC_MAX_QUEUED:
            continue
        pcm = frame.to_ndarray()
        channels = len(frame.layout.channels)
        if frame.format.name != "s16":
            pcm = np.clip(pcm * 32767, -32768, 32767)
        pcm = np.ascontiguousarray(pcm.astype("<i2"))
        if int(np.abs(pcm).max(initial=0)) <= MUTED_PEAK:  # muted: leave queued speech alone
            continue
        data = pcm.reshape(-1).tobytes()
        conv.push_speech(data, frame.sample_rate, channels)


def check_offered_candidates(sdp: str) -> None:
    """ValueError (one line) for an offer with more than MAX_OFFER_CANDIDATES candidates,
    or one naming an address no peer is at: ICE would check each (trickle.py)."""
    from hotplate.serve.limits import MAX_OFFER_CANDIDATES
    from hotplate.serve.trickle import unreachable

    lines = [x.strip() for x in sdp.splitlines() if x.startswith("a=candidate:")]
    if len(lines) > MAX_OFFER_CANDIDATES:
        raise ValueError(
            f"the offer names {len(lines)} ICE candidates, over the {MAX_OFFER_CANDIDATES} "
            "a peer takes"
        )
    for line in lines:
        fields = line.split()
        if len(fields) > 4 and (why := unreachable(fields[4])) is not None:
            raise ValueError(f"{line[:80]} names {why}: ICE checks no such address")


@dataclass
class Peer:
    pc: object
    pump: FramePump
    connected: asyncio.Event
    gone: asyncio.Future  # set with a one-line reason when the peer fails or closes
    codec: str | None = None  # the video codec the answer chose ("VP8", "H264")
    # CPU s when the pump started: the process's, the event loop thread's and the
    # conversation's fetch thread's (cpu_split)
    cpu_at_start: tuple[float, float, float] | None = None
    loop_thread: int = field(default_factory=threading.get_ident)


FETCH_THREAD = "talk-fetch"  # the conversation's thread that decodes the stored frames


def _fetch_cpu() -> float:
    """CPU s of the conversation's fetch thread (pipeline/render/conversation.py), 0 when
    there is none."""
    return sum(_thread_cpu(t.ident) for t in threading.enumerate() if t.name == FETCH_THREAD)


def _process_cpu() -> float:
    return time.process_time()


def _thread_cpu(ident: int) -> float:
    return time.clock_gettime(time.pthread_getcpuclockid(ident))


def cpu_split(peer: Peer) -> dict[str, float] | None:
    """The worker's CPU since the pump started, in ms per frame, by where it went: render
    (the pump's thread) and fetch (the conversation's thread that decodes each stored
    loop frame and converts it to I420), per frame rendered; encode and packetise (the
    video encoder's, on aiortc's executor thread, rtc_codecs.py), sound (Opus, on the
    same thread), send (the event loop's thread: RTP packets, SRTP, the sockets, the
    tracks' queues, the control channel), rest (the process's CPU less all these: the
    interpreter's other threads, the collector) and total, per frame encoded. A frame the tracks dropped was rendered and never encoded: `rendered` and
    `encoded` say how many of each. None before the first frame."""
    from hotplate.serve.rtc_codecs import sender_encoder

    rendered = peer.pump.stats.frames
    if peer.cpu_at_start is None or rendered == 0:
        return None
    process = _process_cpu() - peer.cpu_at_start[0]
    send = _thread_cpu(peer.loop_thread) - peer.cpu_at_start[1]
    spent = {"render": peer.pump.stats.render_cpu, "encode": 0.0, "packetise": 0.0}
    spent["fetch"] = _fetch_cpu() - peer.cpu_at_start[2]
    spent["sound"], encoded = 0.0, 0
    for sender in peer.pc.getSenders():
        enc = sender_encoder(sender)
        if enc is None or not hasattr(enc, "encode_seconds"):
            continue
        if sender.kind == "video":
            spent["encode"] += enc.encode_seconds
            spent["packetise"] += enc.packetise_seconds
            encoded += enc.frames
        else:
            spent["sound"] += enc.encode_seconds + enc.packetise_seconds
    spent["send"] = send
    spent["rest"] = process - sum(spent.values())
    spent["total"] = process
    out = {k: round(1000 * v / max(encoded, 1), 3) for k, v in spent.items()}
    for per_rendered in ("render", "fetch"):
        out[per_rendered] = round(1000 * spent[per_rendered] / rendered, 3)
    return {**out, "rendered": rendered, "encoded": encoded}


async def answer(
    offer_sdp: str,
    conv,
    ice_servers: Sequence[dict] = (),
    on_message: Callable[[str], None] | None = None,
) -> tuple[Peer, str]:
    """The peer connection for a WHEP offer and its SDP answer; ValueError (one line) for
    an offer that is no SDP or asks for no video."""
    from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription

    from hotplate.serve import rtc_codecs

    rtc_codecs.install()
    if not isinstance(offer_sdp, str) or not offer_sdp.lstrip().startswith("v=0"):
        raise ValueError("the offer is not an SDP description (it must start with v=0)")
    check_offered_candidates(offer_sdp)
    loop = asyncio.get_running_loop()
    # a list, even empty: aiortc's default (None) asks a public STUN server
    config = RTCConfiguration(iceServers=[RTCIceServer(**server) for server in ice_servers])
    pc = RTCPeerConnection(configuration=config)
    pump = FramePump(conv, loop)
    peer = Peer(pc, pump, asyncio.Event(), loop.create_future())

    def gone(why: str) -> None:
        if not peer.gone.done():
            peer.gone.set_result(why)

    pump.on_failure = lambda exc: gone(f"the render failed: {str(exc).splitlines()[0]}")

    @pc.on("connectionstatechange")
    async def on_state() -> None:
        state = pc.connectionState
        if state == "connected":
            peer.connected.set()
            if peer.cpu_at_start is None:
                loop_cpu = _thread_cpu(peer.loop_thread)
                peer.cpu_at_start = (_process_cpu(), loop_cpu, _fetch_cpu())
            pump.start()
        elif state in ("failed", "closed"):  # it hung up, or its ICE consent lapsed
            gone(f"the peer went away (connection {state}, ICE {pc.iceConnectionState})")

    @pc.on("track")
    def on_track(track) -> None:
        if track.kind == "audio":
            task = loop.create_task(feed_microphone(track, conv))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    @pc.on("datachannel")
    def on_channel(channel) -> None:
        @channel.on("message")
        def on_msg(message) -> None:
            if on_message is not None and isinstance(message, str):
                on_message(message)

    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        kinds = {t.kind for t in pc.getTransceivers()}
        if "video" not in kinds:
            raise ValueError("the SDP offer asks for no video; offer to receive video (and audio)")
        for t in pc.getTransceivers():  # the answer's first codec is the one sent
            if t.kind == "video":
                t._codecs = rtc_codecs.prefer(t._codecs)
        pc.addTrack(video_track(pump))
        if "audio" in kinds:
            pc.addTrack(audio_track(pump))
        await pc.setLocalDescription(await pc.createAnswer())
        video = next(t for t in pc.getTransceivers() if t.kind == "video")
        peer.codec = video._codecs[0].mimeType.split("/")[1] if video._codecs else None
        # the answer says whether our sound is sent (an offer's audio may be sendonly)
        pump.send_audio = any(
            t.kind == "audio" and t.currentDirection in ("sendrecv", "sendonly")
            for t in pc.getTransceivers()
        )
        turn = [s["urls"] for s in ice_servers if "credential" in s]
        if turn and " typ relay" not in pc.localDescription.sdp:
            # aioice leaves a relay candidate out without a word when the server refuses;
            # a worker's stderr is the server's log (workers.py prints there too)
            print(
                f"hotplate serve: no relay candidate from TURN server {', '.join(turn)}: it "
                "did not answer or refused the credentials (HOTPLATE_TURN_CREDENTIALS or "
                "--turn-credentials-file)",
                file=sys.stderr,
                flush=True,
            )
    except ValueError:
        await pc.close()
        raise
    except Exception as exc:  # aiortc's parse errors are of many kinds: one line for all
        await pc.close()
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"the offer is not a usable SDP description: {detail}") from None
    return peer, pc.localDescription.sdp

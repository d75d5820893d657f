"""Conversation sessions over WebRTC, measured at a real receiver, beside `WS /v1/live`.

Usage:
    .venv/bin/python bench/bench_webrtc.py [--sizes 540x960,1080x1920] [--frames 50]
        [--seconds 12] [--sessions 3] [--hold 10] [--interrupts 5] [--sync-from 0]
        [--codecs H264,VP8] [--parts session,chromium,load,live] [--quick] [--json FILE]

A real `hotplate serve` on loopback (one worker per session it may hold), a hot avatar of
each size (a `--frames`-frame loop), and real aiortc players (testkit/webrtc_peer.py) that
decode what they receive. Per size:

- one session: the first picture after the WHEP offer; the mouth's latency, from each
  speech onset leaving the client (speech sent in real time over the speech socket, 20 ms
  chunks) to the first decoded picture whose mouth opens (testkit/mouth_reader.py: the
  picture matched to its stored loop frame, its mouth rectangle compared); the frames the
  server counted late or dropped; the worker's CPU per second of session; then whole
  replies queued at once and interrupted mid-word (`--interrupts`, 5; each in another
  of the reply's syllables of 140 ms or more): from each interrupt's POST to the
  picture from which the mouth stays at rest, and to the sound's silence (an interrupt
  counts where the mouth was open in the 80 ms before it, as the pictures arrived);
- audio-video sync, three ways: at the aiortc player, each picture's arrival against
  when the sound of the same instant played (each track's RTP timestamps put on the
  sender's clock by its RTCP sender reports, as a browser pairs them), had each audio
  frame played as it arrived (no lip sync of its own), over the whole session; at the
  same player, the picture whose mouth opens against the onset's first loud audio
  (which also holds how fast the drawn mouth opens); and in Debian's chromium (the
  page's Talk mode, a fake microphone saying as much speech), the picture against its
  sound at the browser's playout, once a second, from 2 s after the page set the
  pictures' wait: as the page reads it (the sound's time from arriving to heard less
  the picture's to shown), plus how much later the server sent the sound;
- in chromium too, the microphone muted, the same speech over the speech socket and the
  same interrupts, each picture the page shows read back (testkit/page_frames.py): the
  mouth's latency and its rest after an interrupt, as shown and as the picture arrived;
- sessions at once: 1, 2, ... `--sessions`, each spoken to in real time for `--hold` s:
  the pictures each player received per second and the frames the server dropped; the
  most that all hold 25 fps (24.5 or more) with none dropped;
- the same speech over `WS /v1/live`: its first fragment after the first audio (what the
  fMP4 socket gives a player before it can show a mouth), the baseline the session's
  mouth latency is set beside.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import Bench, run_bench

FPS = 25.0
HOLDS = 24.5  # pictures per second a session must receive to count as holding 25 fps
OPEN = 12.0  # mean luma difference in the mouth's rectangle: open (rest is ~3)
REST = 7.0  # ... and at rest over VP8 (the browser test's bound)
REPLY = 6.0  # s of a reply queued at once, then interrupted
WORD = 0.14  # s: a reply's loud stretch this long or longer is interrupted in its middle
MOUTH_DELAY = 0.15  # s from a sound leaving the client to its mouth arriving (130-190 ms)
SLOW = 0.2  # s: an onset whose mouth opens later than this is looked at (the bound)
SETTLE = 1.5  # s after an interrupt read for the mouth and the sound at rest
OPEN_BEFORE = 0.08  # s: an interrupt counts if the mouth was open this close before it
LOUD = 2000  # int16 RMS of a 20 ms chunk that is speech
ONSET_GAP = 0.2  # s of quiet before a loud chunk that makes it an onset
CHUNK = 0.02  # s of audio per message on the speech socket
RATE = 24000  # the speech socket's sample rate
PARTS = ("session", "codecs", "chromium", "load", "live")


def add_arguments(ap) -> None:
    ap.add_argument("--sizes", default="540x960,1080x1920", help="avatar sizes, WxH")
    ap.add_argument("--frames", type=int, default=50, help="frames in each avatar's loop")
    ap.add_argument("--seconds", type=float, default=12.0, help="speech for one session")
    ap.add_argument("--sessions", type=int, default=3, help="most sessions at once")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds per level of sessions")
    ap.add_argument("--interrupts", type=int, default=5, help="replies interrupted")
    ap.add_argument(
        "--sync-from",
        type=float,
        default=0.0,
        help="s after connecting before chromium's sync is read",
    )
    ap.add_argument(
        "--codecs",
        default="H264,VP8",
        help="the server's video codecs by preference (HOTPLATE_SESSION_VIDEO_CODECS); "
        "the aiortc players offer VP8 and H.264, chromium too",
    )
    ap.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="what to run per size: session (one session's latencies), codecs (the mouth's "
        "PSNR over H.264 and VP8), chromium, load (sessions at once, each one's CPU by "
        "stage and memory), live (WS /v1/live)",
    )


def loud_chunks(audio: np.ndarray) -> list[bool]:
    """Per CHUNK of int16 `audio` at RATE: whether it is speech (RMS over LOUD)."""
    per = int(RATE * CHUNK)
    return [
        float(np.sqrt(np.mean(audio[i : i + per].astype(np.float64) ** 2))) > LOUD
        for i in range(0, audio.size, per)
    ]


def speech_pcm(seconds: float, seed: int) -> tuple[np.ndarray, list[int]]:
    """int16 speech at RATE and the chunk indexes where a syllable starts (an onset)."""
    from hotplate.demo_data import make_speech_audio

    audio = (make_speech_audio(seconds, RATE, seed) * 32767).astype(np.int16)
    loud = loud_chunks(audio)
    quiet = int(ONSET_GAP / CHUNK)
    onsets = [i for i in range(quiet, len(loud)) if loud[i] and not any(loud[i - quiet : i])]
    return audio, onsets


def mid_words(audio: np.ndarray) -> list[float]:
    """Seconds into `audio` at the middle of each loud stretch of WORD s or more, from 1 s
    in. An interrupt in a pause between words measures nothing (its mouth is at rest
    already). Cut at these, 20 of 20 found the mouth open at the aiortc player and 15 of
    20 in chromium, against 6 and 5 of 20 cut at a fixed step (2026-12-06)."""
    middles, start = [], None
    for i, is_loud in enumerate([*loud_chunks(audio), False]):
        if is_loud and start is None:
            start = i
        elif not is_loud and start is not None:
            if (i - start) * CHUNK >= WORD and start * CHUNK >= 1.0:
                middles.append((start + i) / 2 * CHUNK)
            start = None
    return middles


async def speak_in_real_time(url: str, session: dict, audio: np.ndarray) -> list[float]:
    """Send `audio` over the session's speech socket at its own pace; returns when each
    chunk was sent (monotonic)."""
    import websockets

    per = int(RATE * CHUNK)
    sent = []
    async with websockets.connect(url.replace("http", "ws", 1) + session["speech"]) as ws:
        await ws.send(json.dumps({"sample_rate": RATE, "channels": 1, "format": "s16le"}))
        start = time.monotonic()
        for k, at in enumerate(range(0, audio.size, per)):
            await asyncio.sleep(max(0.0, start + k * CHUNK - time.monotonic()))
            sent.append(time.monotonic())
            await ws.send(audio[at : at + per].tobytes())
        await ws.send(json.dumps({"type": "end_of_turn"}))
        await asyncio.sleep(1.0)  # the last syllable's pictures and sound arrive
    return sent


async def interrupt_replies(c, url: str, session: dict, n: int) -> list[float]:
    """`n` whole replies (REPLY s each), each queued at once as a TTS service sends
    it and interrupted mid-word: MOUTH_DELAY after the middle of one of its syllables
    (mid_words), another each time; returns when each interrupt was POSTed."""
    import websockets

    audio, _ = speech_pcm(REPLY, seed=5)
    words = mid_words(audio)
    cuts = []
    async with websockets.connect(url.replace("http", "ws", 1) + session["speech"]) as ws:
        await ws.send(json.dumps({"sample_rate": RATE, "channels": 1, "format": "s16le"}))
        for k in range(n):
            await ws.send(audio.tobytes())
            await ws.send(json.dumps({"type": "end_of_turn"}))
            await asyncio.sleep(words[k % len(words)] + MOUTH_DELAY)
            cuts.append(time.monotonic())
            (await c.post(session["interrupt"])).raise_for_status()
            await asyncio.sleep(SETTLE)  # what follows the interrupt arrives
    return cuts


def settled(items: list[tuple[float, float]], since: float, until: float, level: float):
    """The time of the first (time, value) in [since, until) from which every value up
    to `until` is at or below `level`, or None."""
    within = [(t, v) for t, v in items if since <= t < until]
    for k, (t, _) in enumerate(within):
        if all(v <= level for _, v in within[k:]):
            return t
    return None


def mouth_openings(mouth: list, sent: list[float], onsets: list[int]):
    """(when the onset was sent, when the next one was, when the mouth first opened
    between them) per speech onset that opened the mouth."""
    for k, i in enumerate(onsets):
        start = sent[i]
        until = sent[onsets[k + 1]] if k + 1 < len(onsets) else start + 2.0
        opened = first_after(mouth, start, until, OPEN)
        if opened is not None:
            yield start, until, opened


def slow_onsets(mouth: list, sent: list[float], onsets: list[int], where: str) -> None:
    """Says, of each onset whose mouth opened past SLOW, when the mouth first moved at
    all (past REST) and how wide it opened before the next onset: a late first move is
    latency, an early move that opens slowly is a soft syllable."""
    slow = [(s, u, o) for s, u, o in mouth_openings(mouth, sent, onsets) if o - s > SLOW]
    if slow:
        said = []
        for start, until, opened in slow:
            moved = first_after(mouth, start, until, REST)
            peak = max(v for t, v in mouth if start <= t < until)
            said.append(
                f"{1000 * (opened - start):.0f} ms (moved at {1000 * (moved - start):.0f} ms, "
                f"peak {peak:.0f})"
            )
        print(f"  {where}: onsets past {1000 * SLOW:.0f} ms: " + "; ".join(said))


def mouth_rests(bench: Bench, mouth: list, cuts: list[float]) -> list[tuple[float, float]]:
    """(the interrupt's POST, when the mouth came to rest for good) per interrupt whose
    mouth was open in the OPEN_BEFORE s before it, as the pictures arrived. A cut made
    in a pause between words measures nothing: its mouth was already at rest, and with
    "open in the second before it" such cuts read 3-43 ms as shown, where cuts made
    mid-word read 104-186 (2026-12-06)."""
    out = []
    for cut in cuts:
        if first_after(mouth, cut - OPEN_BEFORE, cut, OPEN) is None:
            continue
        rest_at = settled(mouth, cut, cut + SETTLE, REST)
        if rest_at is None:
            bench.missing(f"{SETTLE} s after an interrupt the mouth still moved")
        out.append((cut, rest_at))
    if not out:
        bench.missing("the mouth was not open before any interrupt")
    return out


def first_after(items: list[tuple[float, float]], since: float, until: float, level: float):
    """The time of the first (time, value) with since <= time < until and value > level."""
    return next((t for t, v in items if since <= t < until and v > level), None)


async def one_session(bench: Bench, srv, reader, size: str, inputs: dict, seconds: float):
    import httpx

    from testkit.webrtc_peer import WhepPeer, av_offsets

    audio, onsets = speech_pcm(seconds, seed=3)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
        r = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
        if r.status_code != 201:
            bench.missing(f"POST /v1/sessions answered {r.status_code}: {r.text[:200]}")
        session = r.json()
        peer = WhepPeer()
        answer = await peer.connect(c, session["whep"])
        if answer.status_code != 201:
            bench.missing(f"the WHEP offer was answered {answer.status_code}")
        await asyncio.wait_for(peer.received.first_video.wait(), 60)
        first_picture = peer.received.video[0][0] - peer.offered
        await asyncio.sleep(1.0)  # a second of listening before the speech
        sent = await speak_in_real_time(srv.url, session, audio)
        stats = (await c.get(f"/v1/sessions/{session['id']}")).json()
        cuts = await interrupt_replies(c, srv.url, session, bench.args.interrupts)
        await peer.close()
        await c.delete(f"/v1/sessions/{session['id']}")
    mouth = [(t, reader.read(luma)[1]) for t, luma in peer.received.video]
    sound = [
        (t, float(np.sqrt(np.mean(a.astype(np.float64) ** 2)))) for t, a in peer.received.audio
    ]
    latencies, offsets = [], []
    for start, until, opened in mouth_openings(mouth, sent, onsets):
        latencies.append(opened - start)
        heard = first_after(sound, start, until, LOUD / 2)
        if heard is not None:
            offsets.append(opened - heard)
    if not latencies:
        bench.missing("no speech onset opened a mouth in the received pictures")
    slow_onsets(mouth, sent, onsets, "the aiortc player")
    rests, quiets = [], []
    for cut, rest_at in mouth_rests(bench, mouth, cuts):
        quiet_at = settled(sound, cut, cut + SETTLE, LOUD / 4)
        if quiet_at is None:
            bench.missing(f"{SETTLE} s after an interrupt the sound still played")
        rests.append(rest_at - cut)
        quiets.append(quiet_at - cut)
    figures = stats.get("figures", stats)
    cpu = figures.get("cpu_seconds", 0.0) / max(figures.get("seconds", 1.0), 1e-6)
    note = (
        f"{len(latencies)} of {len(onsets)} onsets read; server: "
        f"{figures.get('frames')} frames, {figures.get('late_frames')} late, "
        f"{figures.get('dropped_frames')} dropped"
    )
    bench.figure(
        f"{size}: first picture after the WHEP offer",
        1000 * first_picture,
        "ms",
        better="lower",
        inputs=inputs,
    )
    bench.figure(
        f"{size}: mouth open after a speech onset left the client (median)",
        1000 * statistics.median(latencies),
        "ms",
        baseline="one frame at 25 fps plus the renderer's lookahead (80 ms)",
        baseline_value=80.0,
        better="lower",
        inputs=inputs,
        note=note + f"; max {1000 * max(latencies):.0f} ms",
    )
    synced = av_offsets(peer.received)
    if not synced:
        bench.missing("no received picture had its sound received")
    sync = np.array([x for _, x in synced])
    spans = (
        [x for m, x in synced if m <= synced[0][0] + 10],
        [x for m, x in synced if m >= synced[-1][0] - 10],
    )
    bench.figure(
        f"{size}: picture minus its sound at the receiver, by the sender reports' clock (median; largest |x|)",
        1000 * float(np.median(sync)),
        "ms",
        better="lower",
        inputs=inputs,
        note=f"largest {1000 * sync[np.argmax(np.abs(sync))]:.0f} ms, 95% within "
        f"{1000 * np.percentile(np.abs(sync), 95):.0f} ms, over {len(sync)} pictures and "
        f"{synced[-1][0] - synced[0][0]:.0f} s; drift (last 10 s minus first) "
        f"{1000 * (np.median(spans[1]) - np.median(spans[0])):.0f} ms",
    )
    if offsets:
        bench.figure(
            f"{size}: mouth opening minus the sound's onset at the receiver (median; largest |x|)",
            1000 * statistics.median(offsets),
            "ms",
            better="lower",
            inputs=inputs,
            note=f"largest {1000 * max(offsets, key=abs):.0f} ms over {len(offsets)} onsets",
        )
    bench.figure(
        f"{size}: interrupt: the mouth at rest at the receiver after the POST (median)",
        1000 * statistics.median(rests),
        "ms",
        better="lower",
        inputs=inputs,
        note=f"{len(rests)} of {len(cuts)} replies cut with the mouth open; largest "
        f"{1000 * max(rests):.0f} ms; the sound silent after {1000 * statistics.median(quiets):.0f}"
        f" ms (median), largest {1000 * max(quiets):.0f} ms; both stay so",
    )
    bench.figure(
        f"{size}: frames dropped by the server, one session",
        float(figures.get("dropped_frames") or 0),
        "frames",
        better="lower",
        inputs=inputs,
        note=note,
    )
    bench.figure(
        f"{size}: the worker's CPU per session",
        cpu,
        "cores",
        better="lower",
        inputs=inputs,
        note=f"{figures.get('cpu_seconds')} CPU s over {figures.get('seconds')} s",
    )
    return statistics.median(latencies)


def mouth_psnr(reader, lumas: list) -> float:
    """PSNR (dB) of the mouth's rectangle in pictures at rest against the stored loop frame
    each shows (what the session rendered), over all their pixels."""
    errors = []
    for luma in lumas:
        idx, _ = reader.read(luma)
        x1, y1, x2, y2 = reader.boxes[idx]
        got = luma[y1:y2, x1:x2].astype(np.float64)
        errors.append(np.mean((got - reader.lumas[idx][y1:y2, x1:x2]) ** 2))
    return float(10 * np.log10(255**2 / max(float(np.mean(errors)), 1e-9)))


async def codec_sharpness(bench: Bench, srv, reader, size: str, inputs: dict, hold: float):
    """A player that offers VP8 and H.264 (aiortc's offer: VP8 first) and one that offers
    VP8 alone, one after the other, each `hold` s at rest: the codec the server chose, the
    mouth's PSNR against the rendered frame from the second second on, the bitrate it
    arrived at and the encode's CPU per frame."""
    import httpx

    from testkit.webrtc_peer import WhepPeer

    got = {}
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
        for offered in (None, ("VP8",)):
            r = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
            r.raise_for_status()
            session = r.json()
            peer = WhepPeer(video_codecs=offered)
            (await peer.connect(c, session["whep"])).raise_for_status()
            await asyncio.wait_for(peer.received.first_video.wait(), 60)
            await asyncio.sleep(hold + 1.0)
            figures = (await c.get(f"/v1/sessions/{session['id']}")).json()
            await peer.close()
            await c.delete(f"/v1/sessions/{session['id']}")
            first = peer.received.video[0][0]
            at_rest = [y for t, y in peer.received.video if t >= first + 1.0]
            seconds = peer.received.video[-1][0] - first
            rate = 8 * peer.received.payload_bytes.get("video", 0) / max(seconds, 1e-6) / 1000
            split = figures.get("cpu_ms_per_frame") or {}
            got[figures.get("codec")] = (mouth_psnr(reader, at_rest), rate, split, len(at_rest))
    if set(got) != {"H264", "VP8"}:
        bench.missing(f"the server answered {sorted(map(str, got))}, not H264 and VP8")
    for codec, (psnr, rate, split, n) in got.items():
        bench.figure(
            f"{size}: the mouth's PSNR at rest against the rendered frame, {codec}",
            psnr,
            "dB",
            inputs={**inputs, "codec": codec},
            note=f"{n} pictures, {rate:.0f} kbit/s arrived; encode "
            f"{split.get('encode', float('nan')):.2f} ms a frame",
        )
    bench.figure(
        f"{size}: the mouth's PSNR, H.264 less VP8 (the issue: -1 dB or more)",
        got["H264"][0] - got["VP8"][0],
        "dB",
        inputs=inputs,
        note=f"H.264 at {got['H264'][1]:.0f} kbit/s, VP8 at {got['VP8'][1]:.0f}: the same "
        "start and ceiling, each following the player's estimate",
    )


# The page's reading over the last second (app.js readTiming): ms from arriving to heard
# (sound) and to shown (picture), and their difference (lead); null until known
TIMING = "() => window.hotplateTalk.timing"


# Reading each shown picture back costs the page a canvas copy and its luma in script:
# at 1080x1920 (8 MB a picture, 25 a second) that starves the session it measures on 2 cores.
READ_IN_CHROMIUM = 540 * 960  # pixels, at most
ALIGNED = "() => window.hotplateTalk.pictureWaitMs"  # the wait the page asked last, ms or null


def sent_later(srv, page) -> float:
    """ms the session's server sent a sound after its picture: AUDIO_LEAD after the frame
    was due, against its picture as soon as rendered (the mean render; VP8's encode after
    it, about 4 ms at 540x960, not counted). The page's lead leaves this out."""
    from hotplate.serve.rtc import AUDIO_LEAD

    with srv.client() as c:
        figures = c.get(f"/v1/sessions/{page.evaluate('window.hotplateTalk.id')}").json()
    figures = figures.get("figures", figures)
    return 1000 * (AUDIO_LEAD - figures["render_seconds"] / max(figures["frames"], 1))


def in_chromium(bench: Bench, srv, reader, size: str, inputs: dict, seconds: float) -> None:
    """The page's Talk mode in Debian's chromium, its fake microphone saying `seconds` of
    speech: the picture minus its sound at the browser's playout, once a second, for
    `seconds` from 2 s after the page set the pictures' wait (it needs three
    steady readings of the sound, ~3-8 s; at 30 s without it, from then; never before
    --sync-from). Read as the page reads it (app.js readTiming: the sound's time from
    arriving to heard less the picture's from arriving to shown), plus how much later
    the server sent the sound than its picture (sent_later)."""
    import shutil

    from hotplate.demo_data import make_speech_audio, write_wav
    from testkit import page_frames

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        bench.missing("Debian's chromium is not installed (just setup installs it)")
    from playwright.sync_api import sync_playwright

    leads, trace = [], []
    with tempfile.TemporaryDirectory() as d, sync_playwright() as p:
        mic = write_wav(Path(d) / "mic.wav", make_speech_audio(seconds, 48000, seed=4), 48000)
        args = page_frames.talk_args(mic)
        browser = p.chromium.launch(executable_path=chromium, args=args, headless=True)
        page = browser.new_page()
        page.goto(srv.url + "/")
        page.get_by_test_id("card-astro-studio").click()
        page.click("#talk")
        page.wait_for_function("() => window.hotplateTalk.connected", timeout=60_000)
        began = time.monotonic()
        sync_from = bench.args.sync_from
        aligned = None  # when the page had set the pictures' wait, s after connecting
        while aligned is None or time.monotonic() - began < aligned + 2 + seconds:
            page.wait_for_timeout(1000)  # the page reads once a second
            timing = page.evaluate(TIMING)
            now = time.monotonic() - began
            if aligned is None and (page.evaluate(ALIGNED) is not None or now > 30):
                aligned = max(now, sync_from - 1)
            if timing is not None:
                trace.append((now, timing["lead"]))
                if aligned is not None and now >= aligned + 2:  # the wait took effect
                    leads.append(trace[-1][1])
                    last = timing
        waited = page.evaluate(ALIGNED)
        later = sent_later(srv, page)
        w, h = (int(x) for x in size.split("x"))
        if w * h <= READ_IN_CHROMIUM:
            mouth_in_chromium(bench, page, srv, reader, size, inputs, seconds, later)
        else:
            print(f"  chromium's pictures are not read back at {size} (see READ_IN_CHROMIUM)")
        page.click("#talk")
        page.wait_for_function("() => window.hotplateTalk.state === 'idle'", timeout=30_000)
        browser.close()
    print(
        "  chromium, picture minus sound (ms) by second after connecting: "
        + " ".join(f"{t:.0f}s:{-(x + later):.0f}" for t, x in trace)
    )
    if not leads:
        bench.missing("the page never read when chromium plays both tracks")
    x = -(np.array(leads) + later)
    bench.figure(
        f"{size}: in chromium, picture minus sound at playout (median; largest |x|)",
        float(np.median(x)),
        "ms",
        better="lower",
        inputs=inputs,
        note=f"largest {x[np.argmax(np.abs(x))]:.0f} ms, 95% within "
        f"{np.percentile(np.abs(x), 95):.0f} ms, {len(x)} readings over {seconds:.0f} s "
        f"from {aligned + 2:.0f} s after connecting (the page's reading: the sound "
        f"{last['sound']:.0f} ms from arriving to heard, jitter buffer and output, less the "
        f"picture's {last['picture']:.0f} ms to shown, at the end; plus the sound sent "
        f"{later:.0f} ms after its picture); the page asked pictures to wait {waited} ms",
    )


def mouth_in_chromium(
    bench: Bench, page, srv, reader, size: str, inputs, seconds: float, later: float
) -> None:
    """The same session, its microphone muted: `seconds` of speech pushed in real time
    over its speech socket, then replies interrupted, as bench_webrtc's aiortc player
    is spoken to; each picture chromium shows is read back (testkit/page_frames.py),
    timed when it arrived and when it was shown."""
    import threading

    import httpx

    from testkit import page_frames

    page.click("#mic")  # its file's speech and ours would mix
    page_frames.start(page, reader)
    to_monotonic = page_frames.monotonic_offset(page)
    session = page.evaluate("talk.session")
    audio, onsets = speech_pcm(seconds, seed=3)
    said: dict = {}

    async def speak() -> None:
        said["sent"] = await speak_in_real_time(srv.url, session, audio)
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            said["cuts"] = await interrupt_replies(c, srv.url, session, bench.args.interrupts)

    def run() -> None:
        try:
            asyncio.run(speak())
        except Exception as exc:  # the bench says so below, in one line
            said["error"] = f"{type(exc).__name__}: {exc}"

    speaker = threading.Thread(target=run, daemon=True)
    speaker.start()
    pictures, leads = [], []
    while speaker.is_alive():
        page.wait_for_timeout(300)
        pictures += page_frames.drain(page, reader)
        timing = page.evaluate(TIMING)
        if timing is not None:  # how far the pictures lead their sound now (ms)
            leads.append((time.monotonic(), timing["lead"] + later))
    if "error" in said:
        bench.missing(f"speaking to the session in chromium failed: {said['error']}")
    shown = [(p.shown + to_monotonic, p.mouth) for p in pictures]
    arrived = [(p.received + to_monotonic, p.mouth) for p in pictures if p.received]
    shown_at = {p.received + to_monotonic: p.shown + to_monotonic for p in pictures if p.received}
    latencies = [o - s for s, _, o in mouth_openings(shown, said["sent"], onsets)]
    if not latencies:
        bench.missing("no speech onset opened a mouth in the pictures chromium showed")
    slow_onsets(shown, said["sent"], onsets, "chromium, as shown")
    on_arrival = [o - s for s, _, o in mouth_openings(arrived, said["sent"], onsets)]
    bench.figure(
        f"{size}: in chromium, mouth open as shown after a speech onset left the client (median)",
        1000 * statistics.median(latencies),
        "ms",
        better="lower",
        inputs=inputs,
        note=f"largest {1000 * max(latencies):.0f} ms, {len(latencies)} of {len(onsets)} onsets; "
        f"as the picture arrived: median {1000 * statistics.median(on_arrival or [0]):.0f} ms, "
        f"largest {1000 * max(on_arrival or [0]):.0f} ms; {len(pictures)} pictures read",
    )
    # the cuts and their first picture at rest are found as the pictures arrived, and
    # that picture's time as shown is the rest as shown: one set of cuts for both
    cut_rests = mouth_rests(bench, arrived, said["cuts"])
    rests_on_arrival = [at - cut for cut, at in cut_rests]
    rests = [shown_at[at] - cut for cut, at in cut_rests]
    # how far the pictures led their sound here: it sets how long a picture is held
    during = [x for t, x in leads if said["cuts"][0] - 1 <= t <= said["cuts"][-1] + 1]
    bench.figure(
        f"{size}: in chromium, interrupt: the mouth at rest as shown after the POST (median)",
        1000 * statistics.median(rests),
        "ms",
        better="lower",
        inputs=inputs,
        note=f"{len(rests)} of {len(said['cuts'])} replies cut with the mouth open; largest "
        f"{1000 * max(rests):.0f} ms; as the picture arrived: median "
        f"{1000 * statistics.median(rests_on_arrival):.0f} ms, largest "
        f"{1000 * max(rests_on_arrival):.0f} ms (shown later by the wait the page set); the "
        f"pictures led their sound by {statistics.median(during or [float('nan')]):.0f} ms "
        "at playout while the cuts were made (median)",
    )


STAGES = ("render", "fetch", "encode", "packetise", "send", "sound", "rest", "total")


def proc_status(pid: int) -> tuple[float, int]:
    """(CPU s, resident bytes) of process `pid`, from /proc."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = next(
        int(line.split()[1]) * 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return cpu, rss


async def at_once(srv, n: int, hold: float) -> tuple[list[float], int, dict]:
    """n sessions, each spoken to for `hold` s: (pictures per second each received in the
    last `hold` s, frames the server dropped in all, costs). The costs: each worker's CPU
    per frame by stage (the sessions' mean, talk.py's cpu_ms_per_frame), the server's
    CPU per picture received and the resident memory a session adds to the server (after
    the speech less before the sessions, over n) and holds in its worker (its RSS)."""
    import httpx

    from testkit.webrtc_peer import WhepPeer

    audio, _ = speech_pcm(hold, seed=7)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
        # the sessions before (the level below, chromium's) have freed their workers: a
        # session's DELETE answers before its worker's job is done
        deadline = time.monotonic() + 30
        while (await c.get("/readyz")).json().get("running", 0):
            if time.monotonic() > deadline:
                raise RuntimeError("the server's workers were still busy 30 s after the last level")
            await asyncio.sleep(0.2)
        _, server_rss_before = proc_status(srv.proc.pid)
        sessions, peers = [], []
        for _ in range(n):
            r = await c.post("/v1/sessions", json={"persona": "astro", "attire": "studio"})
            if r.status_code != 201:
                raise RuntimeError(f"POST /v1/sessions answered {r.status_code}: {r.text[:300]}")
            sessions.append(r.json())
            peer = WhepPeer()
            (await peer.connect(c, sessions[-1]["whep"])).raise_for_status()
            peers.append(peer)
        for peer in peers:
            await asyncio.wait_for(peer.received.first_video.wait(), 60)
        start = time.monotonic()
        server_cpu_before, _ = proc_status(srv.proc.pid)
        await asyncio.gather(*(speak_in_real_time(srv.url, s, audio) for s in sessions))
        end = time.monotonic() - 1.0  # speak_in_real_time waits a second after the speech
        server_cpu, server_rss = proc_status(srv.proc.pid)
        counts = [sum(start <= t < end for t, _ in p.received.video) for p in peers]
        rates = [k / (end - start) for k in counts]
        dropped, splits, worker_rss, codecs = 0, [], [], set()
        for s in sessions:
            figures = (await c.get(f"/v1/sessions/{s['id']}")).json()
            figures = figures.get("figures", figures)
            dropped += int(figures.get("dropped_frames") or 0)
            if figures.get("cpu_ms_per_frame"):
                splits.append(figures["cpu_ms_per_frame"])
            worker_rss.append(figures.get("worker", {}).get("rss_bytes") or 0)
            codecs.add(str(figures.get("codec")))
        for peer, s in zip(peers, sessions, strict=True):
            await peer.close()
            await c.delete(f"/v1/sessions/{s['id']}")
    costs = {
        "split": {k: statistics.mean(x.get(k, 0.0) for x in splits) for k in STAGES}
        if splits
        else {},
        # the pictures received in the window: the speech's (the server's CPU then)
        "server_ms": 1000 * (server_cpu - server_cpu_before) / max(sum(counts), 1),
        "server_rss": (server_rss - server_rss_before) / n,
        "worker_rss": statistics.mean(worker_rss),
        "codec": ",".join(sorted(codecs)),
    }
    return rates, dropped, costs


def said_costs(costs: dict) -> str:
    split = " ".join(f"{k} {costs['split'].get(k, 0):.1f}" for k in STAGES)
    return (
        f"ms/frame, {costs['codec']}: {split}; server {costs['server_ms']:.2f} ms/picture, "
        f"RSS a session: worker {costs['worker_rss'] / 2**20:.0f} MB, server "
        f"{costs['server_rss'] / 2**20:+.1f} MB"
    )


def cost_figures(bench: Bench, size: str, inputs: dict, costs: dict, n: int) -> None:
    """Where one of `n` sessions' CPU goes per frame, and the memory it adds."""
    inputs = {**inputs, "sessions": n, "codec": costs["codec"]}
    rows = [
        (f"a session's CPU per frame, {stage} (worker, ", costs["split"].get(stage, 0.0), "ms")
        for stage in STAGES
    ]
    rows += [
        ("the server's CPU per picture a session sent (", costs["server_ms"], "ms"),
        ("resident memory a session holds, its worker (", costs["worker_rss"] / 2**20, "MB"),
        ("resident memory a session adds to the server (", costs["server_rss"] / 2**20, "MB"),
    ]
    for name, value, unit in rows:  # each name ends where "N at once)" goes
        bench.figure(f"{size}: {name}{n} at once)", value, unit, better="lower", inputs=inputs)


def over_live(bench: Bench, srv, size: str, inputs: dict, seconds: float, mouth_ms: float):
    from testkit.stream_helpers import live_session

    audio, _ = speech_pcm(seconds, seed=3)
    start = {"persona": "astro", "attire": "studio", "sample_rate": RATE, "channels": 1}
    res = live_session(srv.url, start, audio.tobytes(), 2 * RATE, chunk_seconds=CHUNK)
    if not res.arrivals:
        bench.missing(f"WS /v1/live sent no fragment: {res.final}")
    bench.figure(
        f"{size}: WS /v1/live, first fragment after the first audio",
        1000 * (res.arrivals[0] - res.first_audio_at),
        "ms",
        baseline="the session's mouth latency over WebRTC (above)",
        baseline_value=mouth_ms,
        better="lower",
        inputs=inputs,
        note="a fragment, not yet a shown mouth: a player buffers it before it plays",
    )


def main(bench: Bench) -> None:
    from cachestore.store import forget_store, open_store
    from hotplate.demo_data import write_loop_video
    from pipeline.hot import load_assets
    from testkit.mouth_reader import MouthReader
    from testkit.serve_helpers import Server, wait_state

    args = bench.args
    parts = set(args.parts.split(","))
    if parts - set(PARTS):
        bench.missing(f"--parts {args.parts}: choose among {','.join(PARTS)}")
    try:
        import aiortc  # noqa: F401
    except ImportError:
        bench.missing("aiortc is not installed: pip install 'hotplate[webrtc]' (just setup)")
    for size in args.sizes.split(","):
        w, h = (int(x) for x in size.split("x"))
        inputs = {"loop_frames": args.frames, "resolution": size, "audio_seconds": args.seconds}
        inputs["codecs"] = args.codecs
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "personas" / "astro").mkdir(parents=True)
            write_loop_video(
                root / "personas" / "astro" / "studio.mp4", n_frames=args.frames, size=(w, h)
            )
            workers = str(max(1, args.sessions))
            serve_args = ("--workers", workers, "--max-sessions", workers)
            env = {"HOTPLATE_SESSION_VIDEO_CODECS": args.codecs}
            per_client = ("--max-sessions-per-client", workers)
            with Server(root, *serve_args, *per_client, env=env) as srv:
                with srv.client() as c:
                    job = c.post("/v1/precompile", data={"persona": "astro", "attire": "studio"})
                    done = wait_state(c, job.json()["id"], ("done", "failed"))
                if done["state"] != "done":
                    bench.missing(f"the avatar did not precompile: {done.get('error')}")
                store = open_store(root / "cache")
                try:
                    reader = MouthReader(load_assets(store, done["avatar"]))
                finally:
                    forget_store(root / "cache")
                print(f"\n{size}, a {args.frames}-frame loop:")
                mouth = None
                if "session" in parts:
                    mouth = asyncio.run(one_session(bench, srv, reader, size, inputs, args.seconds))
                if "codecs" in parts:
                    asyncio.run(codec_sharpness(bench, srv, reader, size, inputs, args.hold))
                if "chromium" in parts:
                    in_chromium(bench, srv, reader, size, inputs, args.seconds)
                if "load" not in parts:
                    continue
                held = 0
                for n in range(1, args.sessions + 1):
                    rates, dropped, costs = asyncio.run(at_once(srv, n, args.hold))
                    holds = min(rates) >= HOLDS and dropped == 0
                    print(
                        f"  {n} at once: {', '.join(f'{r:.1f}' for r in rates)} pictures/s, "
                        f"{dropped} dropped: {'holds' if holds else 'does not hold'} 25 fps; "
                        + said_costs(costs)
                    )
                    if n == 1:
                        cost_figures(bench, size, inputs, costs, n)
                    held = n if holds and held == n - 1 else held
                bench.figure(
                    f"{size}: sessions at once that all hold 25 fps with none dropped",
                    float(held),
                    "sessions",
                    inputs={**inputs, "tried_up_to": args.sessions, "hold_seconds": args.hold},
                    note="each spoken to in real time; 24.5 pictures/s or more at the receiver",
                )
                if "live" in parts and mouth is not None:
                    over_live(bench, srv, size, inputs, args.seconds, 1000 * mouth)


if __name__ == "__main__":
    run_bench(
        main,
        __doc__,
        add_arguments,
        quick={
            "sizes": "270x480",
            "frames": 8,
            "seconds": 3.0,
            "sessions": 2,
            "hold": 2.0,
            "interrupts": 4,  # chromium counted 15 of 20 mid-word cuts: one of 4 is all but sure
            # the codecs' sharpness is test_serve_sessions' (H.264 and VP8 at once), and
            # --quick stays as long as it was (about 80 s)
            "parts": "session,chromium,load,live",
        },
    )

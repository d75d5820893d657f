"""A conversation: one hot avatar that talks in turns and listens between them, its
frames pulled one at a time at the output rate by whoever transports them (a WebRTC
track, a Pipecat output, a test). Nothing here knows about a network.

The interface (stable: the WebRTC sessions and the Pipecat service are built on it):

    conv = Conversation(assets, backend="warp", fps=None, audio_rate=48000,
                        models_dir=None, device=None, loop="pingpong", vae=None,
                        max_queue=MAX_QUEUE_SECONDS)
    conv.fps, conv.width, conv.height, conv.audio_rate, conv.samples_per_frame
    conv.push_speech(pcm, rate, channels)  # s16le interleaved, any chunking, any thread;
                         # ValueError, the piece dropped, past max_queue s queued
    conv.end_of_turn()   # what is queued is the whole utterance: play it out
    conv.interrupt()     # drop the queued speech: the next frame rests, its audio silent
    conv.switch(assets)  # another attire or motion, from the next loop point on
    conv.queued_seconds()  # speech queued and not played yet
    frame = conv.next_frame()  # renders the next frame now; the caller paces
    conv.close()

    Frame.index             output frame number, from 0
    Frame.video             av.VideoFrame, yuv420p (BT.601 limited), width x height (even);
                            a new object for each frame, whose pts and time_base the caller
                            may set; read-only pixels (at rest they are a stored loop
                            frame's, shared with later frames and the process's sessions)
    Frame.to_rgb()          the picture as an (height, width, 3) uint8 RGB array
    Frame.audio             (samples_per_frame,) int16 mono at audio_rate
    Frame.speaking          this frame carries speech
    Frame.speech_onset      time.monotonic() at which the speech in this frame entered
                            push_speech (the chunk holding its first sample), or None
    Frame.opening           the mouth's opening the renderer drew (0 at rest; None for
                            a renderer that does not say)

The timeline: output frame t shows stored frame idx(t) of the loop (ping-pong or
cycle, as a render) and carries `samples_per_frame` samples of audio. The loop never
stops: between turns it plays on with the mouth at rest and the audio silent. Speech
pushed is decoded at once (pipeline/render/live.py's PcmDecoder: to mono, resampled
to the output rate and to the renderer's) and queued; a frame takes the next
`samples_per_frame` of the queue once the queue also holds the renderer's lookahead
(LOOKAHEAD frames: warp 1), or once `end_of_turn` says no more is coming. So the
mouth of frame t is prepared on the audio of its window (CONTEXT_SECONDS of what was
played before it, for the loudness reference, and the lookahead after it), exactly
as the live renderer prepares it, and the speech is delayed by that lookahead and no
more. A queue that runs dry mid-turn (speech arriving slower than real time) plays
silent frames until it holds the lookahead again: the gap is heard, the mouth rests.

Speech starts and ends on whatever loop frame is showing: the mouth opens from and
closes to the stored frame's own (the renderer's fades), so nothing jumps. `switch`
waits for the loop to come back to its first frame, then plays the new loop from its
first frame (the check is made when a frame is fetched, FETCH_AHEAD frames before it
is shown). `samples_per_frame` is audio_rate / fps rounded; when that is not whole,
fps becomes audio_rate / samples_per_frame, so that audio and video keep one clock.

Work per frame: one renderer prepare on the window (about 1 ms for warp's 4 s) and
the mouth of one frame; stored frames are decoded ahead on a thread, each once per
process while the loop frames' budget holds them (pipeline/loop_frames.py: kept as I420
and shared by the process's sessions; a frame at rest goes to the encoder as kept).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.render.live import CONTEXT_SECONDS, LOOKAHEAD, PcmDecoder
from pipeline.render.video import _get, _put, _Stop

FETCH_AHEAD = 4  # stored frames decoded before they are shown
SEGMENT = 3000  # output frames per fetch schedule (2 min at 25 fps); then a new one
MAX_QUEUE_SECONDS = 120.0  # speech queued and not yet played; more is refused


@dataclass
class Frame:
    index: int
    video: object  # av.VideoFrame, yuv420p
    audio: np.ndarray  # (samples_per_frame,) int16 mono
    speaking: bool
    speech_onset: float | None
    opening: float | None = None

    def to_rgb(self) -> np.ndarray:
        from pipeline.yuv import to_rgb

        return to_rgb(self.video)


class _Speech:
    """The queued speech at two rates (the output's and the renderer's), with the time
    each pushed chunk arrived. Every method is called with the conversation's lock."""

    def __init__(self, out_rate: int, render_rate: int, max_queue: float) -> None:
        self.out_rate, self.render_rate = out_rate, render_rate
        self.max_queue = max_queue  # s of speech queued and not played; more is refused
        self.decoders: tuple[PcmDecoder, PcmDecoder] | None = None
        self.fmt: tuple[int, int] | None = None
        self.out = np.zeros(0, np.float32)
        self.ren = np.zeros(0, np.float32)
        self.taken = 0  # output samples taken from the queue since the start
        self.onsets: deque[tuple[int, float]] = deque()  # (first output sample, time)
        self.ended = False  # end_of_turn: nothing more comes for what is queued

    def push(self, pcm: bytes, rate: int, channels: int, now: float) -> None:
        if self.fmt != (rate, channels):
            self.flush()
            self.fmt = (rate, channels)
            self.decoders = (
                PcmDecoder(rate, channels, self.out_rate),
                PcmDecoder(rate, channels, self.render_rate),
            )
        out, ren = (d.feed(pcm) for d in self.decoders)
        at = self.taken + self.out.size
        self._add(out, ren)  # ValueError past max_queue: the piece leaves nothing behind
        self.ended = False  # (a refused piece neither stamps an onset nor reopens the turn)
        if out.size:
            self.onsets.append((at, now))

    def flush(self) -> None:
        """The decoders' last samples into the queue (a turn ends, or the format changes)."""
        if self.decoders is not None:
            self._add(*(d.feed(None) for d in self.decoders))
        self.decoders, self.fmt = None, None

    def _add(self, out: np.ndarray, ren: np.ndarray) -> None:
        if self.out.size + out.size > self.max_queue * self.out_rate:
            raise ValueError(f"over {self.max_queue:g} s of speech queued; push it as it is spoken")
        self.out = np.concatenate([self.out, out])
        self.ren = np.concatenate([self.ren, ren])

    def clear(self) -> None:
        self.decoders, self.fmt = None, None
        self.taken += self.out.size
        self.out = np.zeros(0, np.float32)
        self.ren = np.zeros(0, np.float32)
        self.onsets.clear()
        self.ended = False

    def take(self, n_out: int, n_ren: int) -> tuple[np.ndarray, np.ndarray, float | None]:
        """The next frame's samples at both rates (zero-padded at a turn's end), and the
        arrival time of the chunk that holds its first sample."""
        while len(self.onsets) > 1 and self.onsets[1][0] <= self.taken:
            self.onsets.popleft()  # chunks wholly played
        first = self.onsets[0] if self.onsets and self.out.size else None
        onset = first[1] if first is not None and first[0] <= self.taken else None
        out, ren = _padded(self.out, n_out), _padded(self.ren, n_ren)
        self.out, self.ren = self.out[n_out:], self.ren[n_ren:]
        self.taken += n_out
        if not self.out.size:  # the resamplers' delays differ: start the next run level
            self.ren = self.ren[:0]
        if not self.out.size and self.ended:
            self.ended = False  # the turn is played out
        return out, ren, onset


def _padded(a: np.ndarray, n: int) -> np.ndarray:
    if a.size >= n:
        return a[:n].copy()
    return np.concatenate([a, np.zeros(n - a.size, np.float32)])


class Conversation:
    """One avatar in a conversation (the module doc gives the interface)."""

    def __init__(
        self,
        assets,
        *,
        backend: str = "warp",
        fps: float | None = None,
        audio_rate: int = 48000,
        models_dir: str | Path | None = None,
        device: str | None = None,
        loop: str = "pingpong",
        vae: str | None = None,
        max_queue: float = MAX_QUEUE_SECONDS,
    ) -> None:
        from pipeline.render.renderers import load_renderer
        from pipeline.render.schedule import LOOP_MODES

        if loop not in LOOP_MODES:
            raise ValueError(f"loop mode {loop!r} is not one of {', '.join(LOOP_MODES)}")
        if not 8000 <= int(audio_rate) <= 192000:
            raise ValueError(f"audio_rate {audio_rate!r} must be 8000 to 192000 Hz")
        self.renderer = load_renderer(backend, models_dir, device, vae=vae)
        self.look = LOOKAHEAD.get(backend, 2)
        if hasattr(self.renderer, "lookahead"):  # it sees only what a conversation has
            self.renderer.lookahead = self.look
        self.audio_rate = int(audio_rate)
        asked = float(fps or self.renderer.fps or assets.fps)
        self.samples_per_frame = max(1, int(round(self.audio_rate / asked)))
        self.fps = self.audio_rate / self.samples_per_frame
        self.sr = int(self.renderer.sample_rate)
        self.width, self.height = assets.width - assets.width % 2, assets.height - assets.height % 2
        self.loop = loop
        self.context = int(round(CONTEXT_SECONDS * self.fps))
        self._lock = threading.Lock()
        self._speech = _Speech(self.audio_rate, self.sr, float(max_queue))
        self._running = False  # the last frame took speech
        self._hush = False  # interrupted: the next frame's window is silence
        # renderer-rate samples of the frames before: silence to begin with, as after an
        # interrupt (a renderer that rests only after a long enough pause, musetalk's,
        # drew a talking mouth over the first frames of a short window)
        self._history: deque[np.ndarray] = deque(maxlen=self.context + 1)
        self._listen()
        self._t = 0
        self._assets = assets
        # the assets of the last frame rendered: a switch's old ones are read until a
        # frame of the new ones comes out (what a caller's lease on them must cover)
        self.playing = assets
        self._pending = None  # assets to switch to at the next loop point
        self._stop = threading.Event()
        self._errors: list[BaseException] = []
        import queue

        self._fetched: queue.Queue = queue.Queue(maxsize=FETCH_AHEAD)
        self._thread = threading.Thread(target=self._fetch_guarded, name="talk-fetch", daemon=True)
        self._thread.start()

    # -- input, from any thread
    def push_speech(self, pcm: bytes, rate: int, channels: int) -> None:
        """Queue s16le interleaved PCM at (rate, channels); chunks may split samples."""
        if not pcm:
            return
        now = time.monotonic()
        with self._lock:
            self._speech.push(bytes(pcm), int(rate), int(channels), now)

    def end_of_turn(self) -> None:
        """No more speech follows what is queued: play it out to its last sample."""
        with self._lock:
            self._speech.flush()
            self._speech.ended = bool(self._speech.out.size)

    def interrupt(self) -> None:
        """Drop the queued speech; the next frame's mouth is at rest and its audio silent."""
        with self._lock:
            self._speech.clear()
            self._running = False
            self._hush = True

    def switch(self, assets) -> None:
        """Play `assets` (the same frame size) from the next loop point on."""
        if (assets.width - assets.width % 2, assets.height - assets.height % 2) != (
            self.width,
            self.height,
        ):
            raise ValueError(
                f"switch to {assets.width}x{assets.height}: this conversation is "
                f"{self.width}x{self.height}; start another for another size"
            )
        with self._lock:
            self._pending = assets

    def queued_seconds(self) -> float:
        """Seconds of speech queued and not played yet."""
        with self._lock:
            return self._speech.out.size / self.audio_rate

    # -- output, from one thread
    def next_frame(self) -> Frame:
        """Render the next frame now (the caller paces the calls at `fps`)."""
        from pipeline.render.compose import compose

        if self._stop.is_set() and not self._errors:
            raise RuntimeError("the conversation is closed")
        t = self._t
        n_out = self.samples_per_frame
        n_ren = self._ren_end(t + 1) - self._ren_end(t)
        with self._lock:
            if self._hush:
                self._listen()  # the mouth forgets the cut-off speech
                self._hush = False
            s = self._speech
            ahead = sum(
                self._ren_end(t + 1 + k + 1) - self._ren_end(t + 1 + k) for k in range(self.look)
            )
            ready = (
                s.out.size >= n_out * (1 + self.look)
                or (s.ended and s.out.size > 0)
                or (self._running and s.out.size >= n_out)
            )
            if ready:
                out, ren, onset = s.take(n_out, n_ren)
            else:
                out, ren, onset = np.zeros(n_out, np.float32), np.zeros(n_ren, np.float32), None
            self._running = ready
            lookahead = _padded(s.ren, ahead)  # what the next frames will take
        self._history.append(ren)
        window = np.concatenate([*self._history, lookahead])
        n_window = len(self._history) + self.look
        item = self._next_item()
        assets, idx, stored, owned = item
        self.playing = assets
        self.renderer.prepare(assets, window, self.sr, n_window, self.fps)
        at = len(self._history) - 1  # frame t in the window
        video = compose(self.renderer, [at], [idx], [stored], self.width, self.height, [owned])[0]
        opening = None
        if hasattr(self.renderer, "openness"):
            o = self.renderer.openness()
            opening = float(o[at]) if at < o.size else 0.0
        pcm = np.clip(np.round(out * 32767.0), -32768, 32767).astype(np.int16)
        self._t += 1
        return Frame(t, video, pcm, ready, onset, opening)

    def _listen(self) -> None:
        """The history: a window's worth of silence."""
        n = self._ren_end(1)
        self._history.extend(np.zeros(n, np.float32) for _ in range(self.context))

    def _ren_end(self, t: int) -> int:
        """Renderer-rate samples up to the end of frame t - 1."""
        return int(round(t * self.sr / self.fps))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> Conversation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the stored frames, fetched ahead in schedule order
    def _next_item(self) -> tuple:
        try:
            return _get(self._fetched, self._stop)
        except _Stop:
            if self._errors:
                raise self._errors[0] from None
            raise RuntimeError("the conversation is closed") from None

    def _fetch_guarded(self) -> None:
        try:
            self._fetch()
        except _Stop:
            pass
        except BaseException as exc:  # noqa: BLE001 - raised in next_frame's thread
            self._errors.append(exc)
            self._stop.set()

    def _fetch(self) -> None:
        from pipeline.frames import CACHE_BYTES, yuv_loader
        from pipeline.loop_frames import LoopFrames, shared
        from pipeline.render.schedule import schedule

        assets = self._assets
        own = None  # in-memory frames (no content key): kept for this conversation alone
        while not self._stop.is_set():
            n = assets.n_frames
            period = 1 if n == 1 else (n if self.loop == "cycle" else 2 * n - 2)
            idxs = schedule(max(1, SEGMENT // period) * period, n, self.loop)
            load = assets.load_frame
            decode = yuv_loader(load)
            if hasattr(load, "frame_key"):
                frames, key = shared(), load.frame_key
            else:
                own = own or LoopFrames(CACHE_BYTES)
                frames, key = own, functools.partial(_own_key, load)
            for t, i in enumerate(idxs):
                if t % period == 0:  # a loop point: the first stored frame comes next
                    with self._lock:
                        switch, self._pending = self._pending, None
                    if switch is not None and switch is not assets:
                        assets = switch
                        break
                # at the latest, a frame comes back a loop's period later
                frame, owned = frames.get(key(i), functools.partial(decode, i), period / self.fps)
                _put(self._fetched, (assets, i, frame, owned), self._stop)


def _own_key(load, i: int) -> tuple:
    return (load, i)  # the loader itself, not its id: kept, it is not reused for another

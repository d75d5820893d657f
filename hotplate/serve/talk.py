"""What a render worker runs for a conversation session (job kind "talk"): one hot
avatar in a `Conversation` (pipeline/render/conversation.py), sent over one WebRTC peer
connection (rtc.py), steered by the server over a control socket (talk_wire.py).

The session holds its worker and its avatar's lease (`hot_avatar`, as every render
does) from the start to its end, which is the
first of: the server's hangup (DELETE of the session or of its WHEP resource), the
peer failing or closing (ICE consent lost: a peer that vanished), no ICE connection
ICE_TIMEOUT s after the answer, a malformed offer, no control connection within
CONNECT_TIMEOUT s or no offer within OFFER_TIMEOUT s of the start, the session limit,
the control channel closing (the server went away), or the render failing. The job
then returns (the worker is free, the lease released) and the server logs one line
with the reason the worker sent in its last message.

What a session holds is bounded, whatever a client sends:
- one peer: a second offer is refused (409) from the moment the first is taken, before
  its answer is made (two offers at once would give one conversation two pumps);
- leases: a switch leases the new avatar and releases the one it leaves once a frame
  of the new one is out (the old one is read until then); switches run one at a time,
  so a session holds two leases at most, and one when no switch is pending;
- speech: what would queue past limits.SPEECH_QUEUE_SECONDS (120 s) is refused, with
  an event that says so ({"event": "refused", "error", "status": 429}; the server
  answers the client's next message with it); the session and its control channel go
  on, and an interrupt empties the queue (answered when it carries an id, so that the
  server knows every refusal from before it has come);
- trickled candidates: limits.MAX_TRICKLED_CANDIDATES per peer, each naming an address
  ICE may check (trickle.py); queued sound and pictures: rtc.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from hotplate.serve import limits
from hotplate.serve import talk_wire as wire
from hotplate.serve.trickle import (
    TrickleError,
    add_candidates,
    remote_candidate_types,
    selected_candidate_type,
)

CONNECT_TIMEOUT = 15.0  # s from ready: the server connects to the control socket
# s from ready: a session no player connects to ends
OFFER_TIMEOUT = float(os.environ.get("HOTPLATE_SESSION_OFFER_TIMEOUT", "60"))
# s from the answer: a peer that never completes ICE ends the session
ICE_TIMEOUT = float(os.environ.get("HOTPLATE_SESSION_ICE_TIMEOUT", "10"))
LEASE_CHECK = 0.2  # s between looks at whether a switch's old avatar still plays


def run_talk_job(
    store: Any, settings: dict, fields: dict, recipe: Any, progress, status_for
) -> dict:
    """One "talk" job, start to end (module doc); returns its figures. `status_for`: the
    HTTP status of an exception (workers.py's), for a switch that fails."""
    from hotplate.serve import rtc
    from pipeline.lip_sync import LipSyncRequest, hot_avatar
    from pipeline.render.conversation import Conversation

    personas, backend = Path(settings["personas"]), fields["backend"]

    def hot(persona: str, attire: str, motion: str | None) -> tuple[Any, Any, ExitStack]:
        """The avatar hot and leased: (HotAvatar, its assets, the lease to close)."""
        request = LipSyncRequest(
            persona, attire, Path(os.devnull), Path(os.devnull), motion, backend=backend
        )
        steps = hot_avatar(
            store,
            personas,
            recipe,
            request,
            progress,
            settings["flight_wait"],
            on_jit=progress.jit,
        )
        with ExitStack() as lease:
            found = lease.enter_context(steps)
            assets = found.assets(store)
            return found, assets, lease.pop_all()

    def switched(persona: str, attire: str, motion: str | None) -> tuple[Any, ExitStack]:
        _, assets, lease = hot(persona, attire, motion)
        return assets, lease

    with ExitStack() as leases:
        first, assets, lease = hot(fields["persona"], fields["attire"], fields.get("motion"))
        leases.enter_context(lease)
        rtc.configure_ice(fields.get("ice_addresses") or None)
        rtc.configure_bitrate(fields.get("profile") or "preview")
        conv = Conversation(
            assets,
            backend=backend,
            fps=first.options.get("fps"),
            loop=first.options.get("loop") or settings["loop"],
            models_dir=first.recipe.models_dir,
            vae=first.recipe.vae or None,
            max_queue=limits.SPEECH_QUEUE_SECONDS,
        )
        with conv:
            session = TalkSession(conv, fields, switched, status_for)
            session.held.append((assets, lease))
            leases.callback(session.release_leases)
            # no done/total: admission estimates a session's length from finished ones
            result = asyncio.run(session.run(lambda: progress("talk ready", 0, 0)))
    result["avatar"] = first.avatar
    result["jit"], result["jit_seconds"] = first.jit, first.jit_seconds
    return result


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _memory() -> dict[str, int]:
    """This process's resident memory now and at its peak, bytes (/proc/self/status)."""
    out = {}
    with contextlib.suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out["rss_bytes" if key == "VmRSS" else "rss_peak_bytes"] = 1024 * int(
                    value.split()[0]
                )
    return out


class TalkSession:
    """The session's event loop: the control channel, the peer, the deadlines."""

    def __init__(self, conv, fields: dict, hot, status_for) -> None:
        self.conv, self.fields, self.hot, self.status_for = conv, fields, hot, status_for
        self.peer = None
        self.writer: asyncio.StreamWriter | None = None
        self.pushed = 0  # bytes of PCM pushed, per (rate, channels) below
        self.speech_seconds = 0.0
        self.offered: float | None = None  # monotonic time of the offer
        self.trickled = 0  # candidates the player sent after its offer (PATCH)
        self.claimed = False  # an offer took the session's one peer (module doc)
        self.refused = 0.0  # s of speech refused: the queue was full
        self.refusal: str | None = None  # why, the last time
        self.switching = asyncio.Lock()
        # (assets, their lease) the conversation plays or will: the first, then each switch
        self.held: list[tuple[Any, ExitStack]] = []
        self.releasing: asyncio.Task | None = None
        self.tasks: set[asyncio.Task] = set()

    def end(self, why: str) -> None:
        if not self.ended.done():
            self.ended.set_result(why)

    async def run(self, ready) -> dict:
        loop = asyncio.get_running_loop()
        self.ended = loop.create_future()
        path = self.fields["control"]
        server = await asyncio.start_unix_server(self._serve, path=path)
        os.chmod(path, 0o600)
        self.started, self.cpu_at_start = time.monotonic(), _cpu_seconds()
        self.rss_at_ready = _memory().get("rss_bytes")
        ready()
        watchdog = self._spawn(self._deadlines())
        try:
            why = await self.ended
        finally:
            watchdog.cancel()
            server.close()
            with contextlib.suppress(OSError):
                os.unlink(path)
        figures = await self._close(why)
        return figures

    async def _close(self, why: str) -> dict:
        figures = self.figures()
        if self.peer is not None:
            await asyncio.to_thread(self.peer.pump.stop)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.peer.pc.close(), 5.0)
        for task in list(self.tasks):
            task.cancel()
        if self.writer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    wire.send_json(self.writer, {"event": "ended", "why": why, **figures}), 2.0
                )
                self.writer.close()
        figures["why"] = why
        return figures

    def figures(self) -> dict:
        from hotplate.serve import rtc

        out: dict[str, Any] = {
            "audio_seconds": round(self.speech_seconds, 3),
            # the worker's CPU (render, encode, network) since the session was ready
            "cpu_seconds": round(_cpu_seconds() - self.cpu_at_start, 3),
            "seconds": round(time.monotonic() - self.started, 3),
            "fps": self.conv.fps,
            "width": self.conv.width,
            "height": self.conv.height,
            "leases": len(self.held),
            "refused_speech_seconds": round(self.refused, 3),
            # the worker's memory: the session holds the whole process (one a worker)
            "worker": {**_memory(), "rss_at_ready_bytes": self.rss_at_ready},
        }
        if self.refusal is not None:
            out["refused_speech"] = self.refusal
        if self.peer is not None:
            s, pump = self.peer.pump.stats, self.peer.pump
            out["codec"] = self.peer.codec
            # where the worker's CPU went, ms per frame (rtc.cpu_split)
            out["cpu_ms_per_frame"] = rtc.cpu_split(self.peer)
            out.update(
                frames=s.frames,
                speaking_frames=s.speaking,
                late_frames=s.late,
                dropped_frames=s.dropped,
                stalls=s.stalls,
                render_seconds=round(s.render_seconds, 3),
                # the tracks' queues (rtc.py bounds them): now, and the most ever
                queued_video_frames=pump.video.qsize(),
                queued_audio_frames=pump.audio.qsize(),
                queued_audio_peak=s.audio_peak,
                dropped_audio_frames=s.audio_dropped,
            )
            if s.first_frame is not None and self.offered is not None:
                out["first_frame_seconds"] = round(s.first_frame - self.offered, 4)
            out["handover_seconds"] = [round(h - o, 4) for o, h in s.onsets]
            out["ice"] = {
                "trickled": self.trickled,
                "remote_candidates": remote_candidate_types(self.peer.pc),
                "selected": selected_candidate_type(self.peer.pc),
            }
        return out

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _deadlines(self) -> None:
        await asyncio.sleep(min(CONNECT_TIMEOUT, OFFER_TIMEOUT))
        if self.writer is None:
            self.end(f"the server did not connect to the session within {CONNECT_TIMEOUT:g} s")
            return
        await asyncio.sleep(max(0.0, OFFER_TIMEOUT - CONNECT_TIMEOUT))
        if self.peer is None:
            self.end(f"no WHEP offer within {OFFER_TIMEOUT:g} s of the session's start")
            return
        limit = float(self.fields.get("max_seconds") or 3600.0)
        await asyncio.sleep(max(0.0, limit - OFFER_TIMEOUT))
        self.end(f"the session reached its {limit:g} s limit")

    # -- the control channel
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.writer is not None:  # one controller: the server
            writer.close()
            return
        self.writer = writer
        while not self.ended.done():
            try:
                got = await wire.receive(reader)
            except asyncio.CancelledError:
                # the session ended by itself (a bad offer, no ICE) with the server's
                # channel still open: asyncio.run cancels this read as it closes, and
                # Python 3.11's stream callback prints a cancelled handler as a 17-line
                # "Exception in callback" before the session's one line
                return
            except (ValueError, json.JSONDecodeError) as exc:
                self.end(f"the control channel sent a bad message: {exc}")
                return
            if got is None:
                self.end("the server closed the control channel")
                return
            kind, body = got
            if kind == wire.PCM:
                await self._speech(*body)
                continue
            await self._operation(body)

    async def _speech(self, rate: int, channels: int, pcm: bytes) -> None:
        """Queue the PCM; past SPEECH_QUEUE_SECONDS it is refused, and the server told."""
        seconds = len(pcm) / (2 * channels * rate) if rate and channels else 0.0
        try:
            self.conv.push_speech(pcm, rate, channels)
        except ValueError as exc:  # the queue is full: this piece is dropped, said once
            self.refused += seconds
            self.refusal = (
                f"{seconds:.2f} s of speech refused: {exc} (it is rendered slower than it "
                "comes; wait for the avatar to catch up, or interrupt)"
            )
            if self.writer is not None:
                with contextlib.suppress(ConnectionError):
                    event = {"event": "refused", "error": self.refusal, "status": 429}
                    await wire.send_json(self.writer, event)
            return
        self.speech_seconds += seconds

    async def _operation(self, msg: dict) -> None:
        op = msg.get("op")
        if op == "end_of_turn":
            self.conv.end_of_turn()
        elif op == "interrupt":
            self.interrupt()
            await self._reply(msg, {})
        elif op == "hangup":
            self.end(str(msg.get("why") or "the session was ended"))
        elif op == "stats":
            await self._reply(msg, self.figures())
        elif op == "offer":
            self._spawn(self._offer(msg))
        elif op == "candidates":  # a task: a player's mDNS name takes a lookup
            self._spawn(self._candidates(msg))
        elif op == "switch":
            self._spawn(self._switch(msg))
        else:
            await self._reply(msg, {"error": f"unknown operation {op!r}", "status": 400})

    async def _reply(self, msg: dict, body: dict) -> None:
        if self.writer is not None and "id" in msg:
            with contextlib.suppress(ConnectionError):
                await wire.send_json(self.writer, {"id": msg["id"], **body})

    def interrupt(self) -> None:
        """The mouth at rest from the next frame; the sound already rendered and not yet
        sent silenced too, once a peer is there (rtc.FramePump.interrupt)."""
        if self.peer is not None:
            self.peer.pump.interrupt()
        else:
            self.conv.interrupt()

    def on_channel_message(self, text: str) -> None:
        """A data-channel message from the page: "interrupt", "end_of_turn", or either as
        {"type": ...}."""
        try:
            kind = json.loads(text).get("type") if text.lstrip().startswith("{") else text
        except (ValueError, AttributeError):
            return
        if kind == "interrupt":
            self.interrupt()
        elif kind == "end_of_turn":
            self.conv.end_of_turn()

    async def _offer(self, msg: dict) -> None:
        from hotplate.serve import rtc

        if self.claimed:  # claimed before the answer is awaited: two offers get one peer
            await self._reply(
                msg,
                {
                    "error": "this session has its peer already; start another session",
                    "status": 409,
                },
            )
            return
        self.claimed = True
        self.offered = time.monotonic()
        try:
            peer, sdp = await rtc.answer(
                msg.get("sdp"),
                self.conv,
                self.fields.get("ice_servers") or (),
                self.on_channel_message,
            )
        except ValueError as exc:
            await self._reply(msg, {"error": str(exc), "status": 400})
            self.end(f"malformed offer: {exc}")
            return
        self.peer = peer
        await self._reply(msg, {"sdp": sdp})
        self._spawn(self._watch(peer))

    async def _candidates(self, msg: dict) -> None:
        if self.peer is None:
            error = "this session has no peer yet: POST the offer to its whep URL first"
            await self._reply(msg, {"error": error, "status": 409})
            return
        try:
            room = limits.MAX_TRICKLED_CANDIDATES - self.trickled
            added = await add_candidates(self.peer.pc, str(msg.get("sdpfrag") or ""), room)
        except TrickleError as exc:
            await self._reply(msg, {"error": str(exc), "status": exc.status})
            return
        except Exception as exc:  # noqa: BLE001 - aiortc's and aioice's refusals: one line
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            await self._reply(msg, {"error": f"ICE refused a candidate: {detail}", "status": 400})
            return
        self.trickled += added
        await self._reply(msg, {"added": added})

    async def _watch(self, peer) -> None:
        try:
            await asyncio.wait_for(peer.connected.wait(), ICE_TIMEOUT)
        except TimeoutError:
            self.end(f"the peer did not complete ICE within {ICE_TIMEOUT:g} s of the answer")
            return
        if self.writer is not None:
            with contextlib.suppress(ConnectionError):
                await wire.send_json(self.writer, {"event": "connected"})
        self.end(await peer.gone)

    async def _switch(self, msg: dict) -> None:
        from watcher.process import one_line

        async with self.switching:  # one at a time: the last asked is the one played
            try:
                assets, lease = await asyncio.to_thread(
                    self.hot, msg.get("persona"), msg.get("attire"), msg.get("motion")
                )
            except Exception as exc:  # noqa: BLE001 - the caller is told, the session goes on
                await self._reply(msg, {"error": one_line(exc), "status": self.status_for(exc)})
                return
            try:
                self.conv.switch(assets)
            except Exception as exc:  # noqa: BLE001 - the same
                lease.close()
                await self._reply(msg, {"error": one_line(exc), "status": self.status_for(exc)})
                return
            self.held.append((assets, lease))
            self.release_leases(keep=True)
            if len(self.held) > 1 and (self.releasing is None or self.releasing.done()):
                self.releasing = self._spawn(self._release_when_left())
        await self._reply(msg, {})

    def release_leases(self, keep: bool = False) -> None:
        """Release the leases of the assets the conversation has left: all but the last
        switched to and the one it plays (its old ones are read until a frame of the new
        ones comes out); without `keep`, every lease (the session's end)."""
        wanted = (self.held[-1][0], self.conv.playing) if keep and self.held else ()
        kept = []
        for assets, lease in self.held:  # by identity: assets hold arrays (no ==)
            if any(assets is w for w in wanted):
                kept.append((assets, lease))
            else:
                lease.close()
        self.held = kept

    async def _release_when_left(self) -> None:
        """Release the old assets' lease once the conversation plays the new ones: from
        its next loop point on (never while no peer has started its frames)."""
        while len(self.held) > 1:
            await asyncio.sleep(LEASE_CHECK)
            self.release_leases(keep=True)

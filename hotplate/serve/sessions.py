"""Conversation sessions, the server's side (the worker's is talk.py; the routes are
routes/sessions.py).

A session is a job of kind "talk" on the render queue: admitted as any work is, then it
holds its worker for its whole life. `Sessions.create` checks the caps (sessions in all,
`--max-sessions`, and per client, `--max-sessions-per-client`: 503 with Retry-After when
full), queues the job, waits until its worker says the avatar is hot and the control
socket listens (a JIT precompile included, at most READY_TIMEOUT s), and connects to it
(talk_wire.py). Every later call of the session's URLs is one message on that socket.

When the worker ends the session (its peer went away, never connected, a hangup, ...)
it says why and returns; `_follow` sees the socket close, waits for the job to finish
(HANGUP_GRACE s, then the worker is killed, as a cancel does), forgets the session and
logs one line: `session <id> ended after <s> s: <why> (<figures>)`.

What a session holds is bounded (limits.py): one speech socket (speech.py; a newer one
replaces it), closed the moment the session starts to end, before the worker is waited
for, so that nothing of a session outlives it by more than a moment. Speech is bounded
twice: here by the pace (MAX_AHEAD s ahead of the wall clock), in the worker by its queue
(limits.SPEECH_QUEUE_SECONDS, which a render slower than real time reaches within the
pace); the worker's refusal comes as an event, after the speech it refused was sent, so
it is kept and said to the client's next message of speech (PCM or end of turn: 429, or
the socket's 1008 close), once; an interrupt empties the queue and forgets it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hotplate.serve import limits
from hotplate.serve import talk_wire as wire
from hotplate.serve.config import seconds
from hotplate.serve.problems import Problem
from hotplate.serve.records import FINISHED, Job, snapshot
from hotplate.serve.speech import ENDED, REPLACED, SpeechSocket

log = logging.getLogger("hotplate.serve")

READY_TIMEOUT = 120.0  # s: from POST /v1/sessions to a hot avatar and a listening worker
CALL_TIMEOUT = 20.0  # s: a worker's answer to an offer or a stats call
SWITCH_TIMEOUT = 120.0  # s: a switch may precompile the new attire just in time
HANGUP_GRACE = 5.0  # s: a worker that has not ended this long after a hangup is killed
RETRY_AFTER = 10  # s: when a full server may have a session free (sessions end unannounced)
MAX_AHEAD = 60.0  # s: speech pushed ahead of what has played; more is refused (the pace)


@dataclass
class Session:
    id: str
    job: Job
    owner: str
    control: Path
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    replies: dict[int, asyncio.Future] = field(default_factory=dict)
    calls: int = 0
    created: float = field(default_factory=time.monotonic)
    connected: bool = False  # the peer completed ICE
    why: str | None = None  # why it ended, from the worker's last message
    figures: dict = field(default_factory=dict)
    queued_until: float = 0.0  # monotonic time the speech pushed so far ends playing
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False  # it is ending: no new socket or call is taken
    speech: SpeechSocket | None = None  # its one open speech socket
    refusal: tuple[int, str] | None = None  # (status, line): the worker refused speech

    def pace(self, seconds: float) -> None:
        """Count `seconds` of speech pushed now; Problem 429 when it runs more than
        MAX_AHEAD s ahead of what has played (a client sending as fast as it can)."""
        now = time.monotonic()
        ahead = max(now, self.queued_until) + seconds
        if ahead - now > MAX_AHEAD:
            raise Problem(
                429,
                f"speech arrives over {MAX_AHEAD:g} s ahead of what the avatar has said; "
                "send it as it is spoken, or interrupt first",
            )
        self.queued_until = ahead

    def check_refusal(self) -> None:
        """Problem with the worker's last refusal of speech, once (module doc)."""
        if self.refusal is not None:
            (status, error), self.refusal = self.refusal, None
            raise Problem(status, error)


class Sessions:
    """The live sessions of this server (module doc)."""

    def __init__(self, svc: Any) -> None:
        self.svc = svc
        cfg = svc.config
        self.max_sessions = cfg.max_sessions if cfg.max_sessions is not None else cfg.workers
        self.per_client = cfg.max_sessions_per_client or cfg.per_client_cap
        self.max_seconds = seconds(cfg.max_session) or 86400.0
        loopback = cfg.host in ("127.0.0.1", "localhost", "::1")
        self.ice_addresses = cfg.ice_addresses or (("127.0.0.1",) if loopback else ())
        self.live: dict[str, Session] = {}
        self.starting: dict[str, int] = {}  # client -> sessions being created
        self._dir: Path | None = None
        self.tasks: set[asyncio.Task] = set()

    @property
    def dir(self) -> Path:
        """The control sockets' directory: one only this user can enter (mkdtemp's 0700),
        short enough for a socket path (108 bytes). Made at the first session, so a server
        that hosts none leaves nothing in the temporary folder, even when it is killed."""
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="hotplate-talk-"))
        return self._dir

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    # -- creating
    def admit(self, client: str) -> None:
        """admission.Busy when the session caps are full (the admission middleware asks
        this before the queue's estimate, so that the refusal names the cap)."""
        from hotplate.serve.admission import Busy

        try:
            self.check_caps(client, count=False)
        except Problem as exc:
            raise Busy("sessions_full", RETRY_AFTER, exc.detail) from None

    def check_caps(self, client: str, count: bool = True) -> None:
        total = len(self.live) + sum(self.starting.values())
        mine = sum(s.owner == client for s in self.live.values()) + self.starting.get(client, 0)
        if total >= self.max_sessions:
            why = f"the server holds its {self.max_sessions} conversation sessions (--max-sessions)"
        elif mine >= self.per_client:
            why = f"this client holds its {self.per_client} sessions (--max-sessions-per-client)"
        else:
            return
        if count:  # the admission middleware counts its own refusals
            self.svc.metrics.refused.labels("talk", "sessions_full").inc()
        raise Problem(
            503, f"{why}; end one or retry in {RETRY_AFTER} s", {"Retry-After": str(RETRY_AFTER)}
        )

    async def create(self, client: str, names: dict, fields: dict) -> Session:
        """A new session, its worker ready and its control socket connected; Problem with
        the job's status when it cannot start (names, caps, queue, JIT failure)."""
        self.check_caps(client)
        self.starting[client] = self.starting.get(client, 0) + 1
        try:
            return await self._create(client, names, fields)
        finally:
            self.starting[client] -= 1
            if not self.starting[client]:
                del self.starting[client]

    async def _create(self, client: str, names: dict, fields: dict) -> Session:
        svc = self.svc
        backend = fields["backend"]
        job = await asyncio.to_thread(
            svc.new_job, "talk", names["persona"], names["attire"], names.get("motion"), backend
        )
        job.owner = client
        control = self.dir / f"{job.id[-16:]}.sock"
        fields = {
            "persona": job.persona,
            "attire": job.attire,
            "motion": job.motion,
            "control": str(control),
            **fields,
        }
        session = Session(job.id, job, client, control)
        svc.queue.submit(job, fields, svc.recipe_for_backend(backend))
        deadline = time.monotonic() + READY_TIMEOUT
        while job.state not in FINISHED and job.step != "talk ready":
            left = deadline - time.monotonic()
            if left <= 0:
                await svc.queue.cancel(job, "the session was not ready in time")
                raise Problem(
                    503,
                    f"the session's avatar was not ready within {READY_TIMEOUT:g} s; retry",
                    {"Retry-After": str(RETRY_AFTER)},
                )
            await svc.queue.wait(job, snapshot(job), min(left, 1.0))
        if job.state in FINISHED:
            raise Problem(job.status or 500, job.error or f"the session {job.state}")
        try:
            session.reader, session.writer = await asyncio.open_unix_connection(str(control))
        except OSError as exc:
            await svc.queue.cancel(job, f"the session's control socket failed: {exc}")
            raise Problem(500, "the session's worker could not be reached; retry") from None
        self.live[session.id] = session
        self._spawn(self._follow(session))
        return session

    # -- using
    def get(self, session_id: str, client: Any) -> Session:
        """The caller's live session (an admin's: anyone's); 404 otherwise, for a session
        of another client too (its id is not confirmed)."""
        s = self.live.get(session_id)
        if s is None or s.closing or not (client.admin or s.owner == client.id):
            raise Problem(404, f"no live session {session_id}; create one with POST /v1/sessions")
        return s

    async def call(self, s: Session, message: dict, timeout: float = CALL_TIMEOUT) -> dict:
        """Send an operation and wait for its answer; Problem from the worker's error."""
        s.calls += 1
        message = {**message, "id": s.calls}
        fut = asyncio.get_running_loop().create_future()
        s.replies[s.calls] = fut
        try:
            await self.send(s, message)
            answer = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise Problem(
                504, f"the session's worker did not answer within {timeout:g} s"
            ) from None
        finally:
            s.replies.pop(message["id"], None)
        if "error" in answer:
            raise Problem(int(answer.get("status") or 500), answer["error"])
        return answer

    async def send(self, s: Session, message: dict) -> None:
        try:
            await wire.send_json(s.writer, message)
        except (ConnectionError, RuntimeError):
            raise Problem(404, f"session {s.id} has ended") from None

    async def pcm(self, s: Session, rate: int, channels: int, data: bytes) -> None:
        """Forward PCM, in control messages of at most MAX_PCM_MESSAGE bytes (what the
        worker takes); Problem 429 past the pace or with the worker's refusal of earlier
        speech (this piece is not sent), 404 once the session has ended."""
        s.check_refusal()
        s.pace(len(data) / (2 * channels * rate))
        step = limits.MAX_PCM_MESSAGE
        try:
            for at in range(0, len(data), step):
                await wire.send_pcm(s.writer, rate, channels, data[at : at + step])
        except (ConnectionError, RuntimeError):
            raise Problem(404, f"session {s.id} has ended") from None

    async def end_of_turn(self, s: Session) -> None:
        """The turn ends (the speech queued plays out to its last sample); then Problem
        429 when the worker refused some of it."""
        await self.send(s, {"op": "end_of_turn"})
        s.check_refusal()

    def attach_speech(self, s: Session, sock: SpeechSocket) -> None:
        """`sock` is the session's speech socket now; an older one is closed (4409)."""
        old, s.speech = s.speech, sock
        if old is not None:
            why = "a newer speech socket of this session replaced this one"
            self._spawn(old.close(REPLACED, why))

    def detach_speech(self, s: Session, sock: SpeechSocket) -> None:
        if s.speech is sock:
            s.speech = None

    def _closing(self, s: Session, why: str) -> None:
        """The session is ending: refuse new work and close its speech socket now (the
        close frame leaves at once; the closing handshake finishes in the background)."""
        s.closing = True
        if s.speech is not None:
            sock, s.speech = s.speech, None
            self._spawn(sock.close(ENDED, f"the session ended: {why}"[:120]))

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def interrupt(self, s: Session) -> None:
        """Drop the queued speech; answered by the worker, so that every refusal of
        speech sent before it has come, and is forgotten with it."""
        s.queued_until = time.monotonic()
        await self.call(s, {"op": "interrupt"})
        s.refusal = None

    async def end(self, s: Session, why: str) -> None:
        """Hang up and wait (HANGUP_GRACE s at most, then the worker is killed)."""
        self._closing(s, why)
        with contextlib.suppress(Problem):
            await self.send(s, {"op": "hangup", "why": why})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(s.ended.wait(), HANGUP_GRACE + 2.0)

    async def end_all(self, why: str) -> None:
        """End every session (a drain: a conversation never finishes by itself)."""
        await asyncio.gather(*(self.end(s, why) for s in list(self.live.values())))

    # -- ending
    async def _follow(self, s: Session) -> None:
        """Read the worker's events until its socket closes, then see the job end."""
        try:
            while (got := await wire.receive(s.reader)) is not None:
                _, msg = got
                if "id" in msg:
                    fut = s.replies.get(msg["id"])
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
                elif msg.get("event") == "connected":
                    s.connected = True
                elif msg.get("event") == "refused":  # said to the client's next speech
                    s.refusal = (int(msg.get("status") or 429), str(msg.get("error")))
                elif msg.get("event") == "ended":
                    s.why = msg.get("why")
                    s.figures = {k: v for k, v in msg.items() if k not in ("event", "why")}
        except Exception as exc:  # noqa: BLE001 - a broken channel ends the session too
            s.why = s.why or f"the control channel broke: {exc}"
        finally:
            await self._finish(s)

    async def _finish(self, s: Session) -> None:
        svc, job = self.svc, s.job
        self._closing(s, s.why or "its worker ended it")
        for fut in s.replies.values():
            if not fut.done():
                fut.set_result({"error": f"session {s.id} has ended", "status": 404})
        if s.writer is not None:
            s.writer.close()
        deadline = time.monotonic() + HANGUP_GRACE
        while job.state not in FINISHED and time.monotonic() < deadline:
            await svc.queue.wait(job, snapshot(job), 0.5)
        if job.state not in FINISHED:
            await svc.queue.cancel(job, f"the session's worker did not end: {s.why}")
        why = s.why or job.error or "the worker ended"
        f = s.figures
        log.info(
            "session %s ended after %.1f s: %s (frames %s, late %s, dropped %s, speech %s s)",
            s.id,
            time.monotonic() - s.created,
            why,
            f.get("frames", 0),
            f.get("late_frames", 0),
            f.get("dropped_frames", 0),
            f.get("audio_seconds", 0),
        )
        s.why = why
        self.live.pop(s.id, None)
        s.ended.set()

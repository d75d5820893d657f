"""Admission's cost model driven through the server's own JobQueue with a fake clock: a
cold server seeded by its warm-up, requests sized by their Content-Length and then by
their decoded audio, Retry-After against the queue as it really drains, and one
renderer's figures kept apart from another's. The queue is the real one (its SQLite
records included); what a worker process would do is played by hand: `dispatch` takes
the next job as a free worker does, `finish` is its answer, and the clock moves by the
job's true cost. Nothing sleeps."""

from __future__ import annotations

import asyncio
import random

import pytest

from hotplate.serve.admission import (
    PRIOR_BYTES_PER_SECOND,
    TICKET,
    Busy,
    Cost,
    ServiceTimes,
    spread_retry,
    whole_seconds,
)
from hotplate.serve.queue import JobQueue
from hotplate.serve.records import Job, JobRecords, new_id

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

SIZE = "1080x1920"
SEEDED = Cost(0.2, 0.8)  # a warm-up: 1 s of audio costs 1.0 s, 4 s cost 3.4 s
WAV_HEADER = 44


class Clock:
    """Wall seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def wav_bytes(seconds: float, per_s: float = PRIOR_BYTES_PER_SECOND) -> int:
    """A request's Content-Length for a WAV of `seconds` (form fields included)."""
    return int(seconds * per_s) + WAV_HEADER + 400


class Scene:
    """One server's queue (`workers` of them) and what its middleware and routes do."""

    def __init__(self, tmp_path, workers: int = 1, max_wait: float | None = 3.0) -> None:
        self.clock = Clock()
        records = JobRecords(tmp_path / f"jobs-{new_id()}.sqlite")
        self.queue = JobQueue(records, {}, workers, 100, max_wait=max_wait, clock=self.clock)
        self.true_cost: dict[str, float] = {}  # job id -> the seconds it really takes

    def seed(self, backend: str = "warp", cost: Cost = SEEDED) -> None:
        """What the workers' warm-up reports (queue.seed), for the loop astro/studio."""
        renders = [
            {
                "backend": backend,
                "size": SIZE,
                "seconds": cost.seconds(2.0),
                "audio_seconds": 2.0,
                "first_frame_seconds": cost.overhead,
                "names": ["astro", "studio", "default"],
            }
        ]
        self.queue.seed(renders)

    def request(
        self,
        audio_seconds: float,
        takes: float,
        backend: str = "warp",
        client: str = "editor",
        per_s: float = PRIOR_BYTES_PER_SECOND,
    ) -> Job | Busy:
        """A render request: admitted on its Content-Length (the middleware), its upload
        decoded and its job queued in the ticket's place (the route); or refused."""
        try:
            ticket = self.queue.admit("render", client, wav_bytes(audio_seconds, per_s))
        except Busy as busy:
            return busy
        job = Job(new_id(), "render", "astro", "studio", None, backend, self.clock())
        job.owner, job.audio_seconds = client, audio_seconds
        token = TICKET.set(ticket)
        try:
            self.queue.submit(job, {}, None)
        finally:
            TICKET.reset(token)
        self.true_cost[job.id] = takes
        return job

    async def serve_all(self) -> float:
        """One worker at a time takes the next job and runs it for its true cost (its
        first tenth before the first frame); returns the clock when the queue is empty."""
        while (entry := self.queue.dispatch("worker")) is not None:
            job = entry[0]
            takes = self.true_cost[job.id]
            self.clock.advance(takes)
            result = {
                "audio_seconds": job.audio_seconds,
                "first_frame_seconds": takes / 10,
                "size": SIZE,
            }
            await self.queue.finish(job, "done", result=result)
        return self.clock()


def burst(scene: Scene, n: int, audio_seconds: float, takes: float) -> tuple[list, list]:
    answers = [scene.request(audio_seconds, takes) for _ in range(n)]
    return [a for a in answers if isinstance(a, Job)], [a for a in answers if isinstance(a, Busy)]


def test_a_cold_burst_is_admitted_as_far_as_the_warm_up_says_it_fits(tmp_path):
    # unseeded (the old start): a 1 s clip is guessed at 1 s per second of audio, so
    # of 12 one-second renders it takes 4 (starts 0, 1, 2, 3)
    cold = Scene(tmp_path)
    admitted, refused = burst(cold, 12, 1.0, takes=1.0)
    assert len(admitted) == 4
    # seeded by the warm-up (0.2 s + 0.8 s per second): 4 s clips of 3.4 s each: one
    # starts now, the next at 3.4 s, past --max-wait 3
    seeded = Scene(tmp_path)
    seeded.seed()
    admitted, refused = burst(seeded, 12, 4.0, takes=3.4)
    assert len(admitted) == 1 and len(refused) == 11
    assert {b.reason for b in refused} == {"busy"}
    # 1 s clips, 1.0 s each: 4 fit in 3 s (starts 0, 1, 2, 3)
    short = Scene(tmp_path)
    short.seed()
    admitted, refused = burst(short, 12, 1.0, takes=1.0)
    assert len(admitted) == 4 and len(refused) == 8


def test_retry_after_is_when_the_queue_really_drains(tmp_path):
    scene = Scene(tmp_path)
    scene.seed()
    refused_at = scene.clock()
    admitted, refused = burst(scene, 12, 1.0, takes=1.0)
    drained = asyncio.run(scene.serve_all())
    actual = drained - refused_at
    assert actual == pytest.approx(4.0)
    for busy in refused:
        assert busy.wait == pytest.approx(actual, rel=0.01)
        # never before the queue drains; spread past it (4 s + up to 2 s), not all one value
        assert 4 <= busy.retry_after <= 6
        assert busy.headers == {"Retry-After": str(busy.retry_after)}
    # a burst refused together is told different instants (seeded draws: not flaky)
    rng = random.Random(0)
    told = {whole_seconds(spread_retry(4.0, rng.random)) for _ in range(50)}
    assert told == {4, 5, 6}
    # coming back then, the request is admitted and starts at once
    assert scene.queue.expected_start("render", "editor") == 0.0
    assert isinstance(scene.request(1.0, takes=1.0), Job)


def test_the_running_jobs_remaining_time_follows_the_clock(tmp_path):
    scene = Scene(tmp_path)
    scene.seed()
    scene.request(4.0, takes=3.4)
    scene.queue.dispatch("worker")  # running from now, 3.4 s estimated
    scene.clock.advance(1.0)
    assert scene.queue.expected_start("render", "editor") == pytest.approx(2.4)
    scene.clock.advance(2.0)
    second = scene.request(4.0, takes=3.4)  # 0.4 s left: admitted
    assert isinstance(second, Job)
    refused = scene.request(1.0, takes=1.0)  # 0.4 s + 3.4 s ahead
    assert isinstance(refused, Busy) and refused.wait == pytest.approx(3.8)


def test_a_running_job_past_its_estimate_is_not_counted_as_ending_now(tmp_path):
    scene = Scene(tmp_path)
    scene.seed()
    scene.request(4.0, takes=3.4)
    scene.queue.dispatch("worker")  # running from now, 3.4 s estimated, no progress yet
    scene.clock.advance(10.0)  # far past its estimate, still nothing reported
    # with nothing to go by, it runs as long again as it has run, never "ends now"
    assert scene.queue.expected_start("render", "editor") == pytest.approx(10.0)


def test_requests_are_estimated_by_their_own_length_before_and_after_decoding(tmp_path):
    scene = Scene(tmp_path, max_wait=None)
    scene.seed()
    times = scene.queue.times
    # before the body is read: from Content-Length at 32 kB per second of audio
    one = scene.queue.admit("render", "a", wav_bytes(1.0))
    ten = scene.queue.admit("render", "a", wav_bytes(10.0))
    assert one.seconds == pytest.approx(SEEDED.seconds(1.0), rel=0.02)
    assert ten.seconds == pytest.approx(SEEDED.seconds(10.0), rel=0.02)
    # a request with no Content-Length (chunked) is a render of unknown length; one
    # whose body is hardly more than its form costs the overhead
    assert scene.queue.admit("render", "a", None).seconds == 10.0
    assert scene.queue.admit("render", "a", 900).seconds == pytest.approx(SEEDED.overhead)
    # a client sending 48 kHz stereo WAVs (192 kB a second): its first request looks 6x
    # as long; once one upload is decoded, its next ones are sized right
    stereo = 48000 * 2 * 2
    first = scene.request(2.0, takes=1.8, client="b", per_s=stereo)
    assert isinstance(first, Job)
    assert scene.queue._estimate(first) == pytest.approx(SEEDED.seconds(2.0))  # decoded
    again = scene.queue.admit("render", "b", wav_bytes(2.0, stereo))
    assert again.seconds == pytest.approx(SEEDED.seconds(2.0), rel=0.02)
    # a client with no decoded upload of its own goes by everyone's (here only b's)
    assert times.audio_of_upload("a", wav_bytes(3.0, stereo)) == pytest.approx(3.0, rel=0.01)


def test_finished_renders_move_the_estimate_warm_burst(tmp_path):
    # the warm-up said 1.0 s for 1 s of audio; the renders really take 0.5 s
    scene = Scene(tmp_path)
    scene.seed()
    admitted, _ = burst(scene, 12, 1.0, takes=0.5)
    asyncio.run(scene.serve_all())
    cost = scene.queue.times.cost("warp", SIZE)
    assert cost.seconds(1.0) < 0.9  # moved towards 0.5 (a moving average)
    warm, refused = burst(scene, 12, 1.0, takes=0.5)
    assert len(warm) > len(admitted) == 4
    drained_at = scene.clock()
    end = asyncio.run(scene.serve_all())
    for busy in refused:  # the warm estimate against the real queue
        assert abs(busy.wait - (end - drained_at)) / (end - drained_at) <= 0.5


def test_each_renderer_keeps_its_own_cost(tmp_path):
    times = ServiceTimes()
    times.seed("warp", SIZE, SEEDED)
    times.record("render", "musetalk", 20.0, 2.0, first_frame=2.0, size=SIZE)
    assert times.estimate("render", "warp", 2.0, SIZE) == pytest.approx(SEEDED.seconds(2.0))
    assert times.estimate("render", "musetalk", 2.0, SIZE) == pytest.approx(20.0)
    # a warp render's figures leave musetalk's alone, and the other way round
    times.record("render", "warp", 1.0, 2.0, first_frame=0.1, size=SIZE)
    assert times.estimate("render", "musetalk", 2.0, SIZE) == pytest.approx(20.0)
    assert times.estimate("render", "warp", 2.0, SIZE) < SEEDED.seconds(2.0)
    # a clip under a second is mostly overhead: it leaves the rate alone
    before = times.cost("warp", SIZE)
    times.record("render", "warp", 0.4, 0.2, first_frame=0.1, size=SIZE)
    after = times.cost("warp", SIZE)
    assert after.rate == before.rate and after.overhead > before.overhead
    # a renderer with no figure starts from the prior; a size with none, from the
    # renderer's over every size
    assert times.cost("other") == Cost(0.0, 1.0)
    assert times.cost("musetalk", "270x480") == times.cost("musetalk", SIZE)

    # through the queue: a musetalk job behind a warp one is estimated as musetalk
    scene = Scene(tmp_path, max_wait=None)
    scene.seed("warp")
    scene.seed("musetalk", Cost(2.0, 9.0))
    warp = scene.request(1.0, takes=1.0, backend="warp")
    muse = scene.request(1.0, takes=11.0, backend="musetalk")
    assert scene.queue._estimate(warp) == pytest.approx(1.0)
    assert scene.queue._estimate(muse) == pytest.approx(11.0)
    assert scene.queue.expected_start("render", "x") == pytest.approx(12.0)


def test_a_warm_up_seeds_each_size_and_names(tmp_path):
    scene = Scene(tmp_path)
    small = {"backend": "warp", "size": "270x480", "seconds": 0.5, "audio_seconds": 2.0}
    small |= {"first_frame_seconds": 0.1, "names": ["astro", "small", "default"]}
    big = {**small, "size": SIZE, "seconds": 3.0, "names": ["astro", "studio", "default"]}
    scene.queue.seed([small, {**small, "seconds": 0.7}, big])  # two workers' small ones
    times = scene.queue.times
    assert times.cost("warp", "270x480") == Cost(0.1, pytest.approx(0.25))
    assert times.size_of("astro", "small", None) == "270x480"
    assert times.size_of("astro", "studio", "default") == SIZE
    # a request whose avatar is not known yet: the largest size's cost
    assert times.cost("warp") == times.cost("warp", SIZE)


class Service:
    """What Admission finds on the app's state: the queue and the metrics."""

    def __init__(self, queue: JobQueue) -> None:
        self.queue, self.metrics = queue, queue.metrics


def scope_for(service: Service, body_bytes: int) -> dict:
    state = type("State", (), {"service": service})()
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/renders",
        "headers": [(b"content-length", str(body_bytes).encode())],
        "app": type("App", (), {"state": state})(),
        "state": {},
    }


@pytest.mark.parametrize("how", ["answered 507", "answered 422", "cut off by the guard (413)"])
def test_a_failed_request_leaves_nothing_in_the_estimate_once_it_is_answered(tmp_path, how):
    # A request that ends without a job gives its place back as its answer starts: the
    # app still runs after that (FastAPI closes the uploads), and a client that reads
    # the answer and sends its next request at once must be admitted (test_serve_disk_full
    # was refused "a worker would start this in about 40.0 s" by its own failed upload).
    from hotplate.serve.admission import Admission
    from hotplate.serve.guard import BodyTooLarge

    scene = Scene(tmp_path, max_wait=30.0)
    queue = scene.queue
    seen_after_answer: list = []
    sent: list[dict] = []

    async def receive() -> dict:
        if how.startswith("cut off"):
            sent.append({"type": "http.response.start", "status": 413})  # the guard's own send
            raise BodyTooLarge
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    async def app(scope, receive, send) -> None:
        try:
            await receive()
            status = 507 if how == "answered 507" else 422
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
        finally:  # after the answer: what the next request, sent now, would find
            await asyncio.sleep(0)
            seen_after_answer.append((list(queue.tickets), queue.expected_start("render", "c")))

    async def main() -> None:
        middleware = Admission(app)
        try:
            await middleware(scope_for(Service(queue), wav_bytes(40.0)), receive, send)
        except BodyTooLarge:
            pass

    asyncio.run(main())
    assert sent and sent[0]["type"] == "http.response.start"
    assert seen_after_answer == [([], 0.0)]
    assert queue.tickets == [] and queue.in_flight == 0
    # and a 40 s upload is admitted again at once (40 s over max_wait 30 would not be,
    # behind the first one's ticket)
    assert queue.admit("render", "c", wav_bytes(40.0)) in queue.tickets

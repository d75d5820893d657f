"""Single flight across a Ray cluster: one build per avatar, whichever node asks.

On one node, `cachestore/flight.py`'s flock makes one build per avatar. Across nodes a
named Ray actor (`hotplate-flight` in namespace `hotplate`) grants a lease per avatar
key to one node (holder = host and store path, so the processes of one node share it:
their flock orders them already). The lease lives while that node's flock on the key is
held, then until the build's push has finished, renewed every TTL/3 by a thread; a node
that dies stops renewing and its lease runs out after TTL seconds.

A node whose miss finds the lease taken waits for it to go, then pulls what the holder
pushed; when the tier has nothing (the holder failed), it takes the lease and builds.
The blob tier over plain HTTP has no conditional create (obstore's HTTPStore supports
only overwriting PUTs), which is why the lease is an actor and not an object.

Only processes that know the cluster take part: `HOTPLATE_RAY_ADDRESS` (set by
`hotplate serve --ray` and `hotplate sync --ray` for their replicas, tasks and the
replicas' render workers). Without it `lease()` is None and nothing here runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from cachestore.flight import DEFAULT_WAIT, building

logger = logging.getLogger(__name__)

ADDRESS_ENV = "HOTPLATE_RAY_ADDRESS"
NAME, NAMESPACE = "hotplate-flight", "hotplate"
TTL = 30.0  # seconds a lease outlives its last renewal (a dead node's builds time out)
POLL = 0.25
WAIT = float(os.environ.get("HOTPLATE_FLIGHT_WAIT") or DEFAULT_WAIT)  # for another node's build


class FlightActor:
    """The cluster's leases: avatar key -> (holder, expiry). Methods are quick and run
    one at a time (an actor's default), so grant and check are one step."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, float]] = {}

    def acquire(self, key: str, holder: str, ttl: float) -> str | None:
        """None when `holder` now holds the lease, else who does."""
        now = time.time()
        found = self.held.get(key)
        if found is None or found[1] < now or found[0] == holder:
            self.held[key] = (holder, now + ttl)
            return None
        return found[0]

    def holder(self, key: str) -> str | None:
        found = self.held.get(key)
        return None if found is None or found[1] < time.time() else found[0]

    def release(self, key: str, holder: str) -> None:
        if self.held.get(key, ("",))[0] == holder:
            del self.held[key]


def flight_actor(create: bool = True) -> Any:
    """The cluster's flight actor (made on first use); ray must be initialised."""
    import ray

    actor = ray.remote(num_cpus=0, max_restarts=-1)(FlightActor)
    if create:
        return actor.options(
            name=NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
        ).remote()
    return ray.get_actor(NAME, namespace=NAMESPACE)


def _connect() -> Any | None:
    address = os.environ.get(ADDRESS_ENV)
    if not address:
        return None
    import ray

    if not ray.is_initialized():  # a render worker the replica spawned: join as a driver
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
    return flight_actor()


class Lease:
    """This node's claim on one avatar's build; see the module's docstring."""

    def __init__(self, actor: Any, cache: str, key: str) -> None:
        self.actor, self.cache, self.key = actor, cache, key
        self.holder = f"{socket.gethostname()}:{os.path.realpath(cache)}"
        self.pushes: list[threading.Thread] = []

    def try_take(self) -> str | None:
        """None when taken (then kept alive until the build and its push end), else who has it."""
        import ray

        who = ray.get(self.actor.acquire.remote(self.key, self.holder, TTL))
        if who is None:
            threading.Thread(target=self._keep, name=f"lease-{self.key[:12]}", daemon=True).start()
        return who

    def wait(self, deadline: float) -> bool:
        """Wait until nobody holds the lease; False at the deadline."""
        import ray

        while time.monotonic() < deadline:
            if ray.get(self.actor.holder.remote(self.key)) is None:
                return True
            time.sleep(POLL)
        return False

    def _building(self) -> bool:
        """True while a process of this node holds the avatar's flock (its build runs)."""
        return building(self.cache, self.key)

    def busy(self) -> bool:
        return self._building() or any(t.is_alive() for t in self.pushes)

    def release(self) -> None:
        import ray

        ray.get(self.actor.release.remote(self.key, self.holder))

    def _keep(self) -> None:
        import ray

        try:
            renewed = time.monotonic()
            while self.busy():
                if time.monotonic() - renewed > TTL / 3:
                    ray.get(self.actor.acquire.remote(self.key, self.holder, TTL))
                    renewed = time.monotonic()
                time.sleep(POLL)
            self.release()
        except Exception as exc:  # the cluster went away: the lease runs out by itself
            logger.warning("lease of avatar %s not renewed: %s", self.key[:16], exc)


_LEASES: dict[tuple[str, str], Lease] = {}


def lease(store: Any, key: str) -> Lease | None:
    """This process's lease object for `key`, or None outside a Ray cluster."""
    actor = _connect()
    if actor is None:
        return None
    found = _LEASES.get((str(store.path), key))
    if found is None:
        found = _LEASES[(str(store.path), key)] = Lease(actor, str(store.path), key)
    return found


def release_done() -> None:
    """Release now every lease of this process whose build and push have ended: a Ray
    task calls it before it returns, as its process may end before the renewing thread
    next looks (then the other nodes would wait out the TTL)."""
    for claim in list(_LEASES.values()):
        if not claim.busy():
            try:
                claim.release()
            except Exception as exc:  # the lease runs out by itself
                logger.warning("lease of avatar %s not released: %s", claim.key[:16], exc)


def held_push(store: Any, key: str, thread: threading.Thread) -> None:
    """Keep this node's lease on `key` until `thread` (the build's push) ends."""
    found = _LEASES.get((str(store.path), key))
    if found is not None:
        found.pushes.append(thread)


def before_pull(
    store: Any, key: str, pull: Callable[[], Any], say: Callable[[str], None], wait: float
) -> Any:
    """The cluster step of a miss: pull() under the lease; None means build here (the
    lease is ours then). Waits for another node's build at most `wait` seconds."""
    claim = lease(store, key)
    assert claim is not None
    deadline = time.monotonic() + wait
    told = False
    while True:
        who = claim.try_take()
        if who is None:
            return pull()  # ours: a build that finished before we asked left it on the tier
        if not told:
            say(f"avatar {key[:16]}: waiting for {who} (another node) to precompile it")
            told = True
        if not claim.wait(deadline):
            return None  # waited long enough: build here (the local flock still holds)
        got = pull()
        if got is not None:
            return got

"""The server's configuration: what `hotplate serve`'s flags set (hotplate/cli/serve.py).

Durations are kept as the text the user wrote (`24h`, `30m`, `90s`, `1.5`: seconds) so
`--help` shows them as written; `seconds()` reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hotplate.settings import Settings

UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
OFF = ("off", "none", "inf")


def seconds(text: str | float | None) -> float | None:
    """Seconds in a duration such as 24h, 30m, 90s, 500ms or 2.5 (seconds); None for
    `off`. Raises ValueError naming the text and the forms it takes."""
    if text is None or isinstance(text, int | float):
        return None if text is None else float(text)
    t = str(text).strip().lower()
    if t in OFF:
        return None
    unit = next((u for u in ("ms", "s", "m", "h", "d") if t.endswith(u)), "")
    try:
        value = float(t[: len(t) - len(unit)]) * UNIT_SECONDS[unit or "s"]
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r} is not a duration; use e.g. 24h, 30m, 90s or 500ms")
    return value


# Cores one render keeps busy (docs/notebook/admission.md, "--workers auto"): warp's
# render_video runs decode, render and encode as three threads, about two cores' worth at
# 1080x1920 (1.8x real time on 2 idle cores, bench_stream); musetalk's torch uses every
# core by itself.
CORES_PER_RENDER = {"warp": 2}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a cgroup or taskset sets)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def auto_workers(renderer: str, cores: int | None = None) -> int:
    """`--workers auto`: as many workers as renders the cores hold at full speed."""
    cores = usable_cores() if cores is None else cores
    return max(1, cores // CORES_PER_RENDER.get(renderer, cores))


TURN_ENV = "HOTPLATE_TURN_CREDENTIALS"  # username:password for --ice-server turn:...
ICE_SCHEMES = ("stun:", "turn:", "turns:")


def is_turn(url: str) -> bool:
    return url.startswith(("turn:", "turns:"))


def ice_servers_problem(urls: tuple[str, ...], credentials: tuple[str, str] | None) -> str | None:
    """What is wrong with the ICE servers a server was given, in one line, or None."""
    for url in urls:
        if not url.startswith(ICE_SCHEMES):
            return f"--ice-server {url}: an ICE server is stun:host:port, turn:host:port or turns:host:port"
        if is_turn(url) and credentials is None:
            return (
                f"--ice-server {url}: a TURN server needs a username and password: set "
                f"{TURN_ENV}=username:password or --turn-credentials-file FILE"
            )
    return None


def parse_turn_credentials(text: str, where: str) -> tuple[str, str]:
    """(username, password) from "username:password" (the first line of `text`)."""
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    username, colon, password = line.partition(":")
    if not (username and colon and password):
        raise ValueError(f"{where}: TURN credentials are one line, username:password")
    return username, password


@dataclass
class ServeConfig:
    settings: Settings
    workers: int = 1
    queue_size: int = 16  # a hard cap on waiting renders, whatever the estimates say
    # precompiles are background work nobody waits on: they queue up to this many, past
    # --max-wait, and a worker takes one only when no render waits
    max_queued_precompiles: int = 64
    watch: bool = False  # watch the personas folder; its precompiles join the queue (watching.py)
    token: str | None = None  # a client token (HOTPLATE_TOKEN)
    max_upload_bytes: int = 50_000_000
    max_audio_seconds: float = 600.0
    keep_videos: str = "24h"  # then a video leaves the disk; its record after as long again
    max_data_size: int | None = None  # bytes under the data dir; oldest videos go first
    max_wait: str = "30s"  # longest expected wait before a worker starts a job; "off"
    max_per_client: int | None = None  # workers one client may hold; None: see per_client_cap
    drain_timeout: str = "60s"  # after SIGTERM, how long work in flight may take to finish
    data_dir: Path | None = None  # job records and outputs; default beside the store
    tokens: tuple[str, ...] = ()  # more client tokens, one per client (--token-file)
    admin_token: str | None = None  # may cancel or delete anyone's job (--admin-token-file)
    public_metrics: bool = False  # /metrics without a token (--public-metrics)
    host: str = "127.0.0.1"  # the bound address: a Host header naming it is this server
    allowed_hosts: tuple[str, ...] = ()  # more names for this server (--allowed-host)
    allow_origins: tuple[str, ...] = ()  # web apps that may POST and DELETE (--allow-origin)
    signing_key: str | None = None  # signs ?sig= URLs; None: a random key for this process
    replica: str = ""  # a Ray replica's tag: its job ids start with it (hotplate/cluster/)
    # conversation sessions (sessions.py): each holds a worker for its life
    max_sessions: int | None = None  # in all; None: as many as there are workers
    max_sessions_per_client: int | None = None  # None: per_client_cap
    max_session: str = "1h"  # a session ends after this
    # ICE: local addresses offered as candidates (empty: loopback for a server bound to
    # loopback, else every interface's), and STUN/TURN URLs (none: none is contacted)
    ice_addresses: tuple[str, ...] = ()
    ice_servers: tuple[str, ...] = ()
    # (username, password) for the turn: and turns: URLs among them (TURN_ENV)
    turn_credentials: tuple[str, str] | None = None

    def ice_server_entries(self) -> list[dict]:
        """RTCIceServer's fields per ICE server: a TURN URL with the TURN credentials."""
        out = []
        for url in self.ice_servers:
            entry = {"urls": url}
            if is_turn(url) and self.turn_credentials is not None:
                entry["username"], entry["credential"] = self.turn_credentials
            out.append(entry)
        return out

    @property
    def data(self) -> Path:
        cache = self.settings.cache
        return self.data_dir or cache.with_name(cache.name + "-serve")

    @property
    def client_tokens(self) -> tuple[str, ...]:
        return tuple(t for t in (self.token, *self.tokens) if t)

    @property
    def token_required(self) -> bool:
        return bool(self.client_tokens or self.admin_token)

    @property
    def per_client_cap(self) -> int:
        """Workers one client may hold at once: --max-per-client, else all but one when
        there are several workers and the server tells clients apart (more than one
        token); a server with one client (no token, or one) lets it use them all."""
        if self.max_per_client is not None:
            return max(1, min(self.max_per_client, self.workers))
        clients = len(set(self.client_tokens)) + bool(self.admin_token)
        return self.workers - 1 if self.workers > 1 and clients > 1 else self.workers

"""The server's configuration: what `hotplate serve`'s flags set (hotplate/cli/serve.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotplate.settings import Settings


@dataclass
class ServeConfig:
    settings: Settings
    workers: int = 1
    queue_size: int = 16
    token: str | None = None  # a client token (HOTPLATE_TOKEN)
    max_upload_bytes: int = 50_000_000
    max_audio_seconds: float = 600.0
    retention_hours: float = 24.0
    data_dir: Path | None = None  # job records and outputs; default beside the store
    tokens: tuple[str, ...] = ()  # more client tokens, one per client (--token-file)
    admin_token: str | None = None  # may cancel or delete anyone's job (--admin-token-file)
    public_metrics: bool = False  # /metrics without a token (--public-metrics)
    host: str = "127.0.0.1"  # the bound address: a Host header naming it is this server
    allowed_hosts: tuple[str, ...] = ()  # more names for this server (--allowed-host)
    allow_origins: tuple[str, ...] = ()  # web apps that may POST and DELETE (--allow-origin)
    signing_key: str | None = None  # signs ?sig= URLs; None: a random key for this process
    replica: str = ""  # a Ray replica's tag: its job ids start with it (hotplate/cluster/)

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

"""The server's configuration: what `hotplate serve`'s flags set (cli_serve.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotplate.settings import Settings


@dataclass
class ServeConfig:
    settings: Settings
    workers: int = 1
    queue_size: int = 16
    token: str | None = None
    max_upload_bytes: int = 50_000_000
    max_audio_seconds: float = 300.0
    retention_hours: float = 24.0
    data_dir: Path | None = None  # job records and outputs; default beside the store

    @property
    def data(self) -> Path:
        cache = self.settings.cache
        return self.data_dir or cache.with_name(cache.name + "-serve")

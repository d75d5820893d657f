"""A real nginx (Debian's nginx-light) on loopback, serving a temp folder with
`dav_methods PUT`: the blob tier the remote tests push to and pull from."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from testkit.preconditions import require

CONF = """\
{user}
daemon off;
master_process on;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log;
events {{ worker_connections 64; }}
http {{
    access_log {root}/access.log;
    client_body_temp_path {root}/body;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
        root {root}/data;
        location / {{
            {dav}
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


def nginx_binary() -> str:
    """nginx's path; testkit.preconditions.Missing when absent (a test skips, or fails
    in CI; a bench exits 2)."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    require(
        found, "nginx is not installed (`just setup` installs it as root: apt-get install nginx)"
    )
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Nginx:
    """nginx serving `root/data` at http://127.0.0.1:port/tier; start() waits until it answers."""

    def __init__(self, root: Path, writable: bool = True) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "body").mkdir(exist_ok=True)
        # as root, the workers would drop to nobody and could not write the temp folder
        user = "user root root;" if os.geteuid() == 0 else ""
        # read-only: PUT answers 405, as a tier a node may read but not write would
        dav = "dav_methods PUT DELETE; create_full_put_path on;" if writable else ""
        conf = CONF.format(user=user, root=self.root, port=self.port, dav=dav)
        (self.root / "nginx.conf").write_text(conf)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/tier"

    @property
    def data(self) -> Path:
        """Where the objects under `url` lie on disk."""
        return self.root / "data" / "tier"

    def start(self, deadline: float = 30.0) -> Nginx:
        cmd = [nginx_binary(), "-c", str(self.root / "nginx.conf"), "-p", str(self.root)]
        # a session of its own: pause() stops its whole group (master and worker), not ours
        self.process = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        end = time.monotonic() + deadline
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"nginx exited: {self.process.stderr.read()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                if time.monotonic() > end:
                    raise RuntimeError(
                        f"nginx did not listen on {self.port} in {deadline} s"
                    ) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop at once (SIGTERM: fast shutdown) and wait until the port is closed."""
        if self.process is None or self.process.poll() is not None:
            return
        self.resume()  # a paused nginx would not see its SIGTERM
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP master and worker: connections still open (the kernel's backlog takes
        them), nothing is answered until resume(), as a tier that hangs."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.process.pid, signal.SIGCONT)

    def log_lines(self) -> list[str]:
        path = self.root / "access.log"
        return path.read_text().splitlines() if path.exists() else []

    def objects(self, kind: str) -> list[Path]:
        folder = self.data / kind
        return sorted(folder.iterdir()) if folder.is_dir() else []

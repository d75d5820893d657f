"""A real TURN server for the sessions' tests: Debian's coturn (`turnserver`) on
loopback with one long-term user, logging verbosely to a file the test reads (each
allocation names its user)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from testkit.nginx import free_port
from testkit.preconditions import require


def turnserver_binary() -> str:
    """coturn's path; testkit.preconditions.Missing when absent (a test skips, or fails
    in CI)."""
    found = shutil.which("turnserver") or (
        "/usr/bin/turnserver" if os.access("/usr/bin/turnserver", os.X_OK) else None
    )
    require(
        found, "coturn is not installed (`just setup` installs it as root: apt-get install coturn)"
    )
    return found


def stun_answers(port: int, timeout: float = 0.5, host: str = "127.0.0.1") -> bool:
    """A STUN Binding request to host:port got an answer."""
    request = bytes.fromhex("0001 0000 2112a442") + os.urandom(12)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        try:
            s.sendto(request, (host, port))
            answer = s.recv(2048)
        except OSError:
            return False
    return answer[4:20] == request[4:20]  # the magic cookie and our transaction id


class Coturn:
    """`with Coturn(tmp, "user", "password") as turn:` turn.url, turn.log_text().
    `listen`: its address; `inside`: a prefix its command runs under (testkit.nat's
    namespaces: `Nat.command(ns, [])`), its readiness then asked from there too."""

    def __init__(
        self,
        root: Path,
        username: str,
        password: str,
        listen: str = "127.0.0.1",
        inside: list[str] | None = None,
    ) -> None:
        self.root, self.username, self.password = root, username, password
        self.listen, self.inside = listen, list(inside or [])
        self.port = free_port()
        self.url = f"turn:{listen}:{self.port}"
        self.stun = f"stun:{listen}:{self.port}"
        self.log = root / "turnserver.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Coturn:
        self.root.mkdir(parents=True, exist_ok=True)
        relay = free_port()  # a start for the relay ports, away from the listener
        self.proc = subprocess.Popen(
            [
                *self.inside,
                turnserver_binary(),
                "-n",  # no configuration file
                "-v",  # each allocation logged, with its user
                f"--listening-ip={self.listen}",
                f"--listening-port={self.port}",
                f"--relay-ip={self.listen}",
                f"--min-port={relay}",
                f"--max-port={relay + 50}",
                "--lt-cred-mech",
                f"--user={self.username}:{self.password}",
                "--realm=hotplate",
                "--no-tls",
                "--no-dtls",
                "--no-cli",
                "--allow-loopback-peers",  # the peers are on 127.0.0.1
                f"--pidfile={self.root / 'turnserver.pid'}",
                f"--userdb={self.root / 'turndb'}",
                f"--log-file={self.log}",
                "--simple-log",
                "--no-stdout-log",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30.0
        while not self._answers():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise AssertionError(f"coturn did not answer STUN: {self.log_text()[-2000:]}")
        return self

    def _answers(self) -> bool:
        """STUN answers at its address: asked from here, or from inside its namespace by a
        Python of its own (a socket here cannot reach into another namespace)."""
        if not self.inside:
            return stun_answers(self.port, host=self.listen)
        ask = (
            "import sys; from testkit.turn import stun_answers as a; "
            f"sys.exit(0 if a({self.port}, host={self.listen!r}) else 1)"
        )
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        return subprocess.run([*self.inside, sys.executable, "-c", ask], env=env).returncode == 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

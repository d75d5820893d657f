"""What the security tests attack a real `hotplate serve` with, and what they measure it
by: raw chunked uploads over a socket, the disk a server holds (files and unlinked spool
files through /proc/<pid>/fd), peak RSS (VmHWM), and audio bombs made with PyAV."""

from __future__ import annotations

import os
import selectors
import socket
import ssl
import time
from pathlib import Path

import numpy as np

MB = 1_000_000
BOUNDARY = "hotplate-attack"


def held_bytes(pids: list[int], dirs: list[Path]) -> int:
    """Bytes in files under `dirs` plus those in deleted files the processes hold open
    (Starlette spools uploads to unlinked temporary files, invisible to du)."""
    total = 0
    for d in dirs:
        for root, _, names in os.walk(d):
            for name in names:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    pass
    for pid in pids:
        fd_dir = Path(f"/proc/{pid}/fd")
        try:
            fds = list(fd_dir.iterdir())
        except (FileNotFoundError, PermissionError):
            continue
        for fd in fds:
            try:
                if os.readlink(fd).endswith(" (deleted)"):
                    total += os.stat(fd).st_size
            except (FileNotFoundError, PermissionError, OSError):
                pass
    return total


def peak_rss(pid: int) -> int:
    """VmHWM of a process, in bytes: its own peak resident set since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


class ChunkedUpload:
    """POST a multipart render form as a chunked stream of `total` zero bytes of "audio"
    over a raw socket, reading the answer while it sends (as a real client would), and
    calling `measure()` after every chunk. Stops sending when the server answers or hangs
    up, then reads the answer to its end (its stated length, or the hang-up).

    One thread does both directions through a selector: an SSL socket read in one thread
    while another writes to it is outside OpenSSL's rules (an SSL object is not shared by
    threads), and such a reader lost nginx's 413 to an SSL error on a busy machine."""

    def __init__(
        self,
        port: int,
        path: str,
        headers: dict[str, str],
        total: int,
        host: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.port, self.path, self.headers, self.total = port, path, headers, total
        self.host, self.tls = host or f"127.0.0.1:{port}", tls
        self.sent = 0
        self.answer = b""

    def _chunks(self, chunk: int):
        head = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.host}",
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}",
            "Transfer-Encoding: chunked",
            *(f"{k}: {v}" for k, v in self.headers.items()),
            "",
            "",
        ]
        preamble = (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="persona"\r\n\r\nastro\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="audio"; filename="a.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n"
        ).encode()
        yield "\r\n".join(head).encode() + b"%x\r\n%s\r\n" % (len(preamble), preamble), 0
        zeros = b"%x\r\n%s\r\n" % (chunk, bytes(chunk))
        for _ in range(0, self.total, chunk):
            yield zeros, chunk
        yield b"0\r\n\r\n", 0

    def run(self, measure, chunk: int = 1 << 20, timeout: float = 120.0) -> tuple[int, int]:
        """(HTTP status, the largest measure() seen while sending)."""
        largest = 0
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        with self.tls.wrap_socket(raw, server_hostname="127.0.0.1") if self.tls else raw as sock:
            sock.setblocking(False)
            chunks = self._chunks(chunk)
            pending, counted = next(chunks)
            view = memoryview(pending)
            deadline = time.monotonic() + timeout
            with selectors.DefaultSelector() as sel:
                sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
                sending, reading = True, True
                while reading and time.monotonic() < deadline:
                    # An SSL socket may hold decrypted bytes no select() sees.
                    pending_tls = self.tls is not None and sock.pending() > 0
                    events = [] if pending_tls else sel.select(timeout=1.0)
                    if pending_tls or any(mask & selectors.EVENT_READ for _, mask in events):
                        try:
                            data = sock.recv(65536)
                        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                            data = None
                        except OSError:
                            data = b""  # a reset: whatever it answered before is kept
                        if data == b"":
                            reading = False
                        elif data:
                            self.answer += data
                            if sending and b"\r\n\r\n" in self.answer:
                                sending = False  # answered: a client stops sending
                                sel.modify(sock, selectors.EVENT_READ)
                            # a proxy keeps the connection open (nginx: 75 s): stop at
                            # the answer's end, not at the hang-up
                            reading = not _complete(self.answer)
                    if sending and any(mask & selectors.EVENT_WRITE for _, mask in events):
                        try:
                            view = view[sock.send(view[: 1 << 16]) :]
                        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                            continue
                        except OSError:
                            sending = False  # the server hung up on the upload
                            sel.modify(sock, selectors.EVENT_READ)
                            continue
                        if not view:
                            self.sent += counted
                            if counted:
                                largest = max(largest, measure())
                            nxt = next(chunks, None)
                            if nxt is None:
                                sending = False
                                sel.modify(sock, selectors.EVENT_READ)
                            else:
                                view, counted = memoryview(nxt[0]), nxt[1]
            largest = max(largest, measure())
        status_line = self.answer.split(b"\r\n", 1)[0].decode("latin-1")
        assert status_line.startswith("HTTP/1.1 "), f"no HTTP answer: {self.answer[:200]!r}"
        return int(status_line.split()[1]), largest


def _complete(answer: bytes) -> bool:
    """Whether `answer` holds a whole HTTP response: its head and then the body its
    Content-Length counts, or a chunked body's last chunk."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    fields = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    if b"content-length" in fields:
        return len(body) >= int(fields[b"content-length"])
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        return body.endswith(b"0\r\n\r\n")
    return False


def write_flac(path: Path, seconds: float, rate: int = 8000, noise: bool = False) -> Path:
    """A mono FLAC of silence (or noise), written a minute at a time (memory stays small)."""
    import av

    rng = np.random.default_rng(0)
    step = rate * 60
    with av.open(str(path), "w", format="flac") as c:
        stream = c.add_stream("flac", rate=rate, layout="mono")
        done = 0
        while done < int(seconds * rate):
            n = min(step, int(seconds * rate) - done)
            block = np.zeros((1, n), np.int16)
            if noise:
                block[:] = (rng.standard_normal((1, n)) * 3000).astype(np.int16)
            frame = av.AudioFrame.from_ndarray(block, format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, done
            for packet in stream.encode(frame):
                c.mux(packet)
            done += n
        for packet in stream.encode(None):
            c.mux(packet)
    return path


def hide_flac_length(path: Path) -> Path:
    """Zero STREAMINFO's total-samples field (36 bits; 0 means unknown, as a streamed
    FLAC has): the file's headers then claim no duration at all."""
    data = bytearray(path.read_bytes())
    assert data[:4] == b"fLaC" and data[4] & 0x7F == 0, "STREAMINFO must be the first block"
    fields = int.from_bytes(data[18:26], "big") & ~((1 << 36) - 1)
    data[18:26] = fields.to_bytes(8, "big")
    path.write_bytes(bytes(data))
    return path

"""The guard on a WebSocket route, under real uvicorn on loopback: the Host, Origin and
token checks of HTTP, a signed URL for browsers (which cannot set headers on a
WebSocket), and a byte budget that closes the socket with 1009 past the limit."""

import os
import subprocess
import sys
import time

import pytest

from testkit.serve_helpers import free_port
from tests.hotplate import guard_ws_app

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

KEY = "a-fixed-key-for-this-test"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = free_port()
    log = open(tmp_path_factory.mktemp("ws") / "uvicorn.log", "wb")
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "tests.hotplate.guard_ws_app:make_app"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--ws", "websockets"],
        env={**os.environ, "GUARD_KEY": KEY},
        stdout=log,
        stderr=log,
    )
    url = f"ws://127.0.0.1:{port}/v1/live"
    deadline = time.monotonic() + 60
    from websockets.sync.client import connect

    while True:  # ready when a handshake is answered (with anything)
        try:
            connect(url, open_timeout=5).close()
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "uvicorn did not start"
            time.sleep(0.1)
            continue
        except Exception:
            pass
        break
    yield port
    proc.terminate()
    proc.wait(timeout=30)
    log.close()


def refused(port: int, path: str = "/v1/live", **kw) -> int:
    """The HTTP status a refused handshake got."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as caught:
        connect(f"ws://127.0.0.1:{port}{path}", open_timeout=10, **kw)
    return caught.value.response.status_code


def test_no_token_wrong_origin_or_foreign_host_is_refused(server):
    auth = {"Authorization": f"Bearer {guard_ws_app.TOKEN}"}
    assert refused(server) == 403
    assert refused(server, additional_headers={"Authorization": "Bearer wrong"}) == 403
    assert refused(server, additional_headers=auth, origin="http://evil.example") == 403
    assert refused(server, additional_headers={**auth, "Host": "evil.example"}) == 403


def test_a_token_or_a_signed_url_opens_it_and_the_budget_closes_it(server):
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    auth = {"Authorization": f"Bearer {guard_ws_app.TOKEN}"}
    url = f"ws://127.0.0.1:{server}/v1/live"
    with connect(url, additional_headers=auth, origin=f"http://127.0.0.1:{server}") as ws:
        assert ws.recv(timeout=10).startswith("hello c-")
        ws.send(b"x" * 1000)
        assert ws.recv(timeout=10) == b"x" * 1000
        with pytest.raises(ConnectionClosed) as closed:
            for _ in range(guard_ws_app.LIMIT // 8192 + 2):
                ws.send(bytes(8192))
                ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1009

    policy = guard_ws_app.policy()
    policy.key = KEY.encode()
    from hotplate.serve.guard import Client

    signed = policy.sign("/v1/live", Client("c-browser"), method="WEBSOCKET")
    with connect(f"ws://127.0.0.1:{server}{signed}") as ws:
        assert ws.recv(timeout=10) == "hello c-browser"
    assert refused(server, path=signed.replace("/v1/live", "/v1/other")) == 403
    assert refused(server, path=signed.replace("?", "?persona=astro&")) == 403  # the query
    # a URL signed for a GET of the same path does not open the socket
    assert refused(server, path=policy.sign("/v1/live", Client("c-browser"))) == 403


def test_the_budget_counts_the_bytes_of_text_frames(server):
    """A text frame of multi-byte characters: fewer characters than the limit, more
    bytes (the budget used to count characters)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    auth = {"Authorization": f"Bearer {guard_ws_app.TOKEN}"}
    text = "\u20ac" * (guard_ws_app.LIMIT // 3 + 1)  # the euro sign: 3 bytes in UTF-8
    assert len(text) < guard_ws_app.LIMIT < len(text.encode())
    with connect(f"ws://127.0.0.1:{server}/v1/live", additional_headers=auth) as ws:
        assert ws.recv(timeout=10).startswith("hello c-")
        with pytest.raises(ConnectionClosed) as closed:
            ws.send(text)
            ws.recv(timeout=10)
        assert closed.value.rcvd.code == 1009

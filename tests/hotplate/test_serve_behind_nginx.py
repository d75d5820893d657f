"""The README's nginx block, run as it is written (ports and file paths aside) with TLS in
front of a real `hotplate serve`: the token, the Origin and Host checks and the body limit
all hold through the proxy, and the page's own origin (https) may POST."""

import os
import re
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from testkit.serve_attacks import MB, ChunkedUpload, held_bytes
from testkit.serve_helpers import Server, assert_problem, free_port, make_world

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
NAME = "studio.example.com"
TOKEN = "token-behind-nginx"


def readme_nginx_block() -> str:
    text = README.read_text()
    section = text[text.index("## Behind a reverse proxy with TLS") :]
    return re.search(r"```nginx\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def nginx_bin():
    found = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if found is None or shutil.which("openssl") is None:
        reason = "needs nginx and openssl (just setup installs them)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must have them")
        pytest.skip(reason)
    return found


@pytest.fixture(scope="module")
def proxied(tmp_path_factory, nginx_bin):
    root = make_world(tmp_path_factory.mktemp("nginx"), attires=("studio",))
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", f"/CN={NAME}"]
        + ["-addext", f"subjectAltName=DNS:{NAME},IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    args = ("--workers", "1", "--allowed-host", NAME, "--max-upload-mb", "2", "--public-metrics")
    with Server(root, *args, env={"HOTPLATE_TOKEN": TOKEN}) as srv:
        port = free_port()
        block = readme_nginx_block()
        block = block.replace("listen 443 ssl;", f"listen 127.0.0.1:{port} ssl;")
        block = block.replace(f"/etc/ssl/certs/{NAME}.pem", str(cert))
        block = block.replace(f"/etc/ssl/private/{NAME}.key", str(key))
        block = block.replace("http://127.0.0.1:8700", f"http://127.0.0.1:{srv.port}")
        temp = root / "nginx"
        temp.mkdir()
        conf = root / "nginx.conf"
        conf.write_text(
            f"daemon off;\nmaster_process off;\npid {temp}/nginx.pid;\n"
            f"error_log {temp}/error.log info;\nevents {{}}\nhttp {{\n  access_log off;\n"
            + "".join(
                f"  {kind}_temp_path {temp}/{kind};\n"
                for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
            )
            + block
            + "}\n"
        )
        proc = subprocess.Popen(
            [nginx_bin, "-c", str(conf), "-p", str(temp)],
            stdout=subprocess.DEVNULL,
            stderr=open(temp / "stderr.log", "wb"),
        )
        tls = ssl.create_default_context(cafile=str(cert))
        url = f"https://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/healthz", verify=tls, headers={"Host": NAME}, timeout=5)
                break
            except httpx.TransportError:
                assert proc.poll() is None, (temp / "stderr.log").read_text()
                assert time.monotonic() < deadline, "nginx did not start"
                time.sleep(0.1)
        try:
            yield url, port, tls, temp, proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_token_origin_and_host_hold_through_the_proxy(proxied):
    url, _, tls, _, _ = proxied
    with httpx.Client(base_url=url, verify=tls, headers={"Host": NAME}, timeout=60) as c:
        assert_problem(c.get("/v1/renders"), 401, "Bearer")
        assert c.get("/metrics").status_code == 200  # --public-metrics: a Prometheus scrapes it
        c.headers["Authorization"] = f"Bearer {TOKEN}"
        assert c.get("/v1/renders").status_code == 200
        form = {"persona": "nobody"}
        own = {"Origin": f"https://{NAME}"}  # the page, served by the proxy over https
        assert_problem(c.post("/v1/precompile", data=form, headers=own), 404, "nobody")
        evil = {"Origin": "https://evil.example"}
        assert_problem(c.post("/v1/precompile", data=form, headers=evil), 403)
        assert_problem(c.get("/v1/renders", headers={"Host": "evil.example"}), 421)


def test_an_upload_over_the_limit_is_refused_through_the_proxy(proxied):
    _, port, tls, temp, nginx_pid = proxied
    upload = ChunkedUpload(
        port, "/v1/renders", {"Authorization": f"Bearer {TOKEN}"}, 40 * MB, host=NAME, tls=tls
    )
    try:
        status, largest = upload.run(lambda: held_bytes([nginx_pid], [temp]))
    except AssertionError as no_answer:  # what nginx saw says which side lost the answer
        log = (temp / "error.log").read_text()
        raise AssertionError(f"{no_answer}; nginx's error log ends: {log[-2000:]}") from None
    log = (temp / "error.log").read_text()
    assert status == 413, (upload.answer[:300], log[-2000:])
    assert b"2 MB upload limit" in upload.answer  # hotplate's answer, relayed by nginx
    assert largest < 1 * MB  # nginx streams the body through: nothing buffered to disk

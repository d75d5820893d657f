"""The guard: a raw ASGI middleware in front of the whole app that refuses a request
before any of its body is read, or as soon as the body passes the limit.

For each HTTP request, in this order:
1. a request id (in every response's `X-Request-Id` and problem body, and in the log);
2. the Host header must name this server: a loopback name, the bound address or an
   `--allowed-host` (421 otherwise: DNS rebinding sends a foreign name); a request that
   repeats Host, Origin or Authorization gets 400;
3. a state-changing request (not GET/HEAD/OPTIONS) whose Origin is neither the server's
   own nor an `--allow-origin` gets 403 (CSRF); no Origin (curl, a server) passes;
4. with tokens set, every path not in OPEN_PATHS needs one: `Authorization: Bearer` or,
   for a GET or WebSocket that cannot send headers (`<video src>`, EventSource), a
   `sig=` made by GET /v1/sign for that method, path and query (401 none, 403 wrong);
5. the body is counted as it arrives, chunked or not: a declared Content-Length over the
   limit gets 413 before a byte is read, a stream gets 413 the moment it passes it, so
   the app (and Starlette's spool under TMPDIR) never holds more than the limit.

A refusal closes the connection (`Connection: close`): the rest of an unwanted upload is
never kept (a bounded linger drains it, so the client can read the answer first).
WebSocket connections get the same Host, Origin and token checks (`check_connection`)
and a byte budget on what they receive (see docs/notebook/serving.md), but for a conversation
session's speech socket, which the session paces instead (sessions.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from hotplate.serve.problems import problem_body

log = logging.getLogger("hotplate.serve")

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
# Reachable without a token: what the page and the docs need to load and ask for one,
# and the probes. Everything else (every /v1 route, new ones included) needs a token.
OPEN_PATHS = frozenset({"/", "/healthz", "/readyz", "/docs", "/openapi.json", "/favicon.ico"})
OPEN_PREFIXES = ("/static/", "/docs/")
SIGNED_TTL_S = 3600.0  # a <video> seeks (new Range requests) long after it was given its URL
# What a signed URL may be for: GET (HEAD too) and a WebSocket handshake; never a route
# that mints signatures (a URL signed for /v1/sign would sign any path, and itself again).
SIGNED_METHODS = ("GET", "WEBSOCKET")
UNSIGNABLE = frozenset({"/v1/sign"})
# client id . role . expiry . HMAC-SHA256: anything else is no signature (403, never a 500)
SIGNATURE = re.compile(
    r"(?P<cid>[A-Za-z0-9_-]{1,64})\.(?P<role>[au])\.(?P<expires>[0-9]{1,12})\.(?P<mac>[0-9a-f]{64})",
    re.ASCII,
)
SINGLE_HEADERS = ("host", "origin", "authorization", "sec-fetch-site")  # what the guard decides on
WS_CLOSE_POLICY, WS_CLOSE_TOO_BIG = 1008, 1009
PACED_SOCKETS = re.compile(r"/v1/sessions/[A-Za-z0-9_-]{1,64}/speech")
LINGER_BYTES, LINGER_S = 64 << 20, 5.0  # what a refused upload may still send, then closed


@dataclass(frozen=True)
class Client:
    """Who sent a request: `id` is recorded as a job's owner; an admin may cancel or
    delete any job."""

    id: str
    admin: bool = False


LOCAL = Client("local")  # a tokenless server (loopback only): every caller is this client
ANONYMOUS = Client("anonymous")  # no token, on an open path of a server that has tokens


def client_id(token: str) -> str:
    """A token's stable, non-secret name: what a job records as its owner."""
    return "c-" + hashlib.sha256(token.encode()).hexdigest()[:16]


class Refusal(Exception):
    """A request the guard answers itself: status, one-line detail, extra headers."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


@dataclass
class Policy:
    """What the guard enforces; built from ServeConfig by `Policy.of`."""

    tokens: dict[str, Client] = field(default_factory=dict)  # sha256(token) -> client
    body_limit: int = 50_000_000  # the upload limit plus room for the form's other parts
    upload_limit: int = 50_000_000  # the one the caller knows (--max-upload-mb)
    bound_host: str = "127.0.0.1"
    allowed_hosts: frozenset[str] = frozenset()
    allowed_origins: frozenset[str] = frozenset()
    public_metrics: bool = False
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))  # signs ?sig= URLs

    @classmethod
    def of(
        cls,
        client_tokens: Iterable[str],
        admin_tokens: Iterable[str],
        body_limit: int,
        upload_limit: int | None = None,
        bound_host: str = "127.0.0.1",
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        public_metrics: bool = False,
        key: bytes | None = None,
    ) -> Policy:
        tokens = {_digest(t): Client(client_id(t)) for t in client_tokens}
        tokens.update({_digest(t): Client(client_id(t), admin=True) for t in admin_tokens})
        return cls(
            tokens=tokens,
            body_limit=body_limit,
            upload_limit=body_limit if upload_limit is None else upload_limit,
            bound_host=_host_name(bound_host),
            allowed_hosts=frozenset(_host_name(h) for h in allowed_hosts),
            allowed_origins=frozenset(_origin(o) for o in allowed_origins),
            public_metrics=public_metrics,
            key=key or secrets.token_bytes(32),
        )

    @property
    def token_required(self) -> bool:
        return bool(self.tokens)

    # -- the checks ---------------------------------------------------------------------

    def check_host(self, headers: dict[str, str]) -> None:
        host = headers.get("host")
        if not host:
            raise Refusal(400, "the request has no Host header; send one (HTTP/1.1)")
        name = _host_name(host)
        if self._host_ok(name):
            return
        raise Refusal(
            421,
            f"this server does not answer for host {name!r}; use its own address, or start "
            "it with --allowed-host NAME (a reverse proxy's public name)",
        )

    def _host_ok(self, name: str) -> bool:
        if name in LOOPBACK_NAMES or name == self.bound_host or name in self.allowed_hosts:
            return True
        if "*" in self.allowed_hosts or name.endswith(".localhost"):
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        # An address is no rebinding risk (that needs a name the attacker controls), and
        # on a wildcard bind every address of the machine is the bound address.
        return address.is_loopback or self.bound_host in WILDCARD_BINDS

    def check_origin(self, method: str, headers: dict[str, str], always: bool = False) -> None:
        """403 for a state-changing request from a foreign page; `always` for WebSocket
        handshakes (a GET that opens a channel both ways)."""
        if method in SAFE_METHODS and not always:
            return
        origin = headers.get("origin")
        if origin is None:
            if headers.get("sec-fetch-site") == "cross-site":
                raise Refusal(403, "cross-site requests are refused; call the API from a server")
            return  # curl, scripts and servers send no Origin
        normal = _origin(origin)
        if normal in self.allowed_origins:
            return
        if normal != "null" and urlsplit(normal).netloc == headers.get("host", "").lower():
            return  # the server's own page (scheme aside: a TLS proxy in front is fine)
        raise Refusal(
            403,
            f"requests from origin {origin!r} are refused (cross-site request forgery "
            "guard); start the server with --allow-origin for a trusted web app",
        )

    def is_open(self, path: str) -> bool:
        if not self.tokens or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return True
        return path == "/metrics" and self.public_metrics

    def authenticate(self, scope: dict[str, Any], headers: dict[str, str]) -> Client:
        """The request's client; Refusal 401 (no credentials) or 403 (wrong ones) on a
        path that needs a token. An open path takes anyone (as ANONYMOUS)."""
        if not self.tokens:
            return LOCAL
        open_path = self.is_open(scope["path"])
        header = headers.get("authorization")
        if header is not None:
            scheme, _, given = header.partition(" ")
            client = self.tokens.get(_digest(given.strip())) if scheme.lower() == "bearer" else None
            if client is not None:
                return client
            if not open_path:
                raise Refusal(403, "the bearer token is wrong; check HOTPLATE_TOKEN")
        query, signatures = _split_signature(scope.get("query_string", b""))
        method = "WEBSOCKET" if _is_ws(scope) else scope.get("method", "GET")
        if signatures and method in (*SIGNED_METHODS, "HEAD"):
            client = None
            if len(signatures) == 1 and scope["path"] not in UNSIGNABLE:
                method = "GET" if method == "HEAD" else method
                client = self.verify(method, scope["path"], query, signatures[0])
            if client is not None:
                return client
            if not open_path:
                raise Refusal(403, "the signed URL is wrong or expired; sign it again")
        if open_path:
            return ANONYMOUS
        raise Refusal(
            401,
            "this server needs a token; send 'Authorization: Bearer <token>'",
            {"WWW-Authenticate": "Bearer"},
        )

    # -- signed URLs ----------------------------------------------------------------------

    def sign(
        self, target: str, client: Client, method: str = "GET", ttl_s: float = SIGNED_TTL_S
    ) -> str:
        """`target` with `sig=` appended: lets `method` (GET, which takes HEAD too, or
        WEBSOCKET) of exactly this path and query through as `client` until it expires.
        For what cannot send headers: <video src>, <a download>, EventSource, a browser's
        WebSocket. Raises ValueError for what must never be signed (see UNSIGNABLE)."""
        path, _, query = target.partition("?")
        query, signatures = _split_signature(query.encode("utf-8", "surrogatepass"))
        if method not in SIGNED_METHODS or path in UNSIGNABLE or signatures:
            raise ValueError(f"{method} {target} cannot be signed")
        expires = int(time.time() + ttl_s)
        role = "a" if client.admin else "u"
        payload = f"{client.id}.{role}.{expires}"
        mac = self._mac(method, path, query, payload)
        return f"{path}?{query + '&' if query else ''}sig={payload}.{mac}"

    def verify(self, method: str, path: str, query: str, sig: str) -> Client | None:
        """The client a signature was made for, or None: malformed, expired, or made for
        another method, path or query."""
        found = SIGNATURE.fullmatch(sig)
        if found is None or int(found["expires"]) < time.time():
            return None
        payload = f"{found['cid']}.{found['role']}.{found['expires']}"
        if not hmac.compare_digest(found["mac"], self._mac(method, path, query, payload)):
            return None
        return Client(found["cid"], admin=found["role"] == "a")

    def _mac(self, method: str, path: str, query: str, payload: str) -> str:
        signed = f"{method}\n{path}\n{query}\n{payload}".encode("utf-8", "surrogatepass")
        return hmac.new(self.key, signed, hashlib.sha256).hexdigest()

    def check_connection(self, scope: dict[str, Any]) -> Client:
        """Host, Origin and token checks on an HTTP or WebSocket scope; the client, or
        Refusal. The WebSocket route of the streaming API can call this itself."""
        headers = _headers(scope)
        _check_single(scope)
        self.check_host(headers)
        self.check_origin(scope.get("method", "GET"), headers, always=_is_ws(scope))
        return self.authenticate(scope, headers)


class ByteBudget:
    """Counts bytes received on one connection; `add` returns False once past `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit, self.seen = limit, 0

    def add(self, n: int) -> bool:
        self.seen += n
        return self.seen <= self.limit


class Guard:
    """The ASGI middleware (see the module docstring). Outermost: it runs before
    FastAPI parses anything."""

    def __init__(self, app: Any, policy: Policy) -> None:
        self.app, self.policy = app, policy

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: dict, receive: Any, send: Any) -> None:
        request_id = secrets.token_hex(8)
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        headers = _headers(scope)
        has_body = "chunked" in headers.get("transfer-encoding", "") or (
            headers.get("content-length", "0") not in ("", "0")
        )
        started = refused = False

        async def respond(status: int, detail: str, extra: dict[str, str]) -> None:
            nonlocal started, refused
            refused = True
            if started:
                return
            started = True
            log.info(
                "request %s %s %s -> %d: %s",
                request_id,
                scope.get("method"),
                scope.get("path"),
                status,
                detail,
            )
            body = json.dumps(problem_body(status, detail, scope.get("path", ""), request_id))
            out = [
                (b"content-type", b"application/problem+json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", request_id.encode()),
            ]
            if has_body:
                out.append((b"connection", b"close"))  # the rest of the body is never kept
            out += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
            await send({"type": "http.response.start", "status": status, "headers": out})
            # The whole answer (its Content-Length) goes now; the end of the message, which
            # makes uvicorn close the connection, only after `linger` (see there).
            await send({"type": "http.response.body", "body": body.encode(), "more_body": has_body})

        async def finish() -> None:
            if has_body and started:
                await linger(receive)
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        try:
            state["client"] = self.policy.check_connection(scope)
            length = headers.get("content-length", "")
            if length.isdigit() and int(length) > self.policy.body_limit:
                raise Refusal(413, self._too_large(f"request body of {int(length) / 1e6:.1f} MB"))
        except Refusal as refusal:
            await respond(refusal.status, refusal.detail, refusal.headers)
            await finish()
            return

        received = 0

        async def counted_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.policy.body_limit:
                    await respond(413, self._too_large("the request body"), {})
                    raise BodyTooLarge
            return message

        async def tagged_send(message: dict) -> None:
            nonlocal started
            if refused:
                return  # the guard answered already; what the app says after is dropped
            if message["type"] == "http.response.start":
                started = True
                message = {
                    **message,
                    "headers": [
                        *message.get("headers", ()),
                        (b"x-request-id", request_id.encode()),
                    ],
                }
            await send(message)

        scope["hotplate.refused"] = lambda: refused
        try:
            await self.app(scope, counted_receive, tagged_send)
        except Exception:
            if not refused:
                raise
            # The app failed reading a body the guard cut off: nothing more to say.
        if refused:
            await finish()

    def _too_large(self, what: str) -> str:
        return (
            f"{what} is over the {self.policy.upload_limit / 1e6:g} MB upload limit; "
            "send a shorter or compressed clip"
        )

    async def _websocket(self, scope: dict, receive: Any, send: Any) -> None:
        state = scope.setdefault("state", {})
        state["request_id"] = secrets.token_hex(8)
        try:
            state["client"] = self.policy.check_connection(scope)
        except Refusal as refusal:
            log.info("websocket %s %s refused: %s", state["request_id"], scope["path"], refusal)
            message = await receive()  # websocket.connect
            if message["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": WS_CLOSE_POLICY})
            return
        # a session's speech socket lasts as long as the conversation: its input is bounded
        # by the session's pace (sessions.MAX_AHEAD) instead of a byte budget
        paced = PACED_SOCKETS.fullmatch(scope.get("path", "")) is not None
        budget = ByteBudget(1 << 62 if paced else self.policy.body_limit)
        closed = False

        async def counted_receive() -> dict:
            nonlocal closed
            message = await receive()
            if message["type"] == "websocket.receive":
                text = message.get("text") or ""
                size = len(message.get("bytes") or b"") + len(text.encode("utf-8", "surrogatepass"))
                if not budget.add(size):
                    closed = True
                    await send({"type": "websocket.close", "code": WS_CLOSE_TOO_BIG})
                    return {"type": "websocket.disconnect", "code": WS_CLOSE_TOO_BIG}
            return message

        async def guarded_send(message: dict) -> None:
            if not closed:
                await send(message)

        await self.app(scope, counted_receive, guarded_send)


async def linger(receive: Any) -> None:
    """Read and drop what the client still sends, up to LINGER_BYTES or LINGER_S, before
    the connection closes. Closing a socket with unread data sends a reset, which can
    destroy the refusal before the client (or a proxy such as nginx) has read it; nginx's
    lingering_close does the same. Nothing drained is kept."""
    loop = asyncio.get_running_loop()
    deadline, drained = loop.time() + LINGER_S, 0
    while drained < LINGER_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
        except TimeoutError:
            return
        if message["type"] != "http.request":
            return
        drained += len(message.get("body", b""))
        if not message.get("more_body"):
            return


class BodyTooLarge(Exception):
    """Raised into the app by the guard's receive once it has answered 413."""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _headers(scope: dict) -> dict[str, str]:
    # Repeated headers: the last wins, except SINGLE_HEADERS (_check_single refuses those).
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


def _check_single(scope: dict) -> None:
    """Refuse a request that repeats a header the guard decides on: the guard would read
    the last, Starlette (and a proxy in front) the first."""
    seen: dict[str, int] = {}
    for key, _ in scope.get("headers", ()):
        name = key.decode("latin-1").lower()
        if name in SINGLE_HEADERS:
            seen[name] = seen.get(name, 0) + 1
    for name, count in seen.items():
        if count > 1:
            raise Refusal(400, f"the request has {count} {name.title()} headers; send one")


def _split_signature(raw: bytes) -> tuple[str, list[str]]:
    """The query string without its `sig=` parameters (what a signature covers, exactly
    as sent), and the values of those parameters."""
    kept, signatures = [], []
    for part in raw.decode("utf-8", "surrogateescape").split("&"):
        if part.startswith("sig="):
            signatures.append(part[4:])
        elif part:
            kept.append(part)
    return "&".join(kept), signatures


def _is_ws(scope: dict) -> bool:
    return scope.get("type") == "websocket"


def _host_name(host: str) -> str:
    """'Example.COM:8700' -> 'example.com', '[::1]:8700' -> '::1'."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    if host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    return host.rstrip(".")


def _origin(origin: str) -> str:
    """'HTTPS://Studio.Example/' -> 'https://studio.example'; 'null' stays 'null'."""
    origin = origin.strip().lower().rstrip("/")
    if origin == "null":
        return origin
    parts = urlsplit(origin)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else origin

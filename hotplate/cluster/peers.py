"""A job's or a session's requests reach the replica that owns it, whichever replica
Serve picked.

A job lives on one replica of `hotplate serve --ray`: its record and progress in that
replica's memory and data dir, its render on that replica's workers, its video on that
node's disk. A conversation session too: its worker holds the peer connection, and its
control socket is that replica's. Serve's proxy spreads requests over the replicas and a
browser's `<video src>`, EventSource or WebSocket cannot name one, so each replica
routes what it does not own:

- job ids start with the owning replica's tag (`<tag>-<16 hex>`, ServeConfig.replica),
  and a session's id is its talk job's;
- every replica also listens on its node's address on a port of its own (`listen`),
  serving the same app behind a gate that takes only requests carrying the deployment's
  peer secret (derived from the shared signing key);
- `PeerRouter` (outermost in each replica's app) forwards `/v1/renders/<id>[/events|
  /video]` of another replica's job, and `/v1/sessions/<id>[/whep[/peer]|/speech|
  /interrupt|/switch]` of its session, to that replica's listener, streaming both ways
  (Range, Server-Sent Events, DELETE, the speech WebSocket's messages and its close),
  with the client's own headers, so the owner's guard checks token, Host and Origin as
  for a direct request; `GET /v1/renders` merges every replica's list. A session's
  media does not pass through here: the owner's answer to the WHEP offer holds its own
  node's ICE candidates, and the player sends to them;
- a named actor (`hotplate-peers`) maps tags to listeners; each replica registers before
  its start finishes (`register`: Serve routes nothing to it until then, so no job id of
  it is ever out before the others can find it) and again every REGISTER_EVERY seconds
  (an actor restart forgets them);
- the listener also answers the peer probe (`PROBE_PATH`), by which `/readyz` checks that
  the deployment is whole (readiness.py).

A replica that died took its jobs with it: its tag no longer answers, its jobs read as
unknown (404). See docs/notebook/fleet.md, "A cluster that shares its state".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

NAME, NAMESPACE = "hotplate-peers", "hotplate"
PEER_HEADER = b"x-hotplate-peer"
FORWARDED_BY = b"x-hotplate-forwarded-by"
REGISTER_EVERY = 10.0  # seconds
REGISTER_WAIT = 120.0  # seconds a starting replica waits for the book (a cold actor) to answer
PROBE_PATH = "/peer/ready"  # answered by the peer gate itself, never by the app
# below uvicorn's keep-alive (5 s): a pooled connection is never reused just as the peer
# listener closes it, which would read as the owner being gone
KEEPALIVE_S = 2.0
# a job's own routes and a session's; the tag is the owner's (hotplate/serve/records.py:
# new_id; a session's id is its talk job's)
_OWNED_ID = r"(?P<tag>[a-z0-9]{1,32})-[0-9a-f]{16}"
OWNED_PATHS = (
    re.compile(rf"/v1/renders/{_OWNED_ID}(/events|/video)?"),
    re.compile(rf"/v1/sessions/{_OWNED_ID}(/whep|/whep/peer|/speech|/interrupt|/switch)?"),
)
# a WebSocket's handshake headers are its own, made again for the hop to the owner
SOCKET_OWN = (b"host", b"origin", b"user-agent")
WS_UNREACHABLE = 1011  # the owner went away mid-socket: an internal error, as RFC 6455 has it
# the close reason when the owner went away (125 bytes at most, RFC 6455)
GONE = "the replica that held this session is gone; start a new session"
WS_REFUSED = 1008  # a close before the accept: the client reads it as HTTP 403
HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-authenticate",
    b"proxy-authorization",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
}
log = logging.getLogger("hotplate.serve")


class PeerBook:
    """The deployment's replicas: tag -> the URL of their listener."""

    def __init__(self) -> None:
        self.peers: dict[str, str] = {}

    def register(self, tag: str, url: str) -> None:
        self.peers[tag] = url

    def drop(self, tag: str, url: str) -> None:
        if self.peers.get(tag) == url:
            del self.peers[tag]

    def all(self) -> dict[str, str]:
        return dict(self.peers)


def peer_book() -> Any:
    """The cluster's peer book (made on first use); ray must be initialised."""
    import ray

    actor = ray.remote(num_cpus=0, max_restarts=-1)(PeerBook)
    return actor.options(
        name=NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote()


def peer_secret(signing_key: str) -> bytes:
    """What a forwarded request carries: one secret per deployment, from its key."""
    return hmac.new(signing_key.encode(), b"hotplate peer", hashlib.sha256).hexdigest().encode()


def replica_tag(unique_id: str) -> str:
    """A replica's tag in job ids: its Serve id, lower-case letters and digits."""
    return re.sub(r"[^a-z0-9]", "", unique_id.lower())[:32] or "replica"


def owner_tag(path: str) -> str | None:
    """The tag of the replica that owns `path` (a job's or a session's route), or None."""
    for pattern in OWNED_PATHS:
        if found := pattern.fullmatch(path):
            return found["tag"]
    return None


class PeerGate:
    """The listener's app: requests and WebSockets without the peer secret get 403; the
    peer probe is answered here (`probe()`, JSON); the others are marked as forwarded
    (`PeerRouter` then answers them here) and passed on."""

    def __init__(self, app: Any, secret: bytes, probe: Callable[[], dict] | None = None) -> None:
        self.app, self.secret, self.probe = app, secret, probe

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope["headers"] if k == PEER_HEADER), b"")
        if not hmac.compare_digest(given, self.secret):
            if scope["type"] == "websocket":  # closed before its accept: a 403
                await receive()  # websocket.connect
                await send({"type": "websocket.close", "code": WS_REFUSED})
                return
            await send({"type": "http.response.start", "status": 403, "headers": []})
            await send({"type": "http.response.body", "body": b"not a peer"})
            return
        if scope["path"] == PROBE_PATH and self.probe is not None:
            body = json.dumps(self.probe()).encode()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        headers = [(k, v) for k, v in scope["headers"] if k != PEER_HEADER]
        await self.app({**scope, "headers": headers, "hotplate.peer": True}, receive, send)


class PeerRouter:
    """ASGI middleware: another replica's job requests go there (see the module doc)."""

    def __init__(self, app: Any, tag: str, secret: bytes, book: Any) -> None:
        self.app, self.tag, self.secret, self.book = app, tag, secret, book
        self.peers: dict[str, str] = {}
        self.client: Any = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope.get("hotplate.peer"):
            return await self.app(scope, receive, send)
        tag = owner_tag(scope["path"])
        if scope["type"] == "websocket":
            if tag is not None and tag != self.tag:
                receive = await self._forward_socket(tag, scope, receive, send)
                if receive is None:
                    return
            return await self.app(scope, receive, send)
        if tag is not None and tag != self.tag:
            url = await self._url(tag)
            if url is not None and await self._forward(url, scope, receive, send):
                return
            # no such replica (or it died): the local app answers (the guard, then 404)
        elif scope["path"] == "/v1/renders" and scope["method"] == "GET":
            return await self._merged_list(scope, receive, send)
        await self.app(scope, receive, send)

    # -- the book -----------------------------------------------------------------------

    async def _url(self, tag: str) -> str | None:
        if tag not in self.peers:
            self.peers = await self.book.all.remote()
        return self.peers.get(tag)

    async def _forget(self, tag: str, url: str) -> None:
        self.peers.pop(tag, None)
        with contextlib.suppress(Exception):
            await self.book.drop.remote(tag, url)

    # -- forwarding ---------------------------------------------------------------------

    def _http(self) -> Any:
        import httpx

        if self.client is None:  # made on the replica's loop, used only there
            timeout = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=60.0)
            limits = httpx.Limits(keepalive_expiry=KEEPALIVE_S)
            self.client = httpx.AsyncClient(timeout=timeout, limits=limits)
        return self.client

    def _request(self, url: str, scope: dict, content: Any = None) -> Any:
        query = scope.get("query_string", b"").decode("latin-1")
        headers = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP]
        headers.append((PEER_HEADER, self.secret))
        target = url + scope["path"] + (f"?{query}" if query else "")
        return self._http().build_request(scope["method"], target, headers=headers, content=content)

    async def _forward(self, url: str, scope: dict, receive: Any, send: Any) -> bool:
        """Stream the request to the owner and its answer back; False when the owner is
        unreachable (before anything was sent to the client)."""
        import httpx

        async def body():
            more = True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return
                yield message.get("body", b"")
                more = message.get("more_body", False)

        has_body = any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])
        tag = owner_tag(scope["path"])
        # a request without a body is sent once more, on a new connection, before the
        # owner counts as gone: forgetting a live owner would make its jobs read 404
        # everywhere until it registers again (up to REGISTER_EVERY)
        for last in (has_body, True):
            request = self._request(url, scope, body() if has_body else None)
            try:
                response = await self._http().send(request, stream=True)
                break
            except httpx.TransportError as exc:
                if last:
                    log.info("replica %s at %s is gone (%s); forgetting it", tag, url, exc)
                    await self._forget(tag, url)
                    return False
                log.info("replica %s at %s: %s; trying once more", tag, url, exc)
        try:
            headers = [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]
            headers.append((FORWARDED_BY, self.tag.encode()))
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": headers}
            )
            relay = asyncio.ensure_future(self._relay(response, send))
            gone = asyncio.ensure_future(_disconnected(receive)) if not has_body else None
            waiting = {relay} | ({gone} if gone else set())
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for task in waiting - done:
                task.cancel()
            if relay in done:
                relay.result()
        finally:
            await response.aclose()
        return True

    async def _forward_socket(self, tag: str, scope: dict, receive: Any, send: Any) -> Any:
        """Open the WebSocket on the owner and relay its messages both ways, and its close;
        the owner's refusal (its guard's 403) is the client's. Returns None when done, or,
        when the owner cannot be reached, the `receive` the local app answers with (it
        reads the handshake again)."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake, InvalidStatus

        handshake = await receive()  # websocket.connect
        if handshake["type"] != "websocket.connect":
            return None
        url = await self._url(tag)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        keep = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k not in HOP_BY_HOP and k not in SOCKET_OWN and not k.startswith(b"sec-websocket-")
        ]
        keep.append((PEER_HEADER.decode(), self.secret.decode()))
        query = scope.get("query_string", b"").decode("latin-1")
        # the client's Host, so that the owner's guard checks it and the Origin against
        # it as on a direct request; the connection itself goes to the listener
        host = headers.get("host") or "localhost"
        target = f"ws://{host}{scope['path']}" + (f"?{query}" if query else "")
        owner = None
        if url is not None:
            listener = _host_port(url)
            try:
                owner = await connect(
                    target,
                    host=listener[0],
                    port=listener[1],
                    additional_headers=keep,
                    origin=headers.get("origin"),
                    user_agent_header=headers.get("user-agent"),
                    compression=None,
                    proxy=None,
                    open_timeout=10.0,
                    max_size=None,  # the owner's guard bounds what it takes and sends
                )
            except InvalidStatus:  # refused by the owner's guard
                await send({"type": "websocket.close", "code": WS_REFUSED})
                return None
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                log.info("replica %s at %s is gone (%s); forgetting it", tag, url, exc)
                await self._forget(tag, url)
        if owner is None:
            replayed = [handshake]

            async def again() -> dict:
                return replayed.pop() if replayed else await receive()

            return again
        await send({"type": "websocket.accept", "headers": [(FORWARDED_BY, self.tag.encode())]})
        upstream = asyncio.ensure_future(_client_to_owner(receive, owner))
        downstream = asyncio.ensure_future(_owner_to_client(owner, send))
        try:
            # the owner's close ends downstream; upstream ends when the client goes, or
            # at the owner's close (downstream then tells the client)
            await asyncio.wait({upstream, downstream}, return_when=asyncio.FIRST_COMPLETED)
            if upstream.done() and owner.protocol.close_rcvd is not None:
                await downstream
        finally:
            for task in (upstream, downstream):
                task.cancel()
            await owner.close()
        return None

    async def _relay(self, response: Any, send: Any) -> None:
        async for chunk in response.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # -- the job list -------------------------------------------------------------------

    async def _merged_list(self, scope: dict, receive: Any, send: Any) -> None:
        """This replica's answer (its guard decides who may read), with every other
        replica's jobs merged in, newest first."""
        local = _Captured()
        await self.app(scope, receive, local.send)
        if local.status != 200:
            return await local.replay(send)
        renders = json.loads(local.body)["renders"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        try:
            limit = max(1, min(int(query.get("limit", ["50"])[-1]), 500))
        except ValueError:
            limit = 50
        self.peers = await self.book.all.remote()
        others = [(tag, url) for tag, url in self.peers.items() if tag != self.tag]
        answers = await asyncio.gather(
            *(self._http().send(self._request(url, scope)) for _, url in others),
            return_exceptions=True,
        )
        for (tag, url), answer in zip(others, answers, strict=True):
            if isinstance(answer, Exception):
                log.info("replica %s at %s did not list its jobs (%s)", tag, url, answer)
                await self._forget(tag, url)
            elif answer.status_code == 200:
                renders += answer.json()["renders"]
        renders.sort(key=lambda job: job.get("created") or 0, reverse=True)
        await local.replay(send, json.dumps({"renders": renders[:limit]}).encode())


def _host_port(url: str) -> tuple[str, int]:
    """(host, port) of a listener's `http://host:port`."""
    host, _, port = url.removeprefix("http://").rpartition(":")
    return host, int(port)


async def _client_to_owner(receive: Any, owner: Any) -> None:
    """The client's messages to the owner, until the client goes (or the owner: its
    close is then the client's, `_owner_to_client`)."""
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("bytes") is not None:
                await owner.send(message["bytes"])
            elif message.get("text") is not None:
                await owner.send(message["text"])


async def _owner_to_client(owner: Any, send: Any) -> None:
    """The owner's messages to the client, then the owner's close (its code and reason)."""
    from websockets.exceptions import ConnectionClosed

    with contextlib.suppress(ConnectionClosed):
        async for data in owner:
            kind = "bytes" if isinstance(data, bytes) else "text"
            await send({"type": "websocket.send", kind: data})
    said = owner.protocol.close_rcvd  # None: the owner went without a close frame
    code, reason = (int(said.code), said.reason) if said is not None else (WS_UNREACHABLE, GONE)
    with contextlib.suppress(Exception):  # the client may be gone already
        await send({"type": "websocket.close", "code": code, "reason": reason})


async def _disconnected(receive: Any) -> None:
    """Returns once the client has gone away (its body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _Captured:
    """A response the local app made, held to be sent later (a small JSON list)."""

    def __init__(self) -> None:
        self.status, self.headers, self.body = 500, [], b""

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status, self.headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    async def replay(self, send: Any, body: bytes | None = None) -> None:
        headers = self.headers
        if body is not None:
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body if body is None else body})


async def listen(
    app: Any, host: str, secret: bytes, probe: Callable[[], dict] | None = None
) -> tuple[Any, str]:
    """Serve `app` behind the peer gate on `host`, a free port, on this event loop (the
    app's service lives on it), `probe()` answering PROBE_PATH; returns the server
    (`stop` it) and its URL."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # the process's signals are Ray's, not this server's
            yield

    gate = PeerGate(app, secret, probe)
    # no lifespan (the app's runs under Serve), no logging setup (the process's is Ray's)
    config = uvicorn.Config(gate, host=host, port=0, lifespan="off", log_config=None)
    server = Server(config)
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it could not start
            raise RuntimeError(f"the peer listener on {host} did not start")
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    server.hotplate_task = task
    return server, f"http://{host}:{port}"


async def stop(server: Any) -> None:
    server.should_exit = True
    with contextlib.suppress(Exception):
        await asyncio.wait_for(server.hotplate_task, 10.0)


async def register(book: Any, tag: str, url: str, wait: float = REGISTER_WAIT) -> None:
    """Register this replica and return once the book has it: the replica's start waits
    on this, so that no request reaches it before the other replicas can find it. On a
    cold cluster the book's actor may still be starting; RuntimeError after `wait`."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        try:
            await asyncio.wait_for(book.register.remote(tag, url), timeout=max(1.0, wait / 4))
            return
        except Exception as exc:  # noqa: BLE001 - the actor (re)starts; try again
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(
                    f"replica {tag} could not register with the peer book ({NAME} in "
                    f"namespace {NAMESPACE}) in {wait:.0f} s ({exc}); check the cluster "
                    "with `ray status`"
                ) from exc
            log.info("replica %s could not register yet (%s)", tag, exc)
            await asyncio.sleep(0.2)


async def keep_registered(book: Any, tag: str, url: str) -> None:
    """Register again every REGISTER_EVERY seconds (`register` did the first), for as
    long as the replica runs: an actor restart forgets them."""
    while True:
        await asyncio.sleep(REGISTER_EVERY)
        try:
            await book.register.remote(tag, url)
        except Exception as exc:  # noqa: BLE001 - the actor restarts; try again
            log.info("replica %s could not register (%s)", tag, exc)

"""A WebSocket echo route behind the guard, for tests/hotplate/test_serve_guard_ws.py: the
shape the streaming route (WS /v1/live) gets when create_app includes it. Run under real
uvicorn: `uvicorn --factory tests.hotplate.guard_ws_app:make_app`."""

from __future__ import annotations

import os

from hotplate.serve.guard import Guard, Policy

TOKEN = "ws-token"
LIMIT = 64 * 1024


async def echo(scope: dict, receive, send) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    client = scope["state"]["client"]
    await send({"type": "websocket.send", "text": f"hello {client.id}"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "bytes": message.get("bytes") or b""})


def policy() -> Policy:
    return Policy.of([TOKEN], [], body_limit=LIMIT, bound_host="127.0.0.1")


def make_app():
    guarded = Guard(echo, policy())
    # the test signs URLs with the same key: a fixed one, from the environment
    guarded.policy.key = os.environ["GUARD_KEY"].encode()
    return guarded

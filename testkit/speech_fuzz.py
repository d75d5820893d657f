"""Hostile speech-socket clients, seeded (tests/hotplate/test_serve_speech_socket.py and
bench/bench_fuzz.py): `hostile(rng)` makes one case, a first message and maybe frames
after it, of what a client may send a conversation session's speech socket (deep
nesting, huge strings, wrong types, binary where text is expected, text that is not
UTF-8, wrong sample rates, zero-length messages, fragments); `run_case` sends it and
returns the close frame the server answered with."""

from __future__ import annotations

import asyncio
import json
import random

from hotplate.serve.limits import MAX_PCM_MESSAGE, MAX_TEXT_MESSAGE

FORMAT = json.dumps({"sample_rate": 16000, "channels": 1, "format": "s16le"})
BOGUS = json.dumps({"type": "bogus"})  # sent last: a socket that took the rest says 1003


async def closed(ws, timeout: float = 20.0) -> tuple[int | None, str]:
    """The close frame the server sent (code, reason); what it said before is read and
    dropped. None as the code when the connection ended with no close frame."""
    from websockets.exceptions import ConnectionClosed

    async def drain() -> None:
        try:
            while True:
                await ws.recv()
        except ConnectionClosed:
            pass

    await asyncio.wait_for(drain(), timeout)
    rcvd = ws.protocol.close_rcvd
    return (None if rcvd is None else rcvd.code), ("" if rcvd is None else rcvd.reason)


WEIRD = [
    None,
    True,
    -1,
    0,
    7999,
    192001,
    2**63,
    1e308,
    float("nan"),
    "16000",
    [16000],
    {"hz": 16000},
    "",
    "s16le",
    "f32le",
    "\u0000",
]


def hostile(rng: random.Random) -> list:
    """One case: what a hostile client sends, as a list of (kind, payload)."""
    big = rng.choice([MAX_TEXT_MESSAGE - 10, MAX_TEXT_MESSAGE + 1, 200_000])
    depth = rng.choice([10, 900, 5000, 60_000])
    fields = {k: rng.choice(WEIRD) for k in ("sample_rate", "channels", "format")}
    fields = {k: v for k, v in fields.items() if rng.random() < 0.8}
    firsts = [
        ("text", "[" * depth),
        ("text", "{" + '"a":{' * depth),
        ("text", json.dumps({"sample_rate": 16000, "pad": "x" * big})),
        ("text", json.dumps(fields)),
        ("text", json.dumps(rng.choice(WEIRD))),
        ("text", ""),
        ("text", "not json {"),
        ("text_bytes", rng.choice([b"\xff\xfe", b"{\xc3\x28}", b'{"a": "\xed\xa0\x80"}'])),
        ("bytes", rng.randbytes(rng.choice([0, 1, 3, 9600]))),
        ("bytes", b""),
        ("fragments", ["{", '"sample_rate": 16000', "}"]),
        ("fragments", [b"\x00" * 10, b"\x01" * 10]),
        ("fragments", ["[" * 3000] * 3),
        ("text", FORMAT),
    ]
    frames = [
        ("bytes", rng.randbytes(rng.choice([0, 1, 3, 4097]))),
        ("text", json.dumps({"type": rng.choice(WEIRD)})),
        ("text", json.dumps({"type": "end_of_turn", "x": [1]})),
        ("text", json.dumps({"type": "interrupt"})),
        ("text", json.dumps({"type": "end_of_turn"})),
        ("text", "[" * depth),
        ("text_bytes", b"\x80abc"),
        ("fragments", [b"ab", b"cd"]),
        ("fragments", ['{"type": ', '"end_of_turn"}']),
        ("bytes", bytes(MAX_PCM_MESSAGE + rng.choice([1, 5000]))),
        ("text", "x" * big),
    ]
    case = [rng.choice(firsts)]
    if case[0] == ("text", FORMAT) or rng.random() < 0.3:
        case += [rng.choice(frames) for _ in range(rng.randint(1, 4))]
    return case


async def send(ws, kind: str, payload) -> None:
    if kind == "text_bytes":  # text whose bytes are not UTF-8
        await ws.send(payload, text=True)
    else:
        await ws.send(payload)


async def run_case(url: str, case: list) -> tuple[int | None, str]:
    """Open `url`, send `case` and then BOGUS; the server's close (code, reason)."""
    import websockets
    from websockets.exceptions import ConnectionClosed

    async with websockets.connect(url, max_size=None) as ws:
        try:
            for kind, payload in case:
                await send(ws, kind, payload)
            await ws.send(BOGUS)
        except ConnectionClosed:
            pass  # closed mid-case: the code is read below
        return await closed(ws)


def describe(case: list) -> str:
    return repr([(kind, repr(payload)[:60]) for kind, payload in case])

"""An avatar's manifest on the blob tier: what a push writes and what a pull accepts.

    {"body": {"hotplate": 2, "avatar": key, "record": the avatar record (without its
              local times), "stages": {stage key: stage record}, "blobs": {xxh3: [sha256,
              size]}},
     "sha256": hex of the canonical body,
     "hmac": hex HMAC-SHA256 of the canonical body under remote_key (when one is set)}

A pull trusts nothing in it that it has not checked: every field of every record has a
type and a range here (`parse_manifest`), the avatar and its stage keys must be the ones
the puller planned itself, and with a key the signature must match. Any mismatch is a
damaged manifest (RemoteDamagedError naming the field): the caller builds locally.

Every field a render reads is bound to content, with or without a key. A stage's meta
(a bank's fps, drive_share, drive_cue, opening_gain, ...) is content of its own: a push
uploads it as an object (`card`: the canonical {"stage": key, "meta": meta}, named by
its SHA-256 like a blob) and a pull takes the manifest's meta only when it is what that
object holds (`check_card`). The record's copies of its stages' fields are checked
against them: an avatar's frames, size and fps against its decode stage and its frame
count, a bank's fps, entries, reason, speech_share and sound_late against its bank
stage, its entries against its crops here and against its arrays' rows once they are
fetched (pull.py). So no field can change on the tier while every object it names
still holds: a change of meta is a change of content, as forged frames are, which
only `remote_key` keeps out.

The fields mirror what `pipeline/precompile/run.py` writes (the avatar record) and
`Store.put_stage` (the stage records); a new field there is refused here until it is
added to RECORD or STAGE (the tier round trip in tests/cachestore/test_remote.py fails).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from cachestore.keys import canonical
from cachestore.remote.tier import RemoteDamagedError, sha256

MANIFEST_VERSION = 2  # 2: each stage's meta is bound to a card object
MAX_CARD = 1 << 20  # bytes a stage's card may claim (its meta, as JSON)
MAX_BLOB = 1 << 40  # bytes one blob may claim
HEX32 = re.compile(r"[0-9a-f]{32}")
HEX64 = re.compile(r"[0-9a-f]{64}")


class Bad(ValueError):
    """One field that does not fit the schema (its dotted name is the message)."""


def _int(value: Any, lo: int = 0, hi: int = 1 << 62) -> bool:
    return type(value) is int and lo <= value <= hi


def _number(value: Any, positive: bool = False) -> bool:
    ok = type(value) in (int, float) and math.isfinite(value)
    return ok and (value > 0 if positive else True)


def _json(value: Any, depth: int = 0) -> bool:
    """Plain JSON data (what stage meta holds): finite numbers, strings, lists, str-keyed maps."""
    if depth > 6:
        return False
    if value is None or type(value) in (bool, str) or _number(value):
        return True
    if type(value) is list:
        return all(_json(v, depth + 1) for v in value)
    if type(value) is dict:
        return all(type(k) is str and _json(v, depth + 1) for k, v in value.items())
    return False


def _scalar(value: Any) -> bool:
    return value is None or type(value) in (bool, str) or _number(value)


def _str_map(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: type(v) is dict and all(type(k) is str and check(x) for k, x in v.items())


# field -> (required, check); the avatar record as precompile writes it
RECORD: dict[str, tuple[bool, Callable[[Any], bool]]] = {
    "stages": (True, _str_map(lambda k: type(k) is str)),
    "frames": (True, lambda v: _int(v, 1)),
    "fps": (True, lambda v: _number(v, positive=True)),
    "width": (True, lambda v: _int(v, 1, 1 << 16)),
    "height": (True, lambda v: _int(v, 1, 1 << 16)),
    "source_digest": (False, lambda v: type(v) is str and bool(HEX32.fullmatch(v))),
    "source": (False, lambda v: type(v) is str),
    "counts": (False, _str_map(lambda v: _int(v, -(1 << 62)))),
    "recipe": (False, _str_map(_scalar)),
    # a mouth bank's record (`"kind": "bank"`, pipeline/precompile/run.py::_build_bank)
    "kind": (False, lambda v: v == "bank"),
    "entries": (False, _int),
    "reason": (False, lambda v: type(v) is str),
    "speech_share": (False, lambda v: _number(v) and 0 <= v <= 1),
    # how far its footage's sound sat off its pictures (`mouth.bank.sound_offset`)
    "sound_late": (False, _str_map(_scalar)),
    # [min, max] of its footage's openings (`mouth.bank.opening_range`); None for an empty bank
    "opening_range": (
        False,
        lambda v: (
            v is None
            or (type(v) is list and len(v) == 2 and all(_number(x) for x in v) and v[0] <= v[1])
        ),
    ),
}
# a stage record as the store keeps it (`sizes` is the puller's own: derived, not sent)
STAGE: dict[str, tuple[bool, Callable[[Any], bool]]] = {
    "name": (True, lambda v: type(v) is str),
    "blobs": (True, _str_map(lambda d: type(d) is str and bool(HEX32.fullmatch(d)))),
    "meta": (True, lambda v: type(v) is dict and _json(v)),
    "created": (True, _number),
    "nbytes": (True, _int),
    # [sha256, size] of the stage's card: its meta as an object of its own (`card_bytes`)
    "card": (
        True,
        lambda v: (
            type(v) is list
            and len(v) == 2
            and type(v[0]) is str
            and bool(HEX64.fullmatch(v[0]))
            and _int(v[1], 1, MAX_CARD)
        ),
    ),
}
# a bank record's copies of its bank stage's meta: field -> what a build writes when the
# meta has none (pipeline/precompile/run.py::_build_bank)
BANK_COPIES = {
    "entries": 0,
    "reason": "",
    "speech_share": 0.0,
    "sound_late": {},
    "opening_range": None,
}


def _fields(record: Any, schema: Mapping[str, tuple[bool, Callable]], where: str) -> None:
    if type(record) is not dict:
        raise Bad(where)
    for name in record:
        if name not in schema:
            raise Bad(f"{where}.{name} (unexpected)")
    for name, (required, check) in schema.items():
        if name not in record:
            if required:
                raise Bad(f"{where}.{name} (missing)")
            continue
        if not check(record[name]):
            raise Bad(f"{where}.{name}")


def card_bytes(stage_key: str, meta: Mapping[str, Any]) -> bytes:
    """A stage's card: its meta, bound to its key, as the object a push uploads."""
    return canonical({"stage": stage_key, "meta": meta})


def check_card(data: Any, stage_key: str, rec: Mapping[str, Any], where: str) -> None:
    """Raise RemoteDamagedError (naming `where`, the card's object) unless `data` is the
    card the manifest's stage record `rec` names and holds the meta that record says."""
    name, size = rec["card"]
    why = None
    if data is None:
        why = "missing"
    elif len(data) != size:
        why = f"{len(data)} bytes, the manifest says {size}"
    elif sha256(data) != name:
        why = "SHA-256 does not match its name"
    elif bytes(data) != card_bytes(stage_key, rec["meta"]):
        held = _card_meta(data, stage_key)
        changed = sorted(
            k for k in set(held) | set(rec["meta"]) if held.get(k) != rec["meta"].get(k)
        )
        fields = ", ".join(f"meta.{k}" for k in changed) or "the card is another stage's"
        why = f"the manifest's {fields} not what its card holds"
    if why is not None:
        raise RemoteDamagedError(
            f"remote manifest of stage {rec['name']} does not match its card {where} ({why}); "
            f"refused, building locally (a push from a good store mends it)"
        )


def _card_meta(data: Any, stage_key: str) -> dict[str, Any]:
    """The meta a card of `stage_key` holds ({} when it holds another's, or no JSON)."""
    try:
        card = json.loads(bytes(data))
    except (ValueError, RecursionError):
        return {}
    ok = type(card) is dict and card.get("stage") == stage_key and type(card.get("meta")) is dict
    return card["meta"] if ok else {}


def signature(body: Any, key: bytes) -> str:
    return hmac.new(key, canonical(body), hashlib.sha256).hexdigest()


def manifest_bytes(body: dict[str, Any], key: bytes | None = None) -> bytes:
    outer = {"body": body, "sha256": sha256(canonical(body))}
    if key is not None:
        outer["hmac"] = signature(body, key)
    return json.dumps(outer, sort_keys=True).encode()


def parse_manifest(
    data: bytes | memoryview,
    avatar: str,
    stages: Mapping[str, str],
    where: str,
    key: bytes | None = None,
) -> dict[str, Any]:
    """The manifest's body, every field checked; raises RemoteDamagedError (naming `where`
    and the field) unless it is whole, for `avatar`, names exactly the stage keys of
    `stages` (name -> key, the puller's own plan) and, with `key`, is signed with it."""
    try:
        outer = json.loads(bytes(data))
        body = _check(outer, avatar, stages)
    except (ValueError, RecursionError) as exc:  # Bad, and JSON that is not JSON
        field = str(exc) if isinstance(exc, Bad) else "not JSON"
        raise RemoteDamagedError(
            f"remote manifest {where} is damaged or truncated ({field}); refused, building "
            f"locally (a push from a good store mends it)"
        ) from None
    if key is not None:
        given = outer.get("hmac")
        if type(given) is not str or not hmac.compare_digest(
            given.encode("ascii", "replace"), signature(body, key).encode()
        ):
            why = "unsigned" if given is None else "signed with another key"
            raise RemoteDamagedError(
                f"remote manifest {where} is {why}, and remote_key is set: refused, "
                f"building locally (a push from this store signs it)"
            )
    return body


def _check(outer: Any, avatar: str, stages: Mapping[str, str]) -> dict[str, Any]:
    if type(outer) is not dict or not {"body", "sha256"} <= set(outer) <= {
        "body",
        "sha256",
        "hmac",
    }:
        raise Bad("outer fields")
    body = outer["body"]
    if type(body) is not dict or set(body) != {"hotplate", "avatar", "record", "stages", "blobs"}:
        raise Bad("body fields")
    if outer["sha256"] != sha256(canonical(body)):
        raise Bad("checksum")
    if body["hotplate"] != MANIFEST_VERSION or type(body["hotplate"]) is not int:
        raise Bad("body.hotplate (version)")
    if body["avatar"] != avatar:
        raise Bad("body.avatar (another avatar)")
    record = body["record"]
    _fields(record, RECORD, "record")
    if record["stages"] != dict(stages):
        raise Bad("record.stages (not this avatar's stage keys)")
    blobs = body["blobs"]
    if type(blobs) is not dict:
        raise Bad("blobs")
    for digest, entry in blobs.items():
        if (
            not HEX32.fullmatch(digest)
            or type(entry) is not list
            or len(entry) != 2
            or type(entry[0]) is not str
            or not HEX64.fullmatch(entry[0])
            or not _int(entry[1], 0, MAX_BLOB)
        ):
            raise Bad(f"blobs.{digest[:32]}")
    records = body["stages"]
    if type(records) is not dict or set(records) != set(stages.values()):
        raise Bad("stages (not exactly this avatar's stage keys)")
    named = set()
    for name, stage_key in stages.items():
        rec = records[stage_key]
        _fields(rec, STAGE, f"stages.{name}")
        if rec["name"] != name:
            raise Bad(f"stages.{name}.name")
        if any(d not in blobs for d in rec["blobs"].values()):
            raise Bad(f"stages.{name}.blobs (not in blobs)")
        if rec["nbytes"] != sum(blobs[d][1] for d in rec["blobs"].values()):
            raise Bad(f"stages.{name}.nbytes")
        named.update(rec["blobs"].values())
    if named != set(blobs):
        raise Bad("blobs (names blobs no stage names)")
    decode = records.get(stages.get("decode", ""))
    if decode is not None:  # the frames a render indexes: as many as the record says
        meta = decode["meta"]
        frames = [n for n in decode["blobs"] if n.startswith("frame/")]
        for field in ("frames", "width", "height", "fps"):
            if meta.get(field) != record[field]:
                raise Bad(f"stages.decode.meta.{field}")
        if len(frames) != record["frames"]:
            raise Bad("stages.decode.blobs (frame count)")
    bank = records.get(stages.get("bank", ""))
    if record.get("kind") == "bank" and bank is None:
        raise Bad("record.kind (a bank names no bank stage)")
    if bank is not None:  # what a render of its mouths reads: as its stage says
        meta = bank["meta"]
        if record.get("kind") != "bank":
            raise Bad("record.kind (a bank stage in a record that is no bank)")
        for field, default in BANK_COPIES.items():
            if record.get(field, default) != meta.get(field, default):
                raise Bad(f"record.{field} (not its bank stage's)")
        entries = meta.get("entries", 0)
        if entries and ("fps" not in meta or meta["fps"] != record["fps"]):
            raise Bad("record.fps (not its bank stage's)")
        if sum(n.startswith("crop/") for n in bank["blobs"]) != entries:
            raise Bad("stages.bank.blobs (crop count is not its entries)")
    return body

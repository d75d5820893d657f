"""Array values: a small msgpack header, then the raw bytes at an aligned offset.

Layout of one value::

    b"HPA1" | u32 little-endian header length | msgpack header | zero pad | raw bytes

The header holds the schema version, ``dtype.str``, the shape, the xxh3-64 checksum
of the raw bytes and any small user attributes. The raw bytes start at a multiple of
``ALIGN`` so ``numpy.frombuffer`` can view them in place inside an LMDB read
transaction. This module knows nothing about LMDB.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import xxhash

MAGIC = b"HPA1"
SCHEMA = 1
ALIGN = 64
_PREFIX = struct.Struct("<4sI")


class CodecError(ValueError):
    """A value that is not a hotplate array, or whose bytes do not match its checksum."""


@dataclass(frozen=True)
class Header:
    dtype: str
    shape: tuple[int, ...]
    checksum: int
    offset: int  # where the raw bytes start in the value
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


def checksum(raw: bytes | memoryview) -> int:
    return xxhash.xxh3_64_intdigest(raw)


def encode(array: np.ndarray, **attrs: Any) -> bytes:
    """Serialise an array (any shape, 0-d and empty included) with its checksum.

    Raises ValueError for object, void-structured or otherwise unportable dtypes.
    """
    array = np.asarray(array)
    if array.dtype.hasobject or array.dtype.kind == "V":
        raise ValueError(f"dtype {array.dtype} cannot be stored: use a numeric or bytes dtype")
    if array.dtype.byteorder == ">":  # stored little-endian: a flipped order bit is damage
        array = array.astype(array.dtype.newbyteorder("<"))
    raw = np.ascontiguousarray(array).tobytes()
    header = msgpack.packb(
        {
            "v": SCHEMA,
            "dtype": array.dtype.str,
            "shape": list(array.shape),
            "xxh3": checksum(raw),
            "attrs": attrs,
        },
        use_bin_type=True,
    )
    start = _PREFIX.size + len(header)
    offset = -(-start // ALIGN) * ALIGN
    return b"".join((_PREFIX.pack(MAGIC, len(header)), header, bytes(offset - start), raw))


# What a stored header may say: every field typed, so that damage to it is a CodecError
# here and never a TypeError or KeyError further up (tests/integrity/test_flipped_bytes.py
# flips every header byte).
_FIELDS = {"v", "dtype", "shape", "xxh3", "attrs"}
# dtype.str of what encode() writes: little-endian (or no order), a numeric, bool or
# bytes/str kind, a size
_DTYPE = re.compile(r"[<|][biufcSU][0-9]{1,6}")
MAX_DIMS = 32  # numpy's own limit is 64; nothing stored has more than a few


def read_header(value: bytes | memoryview) -> Header:
    """Parse and check the header of a stored value without touching its payload.

    Raises CodecError for anything that is not a whole header: wrong magic, a length
    past the value, unreadable msgpack, a missing, extra or mistyped field, a dtype that
    cannot be stored, a shape that is not a list of sizes, a payload whose size is not
    the one the header gives, or a pad that is not zeros."""
    if len(value) < _PREFIX.size:
        raise CodecError("value too short to be a hotplate array")
    magic, length = _PREFIX.unpack_from(value, 0)
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}: not a hotplate array")
    if _PREFIX.size + length > len(value):
        raise CodecError(f"header length {length} runs past the value ({len(value)} bytes)")
    try:
        head = msgpack.unpackb(bytes(value[_PREFIX.size : _PREFIX.size + length]), raw=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"unreadable header: {exc}") from exc
    if not isinstance(head, dict) or set(head) != _FIELDS:
        raise CodecError("header fields are not v, dtype, shape, xxh3, attrs")
    if head["v"] != SCHEMA or type(head["v"]) is not int:
        raise CodecError(f"array schema {head['v']!r} is not {SCHEMA}")
    dtype = _dtype(head["dtype"])
    shape = head["shape"]
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(type(n) is int and 0 <= n < 1 << 48 for n in shape)
    ):
        raise CodecError(f"shape {shape!r} is not a list of sizes")
    checksum_ = head["xxh3"]
    if type(checksum_) is not int or not 0 <= checksum_ < 1 << 64:
        raise CodecError("checksum is not a 64-bit number")
    attrs = head["attrs"]
    if not isinstance(attrs, dict) or not all(isinstance(k, str) for k in attrs):
        raise CodecError("attrs are not a map of names")
    start = _PREFIX.size + length
    offset = -(-start // ALIGN) * ALIGN
    header = Header(dtype.str, tuple(shape), checksum_, offset, attrs)
    nbytes = dtype.itemsize * math.prod(shape)
    if len(value) - offset != nbytes:
        raise CodecError(f"payload is {max(len(value) - offset, 0)} bytes, header says {nbytes}")
    if any(memoryview(value)[start:offset]):
        raise CodecError("the pad between header and payload is not zeros")
    return header


def _dtype(text: object) -> np.dtype:
    """The stored dtype string as a numpy dtype; CodecError unless encode() could have written it."""
    # matched before numpy sees it: np.dtype() parses some strings with ast (SyntaxError)
    if not isinstance(text, str) or not _DTYPE.fullmatch(text):
        raise CodecError(f"dtype {text!r} cannot be stored")
    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"dtype {text!r} is not a dtype") from exc
    if dtype.str != text or dtype.itemsize == 0:
        raise CodecError(f"dtype {text!r} cannot be stored")
    return dtype


def check(value: bytes | memoryview, digest: str | None = None) -> Header:
    """The header of a whole value, without viewing its array: raises CodecError as
    `decode(value, digest=digest)` would (with no digest, only the header is checked)."""
    header = read_header(value)
    if digest is not None and xxhash.xxh3_128_hexdigest(value) != digest:
        raise CodecError("the value does not hash to its digest: the stored bytes are damaged")
    return header


def decode(
    value: bytes | memoryview, verify: bool = True, digest: str | None = None
) -> tuple[Header, np.ndarray]:
    """View the array inside ``value`` without copying.

    The result aliases ``value``: when ``value`` is an LMDB buffer it is valid only
    inside that read transaction; callers copy anything that leaves it.
    Raises CodecError when the value is not a whole array (see read_header) or, with
    ``verify``, when its bytes are damaged: with ``digest`` (the store's name for the
    value, its xxh3-128) the whole value, header and pad included, must hash to it, so
    every damaged byte is found; without, the payload must match the header's checksum.
    """
    header = check(value, digest if verify else None)
    raw = memoryview(value)[header.offset :]
    if verify and digest is None and checksum(raw) != header.checksum:
        raise CodecError("checksum mismatch: the stored bytes are damaged")
    array = (
        np.frombuffer(raw, dtype=np.dtype(header.dtype))
        if header.nbytes
        else np.empty(0, header.dtype)
    )
    return header, array.reshape(header.shape)

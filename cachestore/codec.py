"""Array values: a small msgpack header, then the raw bytes at an aligned offset.

Layout of one value::

    b"HPA1" | u32 little-endian header length | msgpack header | zero pad | raw bytes

The header holds the schema version, ``dtype.str``, the shape, the xxh3-64 checksum
of the raw bytes and any small user attributes. The raw bytes start at a multiple of
``ALIGN`` so ``numpy.frombuffer`` can view them in place inside an LMDB read
transaction. This module knows nothing about LMDB.
"""

from __future__ import annotations

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


def read_header(value: bytes | memoryview) -> Header:
    """Parse the header of a stored value without touching its payload."""
    if len(value) < _PREFIX.size:
        raise CodecError("value too short to be a hotplate array")
    magic, length = _PREFIX.unpack_from(value, 0)
    if magic != MAGIC:
        raise CodecError(f"bad magic {bytes(magic)!r}: not a hotplate array")
    try:
        head = msgpack.unpackb(bytes(value[_PREFIX.size : _PREFIX.size + length]), raw=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"unreadable header: {exc}") from exc
    if head.get("v") != SCHEMA:
        raise CodecError(f"array schema {head.get('v')} is not {SCHEMA}")
    offset = -(-(_PREFIX.size + length) // ALIGN) * ALIGN
    return Header(
        head["dtype"], tuple(head["shape"]), head["xxh3"], offset, head.get("attrs") or {}
    )


def decode(value: bytes | memoryview, verify: bool = True) -> tuple[Header, np.ndarray]:
    """View the array inside ``value`` without copying.

    The result aliases ``value``: when ``value`` is an LMDB buffer it is valid only
    inside that read transaction; callers copy anything that leaves it.
    Raises CodecError on a truncated value or, with ``verify``, a checksum mismatch.
    """
    header = read_header(value)
    raw = memoryview(value)[header.offset :]
    if len(raw) != header.nbytes:
        raise CodecError(f"payload is {len(raw)} bytes, header says {header.nbytes}")
    if verify and checksum(raw) != header.checksum:
        raise CodecError("checksum mismatch: the stored bytes are damaged")
    array = (
        np.frombuffer(raw, dtype=np.dtype(header.dtype))
        if header.nbytes
        else np.empty(0, header.dtype)
    )
    return header, array.reshape(header.shape)

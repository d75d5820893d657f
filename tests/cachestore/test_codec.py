import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cachestore import codec

pytestmark = pytest.mark.quick  # the quick tier (tests/quick_tier.py)

DTYPES = st.sampled_from(
    ["u1", "i1", "<u2", ">i2", "<i4", ">u4", "<i8", "<f2", "<f4", ">f8", "?", "<c8", "S3", "<U2"]
)


@settings(max_examples=300, deadline=None)
@given(
    hnp.arrays(
        dtype=DTYPES.map(np.dtype),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
    )
)
def test_round_trip_is_bit_exact(array):
    header, back = codec.decode(codec.encode(array))
    little = array.astype(array.dtype.newbyteorder("<"))  # stored little-endian
    assert back.dtype == little.dtype and back.shape == array.shape
    assert back.tobytes() == np.ascontiguousarray(little).tobytes()
    assert header.offset % codec.ALIGN == 0


def test_zero_d_and_empty_and_attrs():
    for array in (np.float32(3.5) * np.ones(()), np.zeros((0,), "u1"), np.zeros((4, 0, 2), "<f2")):
        header, back = codec.decode(codec.encode(array, codec_name="raw"))
        assert back.shape == array.shape and header.attrs == {"codec_name": "raw"}


def test_non_contiguous_input_is_stored_contiguously():
    array = np.arange(60, dtype="<i4").reshape(6, 10)[:, ::3]
    assert np.array_equal(codec.decode(codec.encode(array))[1], array)


def test_checksum_mismatch_detected():
    value = bytearray(codec.encode(np.arange(100, dtype="<i4")))
    value[-5] ^= 0xFF
    with pytest.raises(codec.CodecError, match="checksum"):
        codec.decode(bytes(value))
    codec.decode(bytes(value), verify=False)  # still parseable when asked not to verify


@pytest.mark.parametrize(
    "bad", [b"", b"HPA1", b"XXXX\x00\x00\x00\x00", codec.encode(np.arange(10))[:-3]]
)
def test_foreign_or_truncated_values_rejected(bad):
    with pytest.raises(codec.CodecError):
        codec.decode(bad)


def test_object_dtype_refused():
    with pytest.raises(ValueError, match="cannot be stored"):
        codec.encode(np.array([{"a": 1}], dtype=object))


def test_view_is_zero_copy():
    value = codec.encode(np.arange(1000, dtype="<f8"))
    _, view = codec.decode(value)
    assert not view.flags.owndata and not view.flags.writeable

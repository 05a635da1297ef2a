"""KeyCodec's u64 path reading integer and temporal columns straight from their values buffer
(no nulls) gives the codes of the general per-column path (``_ordered_uint``), for every
integer and temporal type, nullable fields, sliced columns, and columns with nulls mixed in."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given
from hypothesis import strategies as st

from dbsp.algebra.codes import KeyCodec, _ordered_uint, _valid_u64

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
         pa.uint64(), pa.date32(), pa.date64(), pa.time32("s"), pa.time64("us"),
         pa.timestamp("ns", "UTC"), pa.duration("ms"), pa.bool_(), pa.float64()]


def _reference(codec: KeyCodec, cols: list) -> np.ndarray:
    code = np.zeros(len(cols[0]), np.uint64)
    for f, col in zip(codec.fields, cols):
        if f.nullable:
            code = (code << np.uint64(8)) | _valid_u64(col)
        u, w = _ordered_uint(col)
        if col.null_count:
            u = np.where(_valid_u64(col).astype(bool), u, np.uint64(0))
        code = (code << np.uint64(8 * w)) | u if w < 8 else u
    return code


def _column(t: pa.DataType, n: int, rng) -> pa.Array:
    if pa.types.is_boolean(t):
        return pa.array(rng.random(n) < 0.5)
    if pa.types.is_floating(t):
        return pa.array(rng.normal(size=n))
    kind = "u" if pa.types.is_unsigned_integer(t) else "i"
    dt = np.dtype(f"{kind}{t.bit_width // 8}")
    info = np.iinfo(dt)
    raw = pa.array(rng.integers(info.min, info.max, n, endpoint=True, dtype=dt))
    return pa.Array.from_buffers(t, n, raw.buffers())  # same bits, the wanted type


@given(st.lists(st.tuples(st.sampled_from(TYPES), st.booleans(), st.booleans()), min_size=1,
                max_size=3), st.integers(0, 20), st.integers(0, 3))
def test_buffer_codes_equal_reference(fields, n, skip):
    codec = KeyCodec([pa.field(f"c{i}", t, nl) for i, (t, nl, _) in enumerate(fields)])
    if not codec.u64:
        return
    rng = np.random.default_rng(n * 7 + skip)
    cols = []
    for t, nullable, with_nulls in fields:
        c = _column(t, n + skip, rng)
        if nullable and with_nulls and n + skip:
            # nulls mixed in by Arrow itself: a round trip through Python objects cannot hold
            # every random date32 bit pattern (days beyond year 9999)
            c = pc.if_else(pa.array(rng.random(n + skip) < 0.3), pa.scalar(None, t), c)
        cols.append(c.slice(skip))
    got = codec.encode(cols, n)
    assert got.dtype == np.uint64 and got.flags.writeable
    assert np.array_equal(got, _reference(codec, cols))

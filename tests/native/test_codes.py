"""dbsp._native.codes against KeyCodec.encode_reference (same bytes), and the codec's promise:
codes order rows like the keys (nulls first, NaN last, -0.0 == 0.0), for every column type."""
from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pytest
from dbsp._native import codes as native
from dbsp._native import sort as native_sort
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra.codes import KeyCodec, VarCodes

from ._strategies import key_table, sort_key


def combined(cols):
    return [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in cols]


def rows_of(codes):
    return codes.tolist() if isinstance(codes, np.ndarray) else codes.to_list()


@given(key_table())
def test_encode_var_same_bytes_as_reference(table):
    fields, cols, _ = table
    expect = KeyCodec(fields).encode_reference(combined(cols))
    got = native.encode_var(cols, [f.nullable for f in fields])
    assert isinstance(got, VarCodes)
    assert got.offsets.dtype == np.int64 and got.data.dtype == np.uint8
    assert got.to_list() == expect.to_list()


@given(key_table(), st.integers(0, 3))
def test_encode_var_batch_same_bytes_as_reference(table, cut):
    """The batch encoder (one export through the Arrow C data interface) writes the bytes of
    the reference, or returns None exactly where the column encoder refuses a type."""
    fields, cols, _ = table
    cols = combined(cols)
    batch = pa.RecordBatch.from_arrays(cols, schema=pa.schema(fields))
    batch = batch.slice(min(cut, batch.num_rows))  # a sliced batch too
    nullable = [f.nullable for f in fields]
    try:
        expect = KeyCodec(fields).encode_reference(batch.columns)
        native.encode_var(batch.columns, nullable)
    except TypeError:  # a type codes do not support (as they stand, unnormalized)
        assert native.encode_var_batch(batch, nullable) is None
        return
    got = native.encode_var_batch(batch, nullable)
    assert isinstance(got, VarCodes)
    assert got.to_list() == expect.to_list()


def test_encode_var_batch_is_what_encode_batch_uses():
    f = [pa.field("k", pa.int64(), nullable=False), pa.field("x", pa.float64())]
    b = pa.record_batch([pa.array([3, -1, 3]), pa.array([0.5, None, -0.0])], schema=pa.schema(f))
    codec = KeyCodec(f)
    assert not codec.u64
    assert codec.encode_batch(b).to_list() == codec.encode_reference(b.columns).to_list() == \
        native.encode_var_batch(b, [False, True]).to_list()


@given(key_table(types=["string", "binary", "large_string", "large_binary", "decimal",
                        "decimal38", "int64", "float64"]))
def test_key_codec_encode_uses_the_native_encoder(table):
    fields, cols, _ = table
    codec = KeyCodec(fields)
    if codec.u64:
        return
    cols = combined(cols)
    assert codec.encode(cols).to_list() == codec.encode_reference(cols).to_list()


@given(key_table(allow_null_in_non_nullable=False))
@example(([pa.field("f", pa.float64())], [pa.array([float("nan"), -0.0, 0.0, float("-inf"), None])],
          [(float("nan"),), (-0.0,), (0.0,), (float("-inf"),), (None,)]))
@example(([pa.field("s", pa.string()), pa.field("i", pa.int8(), nullable=False)],
          [pa.array(["a", "a\x00", "", None, "a"]), pa.array([1, -1, 0, 0, -128], pa.int8())],
          [("a", 1), ("a\x00", -1), ("", 0), (None, 0), ("a", -128)]))
def test_codes_order_like_keys(table):
    """sorted(rows, key) equals the rows in code order, and equal keys have equal codes."""
    fields, cols, rows = table
    codes = KeyCodec(fields).encode(combined(cols))
    order = native_sort.argsort(codes)
    keys = [sort_key(r) for r in rows]
    assert [keys[i] for i in order] == sorted(keys)
    crows = rows_of(codes)
    for i in range(len(rows) - 1):
        a, b = order[i], order[i + 1]
        assert (crows[a] == crows[b]) == (keys[a] == keys[b])


def test_unsupported_type():
    with pytest.raises(TypeError):
        native.encode_var([pa.array([1.0], pa.float32())], [False])


def test_sliced_and_empty():
    s = pa.array(["x", None, "y\x00", ""]).slice(1, 2)
    d = pa.array([decimal.Decimal("1.5"), decimal.Decimal("-2.5"), None],
                 pa.decimal128(5, 1)).slice(1)
    f = [pa.field("s", pa.string()), pa.field("d", d.type)]
    assert native.encode_var([s, d], [True, True]).to_list() == \
        KeyCodec(f).encode_reference([s, d]).to_list()
    e = native.encode_var([pa.array([], pa.string())], [True])
    assert len(e) == 0 and e.offsets.tolist() == [0]

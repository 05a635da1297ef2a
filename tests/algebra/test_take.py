"""``dbsp.algebra.schema.take``: its native path for small takes of fixed-width columns
(``take_batch``, through the Arrow C data interface) gives what Arrow's own take gives (values,
types, slices of a batch, time zones), and every other batch (nulls, strings, booleans, no
columns, large takes) goes through Arrow unchanged."""
from __future__ import annotations

from contextlib import contextmanager
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra import schema as S
from dbsp.testing.strategies import FIXED_WIDTH_TYPES, fixed_width_column

FIXED = FIXED_WIDTH_TYPES
_column = fixed_width_column


@given(st.lists(st.sampled_from(FIXED), min_size=1, max_size=4), st.integers(1, 40),
       st.integers(0, 5), st.data())
def test_fixed_width_take_equals_arrow(types, n, skip, data):
    rng = np.random.default_rng(n)
    b = pa.RecordBatch.from_arrays([_column(t, n + skip, rng) for t in types],
                                   names=[f"c{i}" for i in range(len(types))]).slice(skip)
    idx = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=60)), dtype=np.int64)
    got = S.take(b, idx)
    want = b.take(pa.array(idx, pa.int64()))
    assert got.schema == b.schema
    assert got.equals(want)


@pytest.mark.parametrize("col", [pa.array([1, None, 3]), pa.array(["a", "b", "c"]),
                                 pa.array([True, False, True])])
def test_other_columns_go_to_arrow(col):
    b = pa.RecordBatch.from_arrays([pa.array([1, 2, 3]), col], names=["k", "v"])
    idx = np.array([2, 0, 0])
    assert K.take_batch(b, idx) is None
    assert S.take(b, idx).equals(b.take(pa.array(idx)))


def test_no_columns_and_unsigned_indices():
    b = pa.RecordBatch.from_arrays([pa.nulls(4)], names=["_"]).select([])
    assert S.take(b, np.array([0, 1])).num_rows == 2
    b = pa.RecordBatch.from_arrays([pa.array([5, 6, 7])], names=["k"])
    assert S.take(b, np.array([2, 1], np.uint64)).column(0).to_pylist() == [7, 6]


def test_large_take_uses_arrow(monkeypatch):
    b = pa.RecordBatch.from_arrays([pa.array(np.arange(10))], names=["k"])
    monkeypatch.setattr(S, "SMALL_TAKE", 2)
    assert S.take(b, np.array([9, 8, 7])).column(0).to_pylist() == [9, 8, 7]


def test_out_of_range_index_is_an_error():
    b = pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], names=["k"])
    with pytest.raises(IndexError):
        S.take(b, np.array([3]))



def _any_column(t: pa.DataType, n: int, rng) -> pa.Array:
    """``n`` values of ``t`` with some nulls (strings and binaries of varying length)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        vals = ["" if i % 5 == 0 else "é" * int(rng.integers(1, 4)) + str(i) for i in range(n)]
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        vals = [bytes(rng.integers(0, 256, int(rng.integers(0, 6)), dtype=np.uint8))
                for _ in range(n)]
    elif pa.types.is_boolean(t):
        vals = [bool(x) for x in rng.integers(0, 2, n)]
    elif pa.types.is_decimal(t):
        return pa.array([None if i % 4 == 1 else Decimal(i) / 4 for i in range(n)], t)
    else:
        return fixed_width_column(t, n, rng)
    return pa.array([None if rng.random() < 0.2 else v for v in vals], t)


VAR = [pa.string(), pa.large_string(), pa.binary(), pa.large_binary(), pa.bool_(),
       pa.decimal128(9, 2)]


@contextmanager
def _take_batches_path(gather: bool):
    """``take_batches`` on its gather path for every size (``gather``), or on its concatenate
    and take path for every size."""
    old = S.CONCAT_TAKE_ROWS, S.CONCAT_TAKE_FIXED_ROWS
    S.CONCAT_TAKE_ROWS = S.CONCAT_TAKE_FIXED_ROWS = 0 if gather else 1 << 62
    try:
        yield
    finally:
        S.CONCAT_TAKE_ROWS, S.CONCAT_TAKE_FIXED_ROWS = old


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "concat"])
@given(st.lists(st.sampled_from(FIXED + VAR), min_size=1, max_size=4),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3)), min_size=1, max_size=4),
       st.booleans(), st.data())
def test_take_batches_equals_take_of_concat(gather, types, sizes, nulls, data):
    rng = np.random.default_rng(len(types) * 100 + len(sizes))
    schema = pa.schema([pa.field(f"c{i}", t) for i, t in enumerate(types)])
    parts = []
    for n, skip in sizes:
        cols = [_any_column(t, n + skip, rng) for t in types]
        if not nulls:
            cols = [c.fill_null(c.drop_null()[0]) if c.null_count and len(c.drop_null()) else c
                    for c in cols]
        parts.append(pa.RecordBatch.from_arrays(cols, schema=schema).slice(skip))
    total = sum(p.num_rows for p in parts)
    idx = np.asarray(data.draw(st.lists(st.integers(0, max(total - 1, 0)),
                                        max_size=40 if total else 0)), np.int64)
    with _take_batches_path(gather):
        got = S.take_batches(schema, parts, idx)
    want = S.concat_batches(schema, parts).take(pa.array(idx, pa.int64()))
    assert got.schema == schema
    assert got.equals(want)
    for c in got.columns:  # offsets and UTF-8 (the fixed-width fixtures need not be valid dates)
        if c.type in VAR:
            c.validate(full=True)


@pytest.mark.parametrize("gather", [True, False], ids=["gather", "concat"])
def test_take_batches_out_of_range_is_an_error(gather):
    a = pa.record_batch({"s": pa.array(["a", "bb"])})
    for bad in ([4], [-1]):
        with pytest.raises(IndexError), _take_batches_path(gather):
            S.take_batches(a.schema, [a, a], np.asarray(bad))


def test_take_batches_concatenates_small_inputs():
    """Below its thresholds ``take_batches`` concatenates and takes (there the gather's set-up
    costs more than the copy), above them it gathers: a string column lowers the threshold."""
    fixed = pa.schema([("i", pa.int64()), ("f", pa.float64())])
    var = pa.schema([("i", pa.int64()), ("s", pa.string())])
    assert S.concat_takes(fixed, S.CONCAT_TAKE_FIXED_ROWS - 1)
    assert not S.concat_takes(fixed, S.CONCAT_TAKE_FIXED_ROWS)
    assert S.concat_takes(var, S.CONCAT_TAKE_ROWS - 1)
    assert not S.concat_takes(var, S.CONCAT_TAKE_ROWS)
    assert S.CONCAT_TAKE_ROWS <= S.CONCAT_TAKE_FIXED_ROWS


@given(st.lists(st.sampled_from(FIXED + VAR), min_size=1, max_size=4), st.integers(1, 30),
       st.integers(0, 3), st.data())
def test_large_take_with_strings_equals_arrow(types, n, skip, data):
    """Large takes of string/binary and fixed-width columns are gathered natively (one batch
    through :func:`take_batches`' column gather); other types (booleans, decimals) stay Arrow's."""
    rng = np.random.default_rng(n * 10 + skip)
    b = pa.RecordBatch.from_arrays([_any_column(t, n + skip, rng) for t in types],
                                   names=[f"c{i}" for i in range(len(types))]).slice(skip)
    idx = np.asarray(data.draw(st.lists(st.integers(0, n - 1), max_size=40)), dtype=np.int64)
    old = S.SMALL_TAKE
    S.SMALL_TAKE = 0  # every take is "large" here
    try:
        got = S.take(b, idx)
        with pytest.raises(IndexError):
            S.take(b, np.array([n], np.int64))
        if any(t in VAR[:4] for t in types) and all(t not in VAR[4:] for t in types):
            with pytest.raises(TypeError):  # (the native gather's path)
                S.take(b, np.zeros(2, np.float64))
    finally:
        S.SMALL_TAKE = old
    assert got.schema == b.schema
    assert got.equals(b.take(pa.array(idx, pa.int64())))

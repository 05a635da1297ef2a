"""``dbsp.algebra.schema.take``: its native path for small takes of fixed-width columns
(``take_batch``, through the Arrow C data interface) gives what Arrow's own take gives (values,
types, slices of a batch, time zones), and every other batch (nulls, strings, booleans, no
columns, large takes) goes through Arrow unchanged."""
from __future__ import annotations

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


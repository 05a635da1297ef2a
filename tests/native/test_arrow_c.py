"""``dbsp._native.arrow_c.take_batch`` against its reference twin ``kernels_ref.take_batch``:
the same batch for fixed-width columns without nulls (any slice, time zones), the same None
for any other column, the same IndexError past the end; the result owns its memory."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra import kernels_ref as R

FIXED = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64(), pa.float16(),
         pa.float32(), pa.float64(), pa.timestamp("us", tz="Europe/Paris"), pa.date32(),
         pa.date64(), pa.time32("ms"), pa.time64("ns"), pa.duration("s")]


def _column(t: pa.DataType, n: int, rng) -> pa.Array:
    raw = rng.integers(0, 100, n)
    if pa.types.is_floating(t):
        return pa.array(raw.astype(np.float64) / 3).cast(t)
    if pa.types.is_temporal(t):
        return pa.array(raw.astype(np.int64 if t.bit_width == 64 else np.int32)).cast(t)
    return pa.array(raw).cast(t)


def test_native_kernel_is_native():
    assert K.using_native()["take_batch"]


@given(st.lists(st.sampled_from(FIXED + [pa.string(), pa.bool_()]), min_size=1, max_size=5),
       st.integers(1, 40), st.integers(0, 5), st.booleans(), st.data())
def test_take_batch_equals_reference(types, n, skip, nulls, data):
    """The native ``take_batch`` against its reference twin: same batch (or the same None for a
    column it does not gather: strings, booleans, nulls), same IndexError past the end."""
    rng = np.random.default_rng(n + skip)
    cols = [_column(t, n + skip, rng) if t in FIXED else pa.array(
        [str(x) for x in range(n + skip)] if t == pa.string() else [True] * (n + skip), t)
        for t in types]
    if nulls:
        cols[0] = pa.array(cols[0].to_pylist()[:-1] + [None], cols[0].type)
    b = pa.RecordBatch.from_arrays(cols, names=[f"c{i}" for i in range(len(types))]).slice(skip)
    idx = np.asarray(data.draw(st.lists(st.integers(0, n + 1), max_size=60)), dtype=np.int64)
    try:
        want = R.take_batch(b, idx)
    except IndexError:
        with pytest.raises(IndexError):
            K.take_batch(b, idx)
        return
    got = K.take_batch(b, idx)
    if want is None:
        assert got is None
        return
    assert got.schema == b.schema
    assert got.equals(want)
    assert got.validate(full=True) is None


def test_take_batch_outlives_its_source():
    """The gathered batch owns its values: it stays right after the source batch is gone."""
    b = pa.RecordBatch.from_arrays([pa.array(np.arange(1000, dtype=np.int64)),
                                    pa.array(np.arange(1000, dtype=np.int32))], names=["a", "b"])
    got = K.take_batch(b, np.array([999, 3, 3, 0]))
    del b
    assert got.column(0).to_pylist() == [999, 3, 3, 0]
    assert got.column(1).to_pylist() == [999, 3, 3, 0]
    assert got.slice(1).column(0).to_pylist() == [3, 3, 0]

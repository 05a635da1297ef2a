"""The exchange's receive side with 2 workers, against the reference model: a linear aggregate
whose input is not dealt by its key (it follows a filter, so the driver's placement cannot make
its combiner local) swaps per-key partials by key hash, and each worker merges and sums the
parts it receives (``kernels.merge_sum_runs`` for u64 keys and numpy partials)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dbsp.circuit.errors import RowError
from dbsp.testing import reference as ref
from dbsp.testing.harness import check_steps

T = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("x", pa.int64()),
               pa.field("f", pa.float64())])
AGGS = {"n": ("count", None), "nx": ("count", "x"), "sx": ("sum", "x"), "sf": ("sum", "f"),
        "ax": ("avg", "x")}
SPEC = [("count", None), ("count", 0), ("sum", 0), ("sum", 1), ("avg", 0)]

ROWS = st.tuples(st.integers(0, 40), st.none() | st.integers(-10, 10),
                 st.none() | st.integers(-8, 8).map(lambda v: v / 4))   # exact float sums
STEPS = st.lists(st.dictionaries(ROWS, st.sampled_from([-1, 1, 2]), max_size=30), min_size=1,
                 max_size=4)


def _all_rows(b: pa.RecordBatch) -> pa.Array:
    return pa.array(np.ones(b.num_rows, dtype=bool))


def _run(steps, workers=2):
    check_steps(workers, {"t": T},
                lambda t: t.filter(_all_rows).index_by(["k"]).aggregate(AGGS),
                lambda z: ref.aggregate(z, [0], SPEC), [{"t": s} for s in steps])


@settings(max_examples=25, deadline=None)
@given(STEPS)
@example([{(k, k % 5, k / 4): 1 for k in range(40)},
          {(k, None, None): -1 for k in range(0, 40, 3)}])
def test_combined_partials_match_the_reference(steps):
    _run(steps)


def test_combined_int_sums_past_int64_are_refused_naming_the_key():
    """Two rows of key 7 on two workers (a filter's rows are dealt in contiguous slices): each
    worker's partial fits, their sum does not; the step is refused naming the group."""
    with pytest.raises(RowError, match=r"row \{k=7\}: the sum of 'x' is out of the int64"):
        _run([{(7, 2 ** 62, 0.0): 1, (7, 2 ** 62, 0.25): 1}])


T2 = pa.schema([pa.field("a", pa.int16()), pa.field("d", pa.date32()),
                pa.field("x", pa.int64())])
ROWS2 = st.tuples(st.none() | st.integers(-3, 3), st.none() | st.integers(-2, 2),
                  st.none() | st.integers(-10, 10))
STEPS2 = st.lists(st.dictionaries(ROWS2, st.sampled_from([-1, 1, 2]), max_size=25), min_size=1,
                  max_size=3)


def _run2(steps, runtime="threads"):
    import datetime as dt
    day = dt.date(1970, 1, 1)

    def rows(s):  # the date column as dates (its codes are the day numbers)
        return {(a, None if d is None else day + dt.timedelta(days=d), x): w
                for (a, d, x), w in s.items()}
    check_steps(2, {"t": T2},
                lambda t: t.filter(_all_rows).index_by(["a", "d"]).aggregate(
                    {"n": ("count", None), "sx": ("sum", "x")}),
                lambda z: ref.aggregate(z, [0, 1], [("count", None), ("sum", 0)]),
                [{"t": rows(s)} for s in steps], runtime=runtime)


@settings(max_examples=20, deadline=None)
@given(STEPS2)
@example([{(None, None, 1): 1, (-3, 2, 5): 1, (3, None, None): 2, (None, -2, -4): 1}])
def test_packed_parts_of_nullable_keys_read_back_from_their_codes(steps):
    """A key of a nullable int16 and a nullable date (one u64 code with two validity bytes):
    the parts cross as codes and partials, and each worker reads the key columns back from
    the codes (kernels.decode_u64), nulls included."""
    _run2(steps)


@pytest.mark.slow
def test_packed_parts_cross_processes():
    _run2([{(None, None, 1): 1, (-3, 2, 5): 1, (3, None, None): 2, (1, 1, 1): 1},
           {(None, None, 1): -1, (2, -1, 7): 1}], runtime="processes")

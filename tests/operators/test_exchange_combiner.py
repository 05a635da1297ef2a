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

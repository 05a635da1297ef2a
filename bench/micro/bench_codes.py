# Compare: pytest bench/micro/bench_codes.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Encode 1M keys with ``KeyCodec.encode`` for the column types coded through another one
(:func:`dbsp.algebra.codes.normalize`) beside the plain types they become: float32 beside
float64, dictionary strings beside plain strings, list<int64> and struct<int64, string> (nested
codes, built with numpy) beside a string key of similar width.

Fixed seed. ``extra_info``: ``rows_per_s``.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from dbsp.algebra.codes import KeyCodec

N = 1_000_000
rng = np.random.default_rng(7)
_words = np.array([f"w{i:05d}" for i in range(5000)])


def _columns():
    f64 = rng.normal(size=N)
    strs = pa.array(_words[rng.integers(0, len(_words), N)])
    lens = rng.integers(0, 4, N)
    offs = np.zeros(N + 1, np.int32)
    np.cumsum(lens, out=offs[1:])
    lst = pa.ListArray.from_arrays(pa.array(offs), pa.array(rng.integers(0, 1000, int(offs[-1]))))
    return {
        "float64": pa.array(f64),
        "float32": pa.array(f64.astype(np.float32)),
        "string": strs,
        "dict_string": strs.dictionary_encode(),
        "list_int64": lst,
        "struct": pa.StructArray.from_arrays([pa.array(rng.integers(0, 100, N)), strs],
                                             names=["a", "b"]),
    }


COLS = _columns()


@pytest.mark.parametrize("kind", list(COLS))
def test_encode(benchmark, kind):
    arr = COLS[kind]
    codec = KeyCodec([pa.field("k", arr.type)])
    benchmark.group = "encode 1M keys"
    codes = benchmark.pedantic(codec.encode, args=([arr],), rounds=5, iterations=1)
    assert len(codes) == N
    benchmark.extra_info["rows_per_s"] = N / benchmark.stats.stats.median

"""Nested and dictionary columns in layer files (the ``ipc`` physical kind of
:mod:`dbsp.storage.format`): any row range reads back equal to what was written, nulls at every
level included, on every backend, in blocks cut by their serialised size."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import open_layer

from dbsp.storage import format as F
from dbsp.storage.format import CorruptBlockError
from dbsp.storage.reader import LayerFile
from dbsp.storage.writer import LayerFileWriter, LayerSpec

STRUCT = pa.struct([("a", pa.int32()), ("b", pa.string())])
TYPES = {
    "l": pa.list_(pa.int64()),
    "ll": pa.large_list(pa.list_(pa.string())),
    "fl": pa.list_(pa.float64(), 2),
    "s": STRUCT,
    "m": pa.map_(pa.string(), pa.int64()),
    "d": pa.dictionary(pa.int32(), pa.string()),
    "d8": pa.dictionary(pa.int8(), pa.large_string()),
    "sl": pa.struct([("xs", pa.list_(STRUCT)), ("t", pa.timestamp("us", "UTC"))]),
}


def _value(name: str, i: int):
    if i % 7 == 3:
        return None
    return {
        "l": [i, None, -i] if i % 3 else [],
        "ll": [["x" * (i % 5), None], None] if i % 2 else [[]],
        "fl": [i / 2, None],
        "s": {"a": i if i % 4 else None, "b": f"b{i}" if i % 5 else None},
        "m": [("k", i), ("z" * (i % 9), None)] if i % 2 else [],
        "d": f"v{i % 13}",
        "d8": f"w{i % 3}",
        "sl": {"xs": [{"a": i, "b": None}] * (i % 4), "t": None if i % 6 == 0 else i * 10**6},
    }[name]


def _column(name: str, lo: int, hi: int) -> pa.Array:
    t = TYPES[name]
    vals = [_value(name, i) for i in range(lo, hi)]
    if pa.types.is_dictionary(t):
        return pa.array(vals, t.value_type).dictionary_encode().cast(t)
    return pa.array(vals, t)


N = 6000
SCHEMA = pa.schema([pa.field(n, t) for n, t in TYPES.items()] + [pa.field("v", pa.int64())])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    cols = [_column(n, 0, N) for n in TYPES] + [pa.array(np.arange(N), pa.int64())]
    p = str(tmp_path_factory.mktemp("nested") / "n.layer")
    with LayerFileWriter(p, LayerSpec("u64", SCHEMA), block_size=4096, durable=False) as wr:
        for a in range(0, N, 1700):  # chunks that do not line up with blocks
            wr.append(np.arange(a, min(a + 1700, N), dtype=np.uint64),
                      [c.slice(a, 1700) for c in cols], np.ones(min(1700, N - a), np.int64))
    return p, cols


@pytest.fixture(scope="module", params=["pread", "mmap"])
def lf(request, written):
    yield from open_layer(written[0], request.param)


def test_nested_types_have_the_ipc_layout():
    for n, t in TYPES.items():
        assert F.physical_of(t, n).kind == "ipc"
    assert F.physical_of(pa.int64()).kind == "fixed"
    with pytest.raises(TypeError, match="unsupported Arrow type.*union"):
        F.physical_of(pa.dense_union([pa.field("a", pa.int8())]), "u")


def test_blocks_are_cut_by_size(lf):
    meta = lf.meta["streams"]
    for s in meta:
        if s["role"] == "column" and s["name"] in TYPES:
            assert s["phys"]["kind"] == "ipc"
            assert s["blocks"] > 1, s["name"]          # 6000 rows do not fit one 4 KiB block


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(r=st.tuples(st.integers(0, N), st.integers(0, N)).map(sorted), copy=st.booleans())
def test_any_range_reads_back_exactly(lf, written, r, copy):
    _, cols = written
    i, j = r
    for c, (name, t) in enumerate(TYPES.items()):
        got = lf.column(name, i, j, copy=copy)
        assert got.type == t
        assert got.null_count == cols[c].slice(i, j - i).null_count
        assert got.to_pylist() == cols[c].slice(i, j - i).to_pylist(), name
        ch = lf.column(name, i, j, chunked=True)
        assert ch.type == t and ch.to_pylist() == got.to_pylist()
    assert lf.column("v", i, j).to_pylist() == list(range(i, j))


def test_a_dictionary_block_carries_only_the_values_it_uses(tmp_path):
    big = pa.array([f"value-{i:06d}" for i in range(50_000)])
    d = pa.DictionaryArray.from_arrays(pa.array([7, 7, None, 49_999], pa.int32()), big)
    sch = pa.schema([("d", d.type)])
    p = str(tmp_path / "d.layer")
    with LayerFileWriter(p, LayerSpec("u64", sch), durable=False) as wr:
        wr.append(np.arange(4, dtype=np.uint64), [d], np.ones(4, np.int64))
    with LayerFile(p) as f:
        got = f.column("d", 0, 4)
        assert got.type == d.type and got.to_pylist() == d.to_pylist()
        [st] = [s for s in f.meta["streams"] if s["name"] == "d"]
        assert st["bytes_stored"] <= 8192      # not the 50 000-value dictionary (700 KB)


def test_a_foreign_ipc_payload_is_reported_as_corrupt(tmp_path, monkeypatch):
    from dbsp.storage import writer as W
    p = str(tmp_path / "bad.layer")
    sch = pa.schema([("l", pa.list_(pa.int64()))])
    real = W._StreamWriter._ipc_bytes

    def wrong_rows(self, a):
        return real(self, a.slice(0, max(len(a) - 1, 0)))
    monkeypatch.setattr(W._StreamWriter, "_ipc_bytes", wrong_rows)
    with LayerFileWriter(p, LayerSpec("u64", sch), durable=False) as wr:
        wr.append(np.arange(3, dtype=np.uint64), [pa.array([[1], [2], None], sch.field(0).type)],
                  np.ones(3, np.int64))
    with LayerFile(p) as f, pytest.raises(CorruptBlockError, match="'l'.*expected 3"):
        f.column("l", 0, 3)

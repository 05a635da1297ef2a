"""LayerFileWriter (mirrors ``src/dbsp/storage/writer.py``): what the writer itself promises.

However rows are cut into ``append`` chunks, the file reads back as the rows appended, every
data block stays within ``block_size`` unless a single row is larger, the file appears under its
name only when ``finish`` succeeds (``.mut`` before, nothing after a failure), and every bad
input is refused before anything is written, with a message naming what is wrong. (Round trips
of every column type and backend: ``test_format.py``.)
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dbsp.algebra.codes import VarCodes
from dbsp.storage.reader import LayerFile, read_metadata
from dbsp.storage.writer import LayerFileWriter, LayerSpec

from storage_helpers import backend_or_skip

SCHEMA = pa.schema([("v", pa.int64()), ("s", pa.string())])
U64 = LayerSpec("u64", SCHEMA)


def _rows(n: int, seed: int, null_frac: float = 0.1):
    rng = np.random.default_rng(seed)
    codes = np.sort(rng.integers(0, 1 << 20, n).astype(np.uint64))
    v = pa.array(rng.integers(-1000, 1000, n), pa.int64(), mask=rng.random(n) < null_frac)
    s = pa.array(["ü" * int(k % 3) + "x" * int(k) for k in rng.integers(0, 300, n)], pa.string())
    w = rng.integers(-3, 4, n).astype(np.int64)
    return codes, v, s, w


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 3000), cuts=st.lists(st.integers(0, 3000), max_size=12),
       block=st.sampled_from([4096, 8192]), compression=st.sampled_from([None, "lz4"]),
       seed=st.integers(0, 2**16))
@example(n=1, cuts=[0, 0, 1], block=4096, compression=None, seed=0)
def test_any_chunking_reads_back_the_rows_in_bounded_blocks(tmp_path, n, cuts, block,
                                                           compression, seed):
    codes, v, s, w = _rows(n, seed)
    bounds = [0] + sorted(min(c, n) for c in cuts) + [n]
    p = str(tmp_path / f"c{seed}-{n}-{len(cuts)}.layer")
    with LayerFileWriter(p, U64, block_size=block, compression=compression,
                         durable=False) as wr:
        for a, b in zip(bounds, bounds[1:]):
            wr.append(codes[a:b], [v[a:b], s[a:b]], w[a:b])  # empty chunks are fine
    meta = read_metadata(p)
    assert meta["layers"][0]["rows"] == n
    with LayerFile(p, backend_or_skip("pread")) as f:
        assert np.array_equal(f.codes(0, n), codes)
        assert f.column("v", 0, n).equals(v) and f.column("s", 0, n).equals(s)
        assert np.array_equal(f.weights(0, n), w)
        # every data block stays within block_size (no row here is near it)
        extents = f.extents(0, n)
        assert all(ext <= block for _, ext in extents)
        assert len(extents) == sum(st_["blocks"] for st_ in meta["streams"])
    assert all(stream["rows"] == n for stream in meta["streams"])
    assert max((len(x.encode()) for x in s.to_pylist()), default=0) < block // 4


def test_a_row_larger_than_a_block_gets_a_block_of_its_own(tmp_path):
    big = pa.array([b"a", b"z" * 20_000, b"b"], pa.binary())
    p = str(tmp_path / "big.layer")
    with LayerFileWriter(p, LayerSpec("u64", pa.schema([("b", pa.binary())]), weights=False),
                         block_size=4096, durable=False) as wr:
        wr.append(np.arange(3, dtype=np.uint64), [big])
    with LayerFile(p, backend_or_skip("pread")) as f:
        assert f.column("b", 0, 3).equals(big)
        col_sid = f.layers[0]["columns"][0]
        assert f.streams[col_sid].blocks >= 2


def test_var_codes_in_chunks(tmp_path):
    keys = sorted({bytes([i % 7]) * (i % 5 + 1) + bytes([i]) for i in range(200)})
    p = str(tmp_path / "var.layer")
    with LayerFileWriter(p, LayerSpec("var", None, weights=False), block_size=4096,
                         durable=False) as wr:
        for a in range(0, len(keys), 33):
            wr.append(VarCodes.from_list(keys[a:a + 33]))
    with LayerFile(p, backend_or_skip("pread")) as f:
        assert f.codes(0, len(keys)).to_list() == keys
        assert all(f.may_contain(k) for k in keys)


def test_metadata_and_filter_settings_are_stored(tmp_path):
    codes, v, s, w = _rows(500, 3)
    p = str(tmp_path / "m.layer")
    with LayerFileWriter(p, U64, metadata={"owner": "test", "n": 1}, bloom_fpr=None,
                         durable=False) as wr:
        wr.append(codes, [v, s], w)
    meta = read_metadata(p)
    assert meta["metadata"] == {"owner": "test", "n": 1}
    assert meta["filter"] is None
    with LayerFile(p, backend_or_skip("pread")) as f:
        assert not f.has_filter


@pytest.mark.parametrize("expected_factor", [1, 3, 40])
def test_expected_keys_filter_is_folded_to_the_keys_written(tmp_path, expected_factor):
    """A filter sized for an upper bound is folded at finish: within 2x of the filter built for
    the keys written, and still without false negatives."""
    n = 20_000
    codes = np.arange(n, dtype=np.uint64) * 11
    sizes = {}
    for name, exp in (("exact", None), ("bound", n * expected_factor)):
        p = str(tmp_path / f"{name}.layer")
        with LayerFileWriter(p, LayerSpec("u64", None, weights=False), expected_keys=exp,
                             bloom_fpr=1e-3, durable=False) as wr:
            for a in range(0, n, 4096):
                wr.append(codes[a:a + 4096])
        sizes[name] = read_metadata(p)["filter"]["words"]
        with LayerFile(p, backend_or_skip("pread")) as f:
            assert f.may_contain_many(codes).all()
    assert sizes["exact"] <= sizes["bound"] <= 2 * sizes["exact"]


def test_mut_file_until_finish_and_nothing_after_a_failed_finish(tmp_path):
    p = str(tmp_path / "o.layer")
    spec = [LayerSpec("u64", None, weights=False, offsets=True), LayerSpec("u64", None)]
    wr = LayerFileWriter(p, spec, durable=False)
    wr.append(np.array([1, 2], np.uint64), offsets=np.array([0, 5], np.int64))
    wr.append(np.array([9, 9, 9], np.uint64), weights=np.ones(3, np.int64), layer=1)
    assert os.path.exists(p + ".mut") and not os.path.exists(p)
    with pytest.raises(ValueError, match="layer 0 offsets point past layer 1's 3 rows"):
        wr.finish()
    assert not os.path.exists(p + ".mut") and not os.path.exists(p)


def test_finish_twice_and_append_after_finish_are_refused(tmp_path):
    p = str(tmp_path / "f.layer")
    wr = LayerFileWriter(p, LayerSpec("u64", None, weights=False), durable=False)
    wr.append(np.arange(4, dtype=np.uint64))
    assert wr.finish() == p
    with pytest.raises(ValueError, match="writer already finished"):
        wr.finish()
    with pytest.raises(ValueError, match="writer already finished"):
        wr.append(np.arange(4, 8, dtype=np.uint64))
    assert read_metadata(p)["layers"][0]["rows"] == 4


@pytest.mark.parametrize("kw, exc, msg", [
    ({"block_size": 1000}, ValueError, "block_size must be a multiple of 4096, got 1000"),
    ({"compression": "gzip"}, ValueError, "compression must be None or 'lz4', got 'gzip'"),
    ({"index_fanout": 1}, ValueError, "index_fanout must be at least 2"),
])
def test_bad_writer_settings(tmp_path, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        LayerFileWriter(str(tmp_path / "x.layer"), U64, **kw)
    assert os.listdir(tmp_path) == []


def test_bad_layer_lists(tmp_path):
    with pytest.raises(ValueError, match="code must be 'u64' or 'var', got 'int'"):
        LayerSpec("int")
    with pytest.raises(ValueError, match="a layer file needs at least one layer"):
        LayerFileWriter(str(tmp_path / "x.layer"), [])
    with pytest.raises(ValueError, match="the last layer cannot be ordered"):
        LayerFileWriter(str(tmp_path / "y.layer"), LayerSpec("u64", None, offsets=True))


def _writer(tmp_path, spec):
    return LayerFileWriter(str(tmp_path / "bad.layer"), spec, durable=False)


@pytest.mark.parametrize("call, msg", [
    (lambda w: w.append(np.array([1], np.uint64), None, np.ones(1, np.int64)),
     r"layer 0 has columns \['v', 's'\]; none given"),
    (lambda w: w.append(np.array([1], np.uint64), [pa.array([1])], np.ones(1, np.int64)),
     "layer 0 has 2 columns, got 1"),
    (lambda w: w.append(np.array([1], np.uint64), [pa.array([1]), pa.array(["a"])], None),
     "layer 0 stores weights; none given"),
    (lambda w: w.append(np.array([1, 2], np.uint64), [pa.array([1, 2]), pa.array(["a", "b"])],
                        np.ones(3, np.int64)),
     "weights have 3 rows, codes have 2"),
    (lambda w: w.append(np.array([1], np.uint64), [pa.array([1]), pa.array([2])],
                        np.ones(1, np.int64)),
     "column 's': expected string, got int64"),
])
def test_bad_appends_name_the_problem_and_write_nothing(tmp_path, call, msg):
    wr = _writer(tmp_path, U64)
    wr.append(np.array([0], np.uint64), [pa.array([7]), pa.array(["ok"])], np.ones(1, np.int64))
    with pytest.raises((ValueError, TypeError), match=msg):
        call(wr)
    # the refused chunk left no trace: the writer goes on and the file has the good row only
    wr.append(np.array([5], np.uint64), [pa.array([8]), pa.array(["ok2"])], np.ones(1, np.int64))
    p = wr.finish()
    with LayerFile(p, backend_or_skip("pread")) as f:
        assert f.codes(0, f.n_rows).tolist() == [0, 5]
        assert f.column("v", 0, 2).to_pylist() == [7, 8]


def test_not_nullable_columns_refuse_nulls(tmp_path):
    spec = LayerSpec("u64", pa.schema([pa.field("v", pa.int64(), nullable=False)]), weights=False)
    wr = _writer(tmp_path, spec)
    with pytest.raises(ValueError, match="column 'v' is not nullable but has 1 nulls"):
        wr.append(np.array([1, 2], np.uint64), [pa.array([1, None])])
    wr.abort()
    assert os.listdir(tmp_path) == []


def test_ordered_layers_need_rising_offsets(tmp_path):
    spec = [LayerSpec("u64", None, weights=False, offsets=True), LayerSpec("u64", None)]
    wr = _writer(tmp_path, spec)
    with pytest.raises(ValueError, match="layer 0 is ordered; offsets needed"):
        wr.append(np.array([1], np.uint64))
    with pytest.raises(ValueError, match="offsets have 1 rows, codes have 2"):
        wr.append(np.array([1, 2], np.uint64), offsets=np.array([0], np.int64))
    with pytest.raises(ValueError, match="layer 0 offsets decrease"):
        wr.append(np.array([1, 2], np.uint64), offsets=np.array([3, 1], np.int64))
    wr.append(np.array([1], np.uint64), offsets=np.array([4], np.int64))
    with pytest.raises(ValueError, match="layer 0 offsets decrease"):  # across chunks too
        wr.append(np.array([2], np.uint64), offsets=np.array([3], np.int64))
    with pytest.raises(ValueError, match="layer 1 has no columns"):
        wr.append(np.array([1], np.uint64), [pa.array([1])], np.ones(1, np.int64), layer=1)
    wr.abort()

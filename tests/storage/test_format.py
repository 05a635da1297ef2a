"""Layer files: write/read round trips through every backend, seeks, Bloom filter.

Mirrors ``src/dbsp/storage/{format,writer,reader}.py``."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dbsp.algebra.codes import VarCodes
from dbsp.storage.format import bloom_fpr, bloom_params
from dbsp.storage.reader import LayerFile
from dbsp.storage.writer import LayerFileWriter, LayerSpec

from storage_helpers import ALL_TYPES, BACKENDS, backend_or_skip, make_column

SCHEMA = pa.schema([pa.field(n, t, nullable=True) for n, t in ALL_TYPES])


def write_layer(path, codes, cols=None, weights=None, schema=None, chunk=None, **kw):
    n = len(codes) if isinstance(codes, np.ndarray) else len(codes.offsets) - 1
    code = "u64" if isinstance(codes, np.ndarray) else "var"
    kw.setdefault("durable", False)
    with LayerFileWriter(path, LayerSpec(code, schema, weights is not None), **kw) as w:
        step = chunk or max(n, 1)
        for a in range(0, max(n, 1), step):
            b = min(n, a + step)
            if code == "u64":
                c = codes[a:b]
            else:
                c = VarCodes(codes.offsets[a:b + 1], codes.data)
            w.append(c, [x[a:b] for x in cols] if cols is not None else None,
                     weights[a:b] if weights is not None else None)
    return path


def test_all_types_round_trip(backend, tmp):
    rng = np.random.default_rng(1)
    n = 3000
    codes = np.sort(rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True))
    cols = [make_column(t, n, rng) for _, t in ALL_TYPES]
    w = rng.integers(-5, 5, n).astype(np.int64)
    p = write_layer(os.path.join(tmp, "t.layer"), codes, cols, w, SCHEMA, chunk=777,
                    block_size=4096, index_fanout=4)
    with LayerFile(p, backend) as f:
        assert f.n_rows == n
        assert np.array_equal(f.codes(0, n), codes)
        assert np.array_equal(f.weights(0, n), w)
        for k, (name, t) in enumerate(ALL_TYPES):
            got = f.column(name, 0, n)
            assert got.type == t
            assert got.equals(cols[k]), name
            # ranges that start and stop inside blocks, and empty ones
            for i, j in [(0, 1), (5, 5), (1234, 2999), (n - 1, n), (100, 2100)]:
                assert f.column(k, i, j).equals(cols[k][i:j]), (name, i, j)
                assert f.column(k, i, j, chunked=True).combine_chunks().equals(cols[k][i:j])
        ch = f.read(10, 2000)
        assert np.array_equal(ch.codes, codes[10:2000]) and ch.offsets is None
        assert [c.equals(x[10:2000]) for c, x in zip(ch.columns, cols)] == [True] * len(cols)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(n=st.integers(0, 5000), block=st.sampled_from([4096, 8192, 65536]),
       fan=st.sampled_from([None, 2, 3, 17]), chunk=st.integers(1, 3000),
       null_frac=st.sampled_from([0.0, 0.3, 1.0]), compression=st.sampled_from([None, "lz4"]),
       seed=st.integers(0, 2**32 - 1))
@example(n=1, block=4096, fan=2, chunk=1, null_frac=1.0, compression=None, seed=0)
def test_sizes_cross_block_and_index_boundaries(tmp_path, n, block, fan, chunk, null_frac,
                                                compression, seed):
    rng = np.random.default_rng(seed)
    codes = np.sort(rng.integers(0, 1000, n).astype(np.uint64))
    schema = pa.schema([("v", pa.int64()), ("s", pa.string())])
    cols = [make_column(pa.int64(), n, rng, null_frac), make_column(pa.string(), n, rng, null_frac)]
    w = np.ones(n, dtype=np.int64)
    p = write_layer(str(tmp_path / f"x{seed}.layer"), codes, cols, w, schema, chunk=chunk,
                    block_size=block, index_fanout=fan, compression=compression)
    be = backend_or_skip("uring" if seed % 2 else "pread", slot_size=65536)
    with LayerFile(p, be) as f:
        assert f.n_rows == n
        assert np.array_equal(f.codes(0, n), codes)
        assert f.column(0, 0, n).equals(cols[0]) and f.column(1, 0, n).equals(cols[1])
        if n:
            i = int(rng.integers(0, n))
            j = int(rng.integers(i, n + 1))
            assert np.array_equal(f.codes(i, j), codes[i:j])
            assert f.column("s", i, j).equals(cols[1][i:j])
            for probe in [0, int(codes[i]), int(codes[i]) + 1, 999, 1000, 2**64 - 1]:
                lo = int(rng.integers(0, n + 1))
                assert f.lower_bound(probe) == np.searchsorted(codes, probe)
                assert f.lower_bound(probe, lo, n) == lo + np.searchsorted(codes[lo:], probe)
    be.shutdown()


@pytest.mark.parametrize("kind", BACKENDS)
def test_var_codes_and_ordered_layers(kind, tmp):
    """A two-layer ordered file: keys (var codes, offsets) -> values (u64 codes, weights)."""
    be = backend_or_skip(kind, slot_size=8192)
    rng = np.random.default_rng(7)
    nk = 700
    keys = sorted({bytes(rng.integers(0, 4, int(rng.integers(0, 12)), dtype=np.uint8))
                   for _ in range(nk * 2)})[:nk]
    nk = len(keys)
    kc = VarCodes.from_list(keys)
    per = rng.integers(0, 6, nk)
    offs = np.zeros(nk + 1, dtype=np.int64)
    np.cumsum(per, out=offs[1:])
    nv = int(offs[-1])
    vals = np.concatenate([np.sort(rng.choice(10**6, int(c), replace=False)) for c in per]
                          ).astype(np.uint64)
    w = rng.integers(1, 9, nv).astype(np.int64)
    p = os.path.join(tmp, "o.layer")
    specs = [LayerSpec("var", None, weights=False, offsets=True), LayerSpec("u64", None, True)]
    with LayerFileWriter(p, specs, block_size=4096, index_fanout=3, durable=False) as wr:
        for a in range(0, nk, 100):
            b = min(nk, a + 100)
            wr.append(VarCodes(kc.offsets[a:b + 1], kc.data), offsets=offs[a:b], layer=0)
        for a in range(0, nv, 333):
            wr.append(vals[a:a + 333], weights=w[a:a + 333], layer=1)
    with LayerFile(p, be) as f:
        assert f.n_layers == 2 and f.rows(0) == nk and f.rows(1) == nv
        assert f.codes(0, nk).to_list() == keys
        assert f.codes(17, 401).to_list() == keys[17:401]
        assert np.array_equal(f.offsets(0, nk + 1), offs)
        assert np.array_equal(f.codes(0, nv, layer=1), vals)
        assert np.array_equal(f.weights(0, nv, layer=1), w)
        for probe in [b"", b"\x00", keys[5], keys[5] + b"\x00", keys[-1], keys[-1] + b"\xff",
                      b"\xff" * 20]:
            assert f.lower_bound(probe) == np.searchsorted(np.array(keys, dtype=object), probe)
        # seek inside one key's range of the lower layer (sorted only there)
        for r in range(0, nk, 37):
            lo, hi = int(offs[r]), int(offs[r + 1])
            for probe in [0, int(vals[lo]) if hi > lo else 5, 10**6]:
                exp = lo + int(np.searchsorted(vals[lo:hi], probe))
                assert f.lower_bound(probe, lo, hi, layer=1) == exp
        ch = f.read(3, 50)
        assert np.array_equal(ch.offsets, offs[3:51])
        assert f.may_contain(keys[3]) and f.may_contain_many(kc).all()
    be.shutdown()


def test_oversized_var_rows_and_big_blocks(backend, tmp):
    """Rows larger than a block get a block of their own (bigger than a pool slot)."""
    rng = np.random.default_rng(3)
    n = 40
    lens = rng.integers(0, 50_000, n)
    col = pa.array([bytes(int(k)) + b"z" for k in lens], pa.binary())
    codes = np.arange(n, dtype=np.uint64)
    p = write_layer(os.path.join(tmp, "big.layer"), codes, [col], None,
                    pa.schema([("b", pa.binary())]), chunk=7, block_size=4096)
    with LayerFile(p, backend) as f:
        assert f.column(0, 0, n).equals(col)
        assert f.column(0, 13, 14).equals(col[13:14])


def test_views_are_zero_copy_and_pin(tmp):
    be = backend_or_skip("uring", slot_size=65536, budget=1 << 20)
    n = 50_000
    codes = np.arange(n, dtype=np.uint64)
    p = write_layer(os.path.join(tmp, "z.layer"), codes, None, np.ones(n, np.int64))
    with LayerFile(p, be) as f:
        j = f.boundary(0)
        assert 0 < j < n
        v = f.codes(0, j)
        assert not v.flags.owndata and not v.flags.writeable
        assert be.pool.stats()["pinned"] >= 1
        c = f.read(0, j)
        del v, c
        assert be.pool.stats()["pinned"] == 0
        # spanning blocks gives a copy with the right values
        assert np.array_equal(f.codes(j - 5, j + 5), codes[j - 5:j + 5])
        starts = f.block_starts()
        assert starts[0] == 0 and np.all(np.diff(starts) > 0)
    be.shutdown()


def test_prefetch_then_read(tmp):
    for kind in ["mmap", "pread", "uring"]:
        be = backend_or_skip(kind, slot_size=65536, budget=8 << 20)
        n = 200_000
        codes = np.arange(n, dtype=np.uint64) * 7
        p = write_layer(os.path.join(tmp, f"pf{kind}.layer"), codes, None, np.ones(n, np.int64))
        with LayerFile(p, be) as f:
            f.prefetch(1000, 150_000)
            assert np.array_equal(f.codes(1000, 150_000), codes[1000:150_000])
            assert np.array_equal(f.weights(0, n), np.ones(n, np.int64))
        be.shutdown()


def test_bloom_no_false_negatives_and_fpr(tmp):
    rng = np.random.default_rng(11)
    n = 200_000
    codes = np.unique(rng.integers(0, 2**63, n, dtype=np.uint64))
    p = write_layer(os.path.join(tmp, "bl.layer"), codes, None, None, bloom_fpr=1e-3)
    with LayerFile(p, backend_or_skip("mmap")) as f:
        assert f.may_contain_many(codes).all()
        assert all(f.may_contain(int(c)) for c in codes[:2000])
        probes = rng.integers(2**63, 2**64 - 1, 1_000_000, dtype=np.uint64)
        fpr = f.may_contain_many(probes).mean()
        assert fpr < 2e-3, fpr
    bpk, k = bloom_params(1e-4)
    assert 18 < bpk < 26 and bloom_fpr(bpk, k) <= 1e-4


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=20), max_size=300, unique=True))
def test_bloom_var_codes_no_false_negatives(tmp_path_factory, keys):
    keys = sorted(keys)
    p = str(tmp_path_factory.mktemp("bv") / "b.layer")
    write_layer(p, VarCodes.from_list(keys), None, None)
    with LayerFile(p, backend_or_skip("mmap")) as f:
        assert all(f.may_contain(k) for k in keys)


def test_writer_rejects_bad_input(tmp):
    p = os.path.join(tmp, "bad.layer")
    w = LayerFileWriter(p, LayerSpec("u64", pa.schema([("v", pa.int64())])), durable=False)
    with pytest.raises(ValueError, match="not sorted"):
        w.append(np.array([3, 1], np.uint64), [pa.array([1, 2])], np.ones(2, np.int64))
    with pytest.raises(TypeError, match="column 'v'"):
        w.append(np.array([1, 2], np.uint64), [pa.array(["a", "b"])], np.ones(2, np.int64))
    with pytest.raises(ValueError, match="rows"):
        w.append(np.array([1, 2], np.uint64), [pa.array([1])], np.ones(2, np.int64))
    w.append(np.array([5], np.uint64), [pa.array([1])], np.ones(1, np.int64))
    with pytest.raises(ValueError, match="across chunks"):
        w.append(np.array([4], np.uint64), [pa.array([1])], np.ones(1, np.int64))
    w.abort()
    assert not os.path.exists(p + ".mut") and not os.path.exists(p)
    with pytest.raises(TypeError, match="unsupported"):
        LayerFileWriter(p, LayerSpec("u64", pa.schema([("u", pa.dense_union(
            [pa.field("i", pa.int8())]))])))


def test_mut_file_then_rename(tmp):
    p = os.path.join(tmp, "m.layer")
    w = LayerFileWriter(p, LayerSpec("u64", None, False))
    w.append(np.arange(10, dtype=np.uint64))
    assert os.path.exists(p + ".mut") and not os.path.exists(p)
    w.finish()
    assert os.path.exists(p) and not os.path.exists(p + ".mut")
    with pytest.raises(RuntimeError):
        with LayerFileWriter(p + "2", LayerSpec("u64", None, False)) as w2:
            w2.append(np.arange(10, dtype=np.uint64))
            raise RuntimeError("boom")
    assert not os.path.exists(p + "2.mut") and not os.path.exists(p + "2")


def test_empty_layer(backend, tmp):
    p = write_layer(os.path.join(tmp, "e.layer"), np.empty(0, np.uint64), [pa.array([], pa.int64())],
                    np.empty(0, np.int64), pa.schema([("v", pa.int64())]))
    with LayerFile(p, backend) as f:
        assert f.n_rows == 0
        assert len(f.codes(0, 0)) == 0 and len(f.column(0, 0, 0)) == 0
        assert f.lower_bound(5) == 0
        assert not f.may_contain(5)

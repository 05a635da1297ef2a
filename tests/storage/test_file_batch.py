"""File-backed batches (dbsp.trace.file_batch) against the in-memory batches they were written
from, and streaming merges (dbsp.trace.merge_stream) against the native in-memory merge.

Every probe, selection, cut, piece read and cursor walk must answer identically, for every column
type (strings, decimals, nulls...), sizes that cross data-block and index-block boundaries (4 KiB
blocks, index fan-out down to 2), and every backend available here.
"""
from __future__ import annotations

import gc
import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra.codes import VarCodes
from dbsp.storage.backend import available_backends
from dbsp.storage.config import StorageConfig
from dbsp.trace.spill import SpineStorage
from dbsp.trace.batch import OrdIndexedZSet, OrdZSet, ZSet
from dbsp.trace.spine_cursor import SpineCursor
from dbsp.trace.file_batch import FileBatchCursor, open_batch, write_batch
from dbsp.trace.merge_stream import merge_stream, sum_batches
from storage_helpers import ALL_TYPES, make_column

BACKENDS = ["mmap", "pread", "uring"]
TYPES = dict(ALL_TYPES)
HC = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]


def make_storage(root, backend: str, block_size: int = 4096, index_fanout=None,
                 **kw) -> SpineStorage:
    why = available_backends()[backend]
    if why:
        pytest.skip(f"{backend} backend unavailable: {why}")
    cfg = StorageConfig(str(root), memory_budget_bytes=64 << 20, backend=backend,
                        block_size=block_size, cache_bytes=4 << 20, index_fanout=index_fanout,
                        min_free_bytes=0, **kw)
    return SpineStorage(cfg, 0)


# --- data ---------------------------------------------------------------------------------------

def random_table(rng, n: int, types: list, per_key: int, null_frac: float,
                 prefix: str) -> dict:
    """Columns of ``types``; the first ``len(types)`` draw from a pool of about
    ``n / per_key`` values, so keys repeat."""
    cols = {}
    pool_n = max(1, n // max(per_key, 1))
    for i, name in enumerate(types):
        t = TYPES[name]
        pool = make_column(t, pool_n, rng, null_frac)
        cols[f"{prefix}{i}_{name}"] = pool.take(pa.array(rng.integers(0, pool_n, n)))
    return cols


def build(seed: int, n: int, key_types: list, val_types: list, per_key: int,
          null_frac: float, indexed: bool):
    rng = np.random.default_rng(seed)
    cols = random_table(rng, n, key_types, per_key, null_frac, "k")
    cols.update(random_table(rng, n, val_types, 1, null_frac, "v"))
    if not cols:
        cols = {"k0": pa.array(rng.integers(0, 5, n))}
    t = pa.record_batch(cols)
    w = rng.choice(np.array([-2, -1, 1, 2, 3], dtype=np.int64), n)
    z = ZSet(t, w)
    if indexed:
        return OrdIndexedZSet.from_loose(z, [c for c in cols if c.startswith("k")])
    return OrdZSet.from_loose(z)


def codes_list(c) -> list:
    return c.tolist() if isinstance(c, np.ndarray) else c.to_list()


def sorted_codes(rows: list, like) -> object:
    rows = sorted(set(rows))
    if isinstance(like, np.ndarray):
        return np.asarray(rows, dtype=np.uint64)
    return VarCodes.from_list(rows)


def key_codes(b):
    return b.kcodes if b.indexed else b.codes


def assert_same(a, b) -> None:
    """Two in-memory batches hold the same arrays."""
    assert a.indexed == b.indexed
    assert len(a) == len(b) and a.num_keys == b.num_keys
    if a.indexed:
        assert codes_list(a.kcodes) == codes_list(b.kcodes)
        assert a.offsets.tolist() == b.offsets.tolist()
        assert codes_list(a.vcodes) == codes_list(b.vcodes)
        assert a.weights.tolist() == b.weights.tolist()
        assert a.keys.equals(b.keys) and a.vals.equals(b.vals)
    else:
        assert codes_list(a.codes) == codes_list(b.codes)
        assert a.weights.tolist() == b.weights.tolist()
        assert a.data.equals(b.data)


def probe_set(m, other, rng):
    """Sorted distinct codes: some keys of ``m`` and some keys of another batch."""
    kc = key_codes(m)
    rows = codes_list(kc)
    pick = [rows[i] for i in rng.integers(0, len(rows), min(len(rows), 40))] if rows else []
    pick += codes_list(key_codes(other))[:40]
    if isinstance(kc, np.ndarray):
        pick += [0, 2 ** 64 - 1]
    else:
        pick += [b"", b"\xff" * 9]
    return sorted_codes(pick, kc)


def observe(c, indexed: bool) -> tuple:
    if not c.key_valid():
        return (False,)
    obs = [True, c.key_code(), c.key(), c.val_valid()]
    if c.val_valid():
        obs += [c.val(), c.weight()]
        if indexed:
            obs.append(c.val_code())
    return tuple(obs)


# --- the main property ----------------------------------------------------------------------------

TYPE_NAMES = [n for n, _ in ALL_TYPES]


@st.composite
def batch_args(draw):
    indexed = draw(st.booleans())
    key_types = draw(st.lists(st.sampled_from(TYPE_NAMES), min_size=1, max_size=2))
    val_types = draw(st.lists(st.sampled_from(TYPE_NAMES), min_size=0, max_size=3))
    n = draw(st.sampled_from([0, 1, 7, 300, 1500, 4000]))
    per_key = draw(st.sampled_from([1, 3, 40]))
    null_frac = draw(st.sampled_from([0.0, 0.3]))
    return dict(seed=draw(st.integers(0, 2 ** 32 - 1)), n=n, key_types=key_types,
                val_types=val_types, per_key=per_key, null_frac=null_frac, indexed=indexed)


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=30, deadline=None, suppress_health_check=HC)
@given(args=batch_args(), block=st.sampled_from([4096, 8192]),
       fanout=st.sampled_from([None, 2, 3]), data=st.data())
def test_file_batch_answers_like_memory(tmp_path_factory, backend, args, block, fanout, data):
    st_ = make_storage(tmp_path_factory.mktemp("fb"), backend, block, fanout)
    m = build(**args)
    f = write_batch(st_, m, "test")
    if len(m) == 0:
        assert f is None
        return
    rng = np.random.default_rng(args["seed"] + 1)
    assert f.is_file and f.indexed == m.indexed
    assert len(f) == len(m) and f.num_keys == m.num_keys
    assert_same(f.to_memory(), m)

    # probes (after a prefetch, as Spine.lookup does), selections, weights
    other = build(**{**args, "seed": args["seed"] ^ 0x5A5A, "n": 50})
    probe = probe_set(m, other, rng)
    f.prefetch_keys(probe)
    pm, km = m.probe_keys(probe)
    pf, kf = f.probe_keys(probe)
    assert pm.tolist() == pf.tolist() and km.tolist() == kf.tolist()
    mm, mf = m.match(probe), f.match(probe)
    assert (mm is None) == (mf is None)
    if mm is not None:
        assert mm[1].tolist() == mf[1].tolist()
        assert_same(mm[0].select_keys(mm[2]), mf[0].select_keys(mf[2]))
        assert_same(m.select_keys(km), f.select_keys(kf))
    if not m.indexed:
        assert m.row_weights(probe).tolist() == f.row_weights(probe).tolist()

    # a key bound: a narrower view that still answers like the in-memory cut
    kc = codes_list(key_codes(m))
    bound = kc[int(rng.integers(0, len(kc)))] if data.draw(st.booleans()) else \
        codes_list(key_codes(other))[0] if len(other) else kc[0]
    cm, cf = m.cut_below(bound), f.cut_below(bound)
    assert len(cm) == len(cf)
    if len(cm):
        assert_same(cf.to_memory(), cm)
        pm, km = cm.probe_keys(probe)
        pf, kf = cf.probe_keys(probe)
        assert pm.tolist() == pf.tolist() and km.tolist() == kf.tolist()

    # pieces (may split a key's values) add up to the batch
    rows = data.draw(st.sampled_from([1, 5, 64, 5000]))
    pieces = list(f.iter_pieces(rows))
    assert all(0 < len(p) <= rows for p in pieces)
    assert_same(sum_batches(pieces), m)

    # a scripted cursor walk with seeks, on a small window so it crosses windows
    window = data.draw(st.sampled_from([1, 3, 17, 1000]))
    c1, c2 = m.cursor(), FileBatchCursor(f, window_rows=window)
    ops = data.draw(st.lists(st.sampled_from(
        ["step_key", "step_key", "step_val", "seek_key", "seek_val", "rewind_vals",
         "rewind_keys"]), max_size=40))
    for op in ops:
        if op in ("seek_key", "seek_val"):
            target = kc[int(rng.integers(0, len(kc)))]
            if op == "seek_key":
                c1.seek_key_code(target)
                c2.seek_key_code(target)
            elif m.indexed and c1.key_valid():
                vc = codes_list(m.vcodes)
                v = vc[int(rng.integers(0, len(vc)))]
                c1.seek_val_code(v)
                c2.seek_val_code(v)
        else:
            getattr(c1, op)()
            getattr(c2, op)()
        assert observe(c1, m.indexed) == observe(c2, m.indexed), op
    c1.rewind_keys()
    c2.rewind_keys()
    n = 0
    while c1.key_valid():
        assert observe(c1, m.indexed) == observe(c2, m.indexed)
        if m.indexed:
            assert c1.val_range()[1] - c1.val_range()[0] == \
                c2.val_range()[1] - c2.val_range()[0]
        c1.step_key()
        c2.step_key()
        n += 1
    assert not c2.key_valid() and n == m.num_keys

    # key ranges
    lo, hi = sorted([kc[int(rng.integers(0, len(kc)))] for _ in range(2)])
    assert_same(m.cursor().keys_between(lo, hi), f.cursor().keys_between(lo, hi))


@pytest.mark.parametrize("backend", BACKENDS)
def test_spine_cursor_over_file_and_memory_batches(tmp_path, backend):
    """The merging cursor of a spine snapshot walks file and memory batches together."""
    st_ = make_storage(tmp_path, backend)
    parts = [build(s, 800, ["i64"], ["s"], 3, 0.2, True) for s in range(4)]
    mixed = [write_batch(st_, p) if i % 2 else p for i, p in enumerate(parts)]
    c1, c2 = SpineCursor(parts), SpineCursor(mixed)
    while c1.key_valid():
        assert c2.key_valid() and c1.key() == c2.key()
        while c1.val_valid():
            assert c2.val_valid() and (c1.val(), c1.weight()) == (c2.val(), c2.weight())
            c1.step_val()
            c2.step_val()
        assert not c2.val_valid()
        c1.step_key()
        c2.step_key()
    assert not c2.key_valid()


# --- streaming merges --------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=HC)
@given(args=batch_args(), k=st.integers(1, 5), chunk=st.sampled_from([1, 2, 7, 100, 10_000]),
       files=st.lists(st.booleans(), min_size=5, max_size=5), to_file=st.booleans(),
       cut=st.booleans(), keep=st.booleans())
def test_streaming_merge_equals_native_merge(tmp_path_factory, args, k, chunk, files, to_file,
                                             cut, keep):
    st_ = make_storage(tmp_path_factory.mktemp("ms"), "pread", merge_chunk_rows=chunk)
    parts = [build(**{**args, "seed": args["seed"] + i, "n": max(args["n"] // k, 1)})
             for i in range(k)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return
    # retractions that cancel rows of another part
    parts.append(parts[0].neg())
    inputs = [write_batch(st_, p) if files[i % 5] else p for i, p in enumerate(parts)]
    bound = None
    if cut:
        kc = codes_list(key_codes(parts[0]))
        bound = kc[len(kc) // 2]
    flt = None
    if keep:
        def flt(b):
            return b.weights % 2 == 0
    want = sum_batches([p.cut_below(bound) if bound is not None else p for p in parts])
    if flt is not None and len(want):
        want = want.filter_rows(flt(want))
    got = merge_stream(inputs, st_, bound=bound, keep=flt, to_file=to_file)
    if len(want) == 0:
        assert got is None
        return
    assert got.is_file == to_file
    assert_same(got.to_memory(), want)


# --- lifetime -----------------------------------------------------------------------------------------

def test_file_is_deleted_with_its_last_batch_unless_pinned(tmp_path):
    st_ = make_storage(tmp_path, "pread")
    m = build(3, 2000, ["i64"], ["s"], 4, 0.1, True)
    f = write_batch(st_, m)
    path = f.path
    view = f.cut_below(codes_list(m.kcodes)[10])
    del f
    gc.collect()
    assert os.path.exists(path)  # the narrower view still refers to the file
    del view
    gc.collect()
    assert not os.path.exists(path)
    f = write_batch(st_, m)
    path = f.path
    f.file.pin()
    del f
    gc.collect()
    assert os.path.exists(path)  # a checkpoint would hold it
    g = open_batch(path)
    assert_same(g.to_memory(), m)


def test_temporaries_are_removed_on_open(tmp_path):
    d = tmp_path / "worker-0"
    d.mkdir()
    (d / "b-dead.dbsp.mut").write_bytes(b"partial")
    (d / "keep.dbsp").write_bytes(b"x")
    st_ = make_storage(tmp_path, "pread")
    assert st_.removed_temporaries == 1
    assert sorted(os.listdir(d)) == ["keep.dbsp"]


def test_empty_value_columns_and_version_codes(tmp_path):
    """Value codes that do not follow their codec (aggregate state: version numbers under an
    empty codec) and batches without value columns survive the round trip."""
    st_ = make_storage(tmp_path, "pread")
    m = build(5, 500, ["s"], [], 2, 0.0, True)
    assert_same(write_batch(st_, m).to_memory(), m)
    from dbsp.algebra.codes import KeyCodec
    keys = pa.record_batch({"k": pa.array(np.arange(100))})
    vals = pa.record_batch({"x": pa.array(np.arange(100) * 2.5)})
    v = OrdIndexedZSet(keys, K.take(KeyCodec(list(keys.schema)).encode(keys.columns), np.arange(100)),
                       np.arange(101, dtype=np.int64), vals, np.arange(100, 200, dtype=np.uint64),
                       np.ones(100, np.int64), KeyCodec(list(keys.schema)), KeyCodec([]))
    f = write_batch(st_, v)
    assert f.max_val_code() == 199
    assert_same(f.to_memory(), v)


def test_merge_output_filter_is_sized_for_its_keys(tmp_path):
    """A k-way merge sizes its output's Bloom filter for the sum of its inputs' keys (an upper
    bound); the writer folds it down to the keys written, so inputs sharing their keys (a trace
    indexed by a small key) do not leave a k-times-too-big filter resident."""
    st_ = make_storage(tmp_path, "pread", merge_chunk_rows=1000)
    parts = [OrdIndexedZSet.from_loose(ZSet(pa.record_batch({
        "k": pa.array(np.arange(2000).repeat(10)), "v": pa.array(np.arange(20_000) + 10**6 * s)}),
        np.ones(20_000, np.int64)), ["k"]) for s in range(8)]
    files = [write_batch(st_, p) for p in parts]
    out = merge_stream(files, st_, to_file=True)
    assert out.num_keys == 2000
    one = files[0].lf._words.nbytes
    assert out.lf._words.nbytes <= 2 * one  # not 8x
    kc = parts[0].kcodes
    assert out.lf.may_contain_many(kc).all()  # folding loses no key

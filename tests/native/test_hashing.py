"""dbsp._native.hashing against kernels_ref: hash64 and shard, bit-exact, u64 and var codes."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from dbsp._native import hashing as native
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import kernels_ref as ref
from dbsp.algebra.codes import VarCodes

from ._strategies import u64_codes, var_codes

SEEDS = st.integers(-2 ** 63, 2 ** 64 - 1) | st.sampled_from([0, 1, -1, 2 ** 64 - 1])
NSHARDS = st.integers(1, 2 ** 64 - 1) | st.integers(1, 64) | st.sampled_from(
    [1, 2, 3, 7, 8, 2 ** 32, 2 ** 63 + 1])


def same(a, b):
    assert a.dtype == b.dtype
    np.testing.assert_array_equal(a, b)


@given(u64_codes() | var_codes(), SEEDS)
@example(VarCodes.from_list([b"", b"\x00", b"\x00\x00"]), 0)
@example(np.array([0, 2 ** 64 - 1], np.uint64), 2 ** 64 - 1)
def test_hash64(codes, seed):
    same(native.hash64(codes, seed), ref.hash64(codes, seed))


@given(u64_codes() | var_codes(), NSHARDS, SEEDS)
@example(np.arange(1000, dtype=np.uint64), 3, 0)
@example(np.arange(1000, dtype=np.uint64), 2 ** 64 - 1, 5)
def test_shard(codes, nshards, seed):
    same(native.shard(codes, nshards, seed), ref.shard(codes, nshards, seed))


def test_default_seed_and_long_inputs():
    """Long enough for the vectorized u64 loop and the blocked modulo (several blocks + a tail)."""
    rng = np.random.default_rng(5)
    k = rng.integers(0, 2 ** 64 - 1, 10_007, dtype=np.uint64, endpoint=True)
    same(native.hash64(k), ref.hash64(k))
    same(native.shard(k, 13), ref.shard(k, 13))
    same(native.shard(k, 16, seed=9), ref.shard(k, 16, seed=9))


def test_shard_rejects_no_shards():
    with pytest.raises(ValueError):
        native.shard(np.zeros(1, np.uint64), 0)


OWNER_MAPS = st.integers(0, 6).flatmap(
    lambda bits: st.integers(1, 5).flatmap(
        lambda workers: st.tuples(
            st.just(bits), st.just(workers),
            st.lists(st.integers(0, workers - 1), min_size=1 << bits, max_size=1 << bits))))


@given(u64_codes() | var_codes(), OWNER_MAPS)
@example(np.arange(5000, dtype=np.uint64), (5, 3, [w % 3 for w in range(32)]))
@example(np.zeros(0, np.uint64), (0, 2, [1]))
def test_owner_rows(codes, owner_map):
    bits, workers, owners = owner_map
    owners = np.array(owners, np.int32)
    order, bounds = native.owner_rows(codes, owners, bits, workers)
    r_order, r_bounds = ref.owner_rows(codes, owners, bits, workers)
    same(order, r_order)
    same(bounds, r_bounds)


def test_owner_rows_refuses_bad_maps():
    k = np.arange(10, dtype=np.uint64)
    for kern in (native.owner_rows, ref.owner_rows):
        with pytest.raises(ValueError):
            kern(k, np.zeros(3, np.int32), 2, 2)   # 3 owners for 4 shards
        with pytest.raises(ValueError):
            kern(k, np.array([0, 5], np.int32), 1, 2)  # owner 5 of 2 workers
        with pytest.raises(ValueError, match="owner -1 of shard 3"):  # no row needs shard 3
            kern(np.zeros(0, np.uint64), np.array([0, 1, 0, -1], np.int32), 2, 2)


@pytest.mark.parametrize("workers", [2, 3, 300])
def test_owner_rows_long_inputs(workers):
    """Past NOGIL_MIN rows (the GIL released), several hash blocks and a tail; two workers take
    the branch-free scatter, more than 255 the int32 worker numbers."""
    rng = np.random.default_rng(workers)
    k = rng.integers(0, 2 ** 64 - 1, 40_003, dtype=np.uint64, endpoint=True)
    owners = rng.integers(0, workers, 1 << 10).astype(np.int32)
    order, bounds = native.owner_rows(k, owners, 10, workers)
    dest = owners[ref.hash64(k) >> np.uint64(54)]
    same(order, np.argsort(dest, kind="stable").astype(np.int64))
    same(bounds, np.concatenate([[0], np.cumsum(np.bincount(dest, minlength=workers))]))


@given(u64_codes() | var_codes(), OWNER_MAPS, st.data())
def test_owner_key_rows(codes, owner_map, data):
    """Each worker's keys, the value rows that go with them and their offsets: as the
    reference twin gives them, and as selecting each worker's keys from the offsets does."""
    nk = len(codes)
    counts = data.draw(st.lists(st.integers(0, 4), min_size=nk, max_size=nk))
    _check_owner_key_rows(codes, owner_map, np.array(counts, np.int64))


@pytest.mark.parametrize("workers", [2, 3])
def test_owner_key_rows_long_inputs(workers):
    rng = np.random.default_rng(workers)
    k = np.unique(rng.integers(0, 2 ** 64 - 1, 5_000, dtype=np.uint64, endpoint=True))
    _check_owner_key_rows(k, (4, workers, [w % workers for w in range(16)]),
                          rng.integers(0, 3, len(k)).astype(np.int64))


def _check_owner_key_rows(codes, owner_map, counts):
    bits, workers, owners = owner_map
    owners = np.array(owners, np.int32)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n = int(offsets[-1])
    vcodes = np.arange(n, dtype=np.uint64) * np.uint64(7919)
    weights = np.arange(n, dtype=np.int64) - 3
    got = native.owner_key_rows(codes, offsets, owners, bits, workers, vcodes, weights)
    want = ref.owner_key_rows(codes, offsets, owners, bits, workers, vcodes, weights)
    for a, b in zip(got, want):
        same(a, b)
    korder, kb, rorder, rb, offs, vout, wout = got
    same(vout, vcodes[rorder])
    same(wout, weights[rorder])
    var = VarCodes.from_list([b"x"] * n)  # (not u64: no value codes gathered)
    plain = native.owner_key_rows(codes, offsets, owners, bits, workers, var, weights)
    assert plain[5] is None
    for a, b in zip(plain[:5] + plain[6:], got[:5] + got[6:]):
        same(a, b)
    k_only, kb_only = native.owner_rows(codes, owners, bits, workers)
    same(korder, k_only)
    same(kb, kb_only)
    for w in range(workers):
        keys = korder[kb[w]:kb[w + 1]]
        rows = [r for g in keys for r in range(offsets[g], offsets[g + 1])]
        same(rorder[rb[w]:rb[w + 1]], np.array(rows, np.int64))
        same(offs[kb[w] + w:kb[w + 1] + w + 1],
             np.concatenate([[0], np.cumsum(counts[keys])]).astype(np.int64))


def test_owner_key_rows_refuses_bad_offsets():
    k = np.arange(3, dtype=np.uint64)
    own = np.array([0, 1], np.int32)
    w3 = np.ones(3, np.int64)
    for kern in (native.owner_key_rows, ref.owner_key_rows):
        with pytest.raises(ValueError, match="offsets"):
            kern(k, np.array([0, 1, 2], np.int64), own, 1, 2, None, w3)  # one short
        with pytest.raises(ValueError, match="offsets"):
            kern(k, np.array([0, 2, 1, 3], np.int64), own, 1, 2, None, w3)  # falls
        with pytest.raises(ValueError, match="offsets"):
            kern(k, np.array([1, 2, 3, 4], np.int64), own, 1, 2, None, w3)  # not from 0
        with pytest.raises(ValueError, match="value codes"):
            kern(k, np.array([0, 1, 2, 3], np.int64), own, 1, 2, np.zeros(2, np.uint64), w3)
        with pytest.raises(ValueError, match="weights"):
            kern(k, np.array([0, 1, 2, 3], np.int64), own, 1, 2, None, np.zeros(4, np.int64))


@st.composite
def _sum_runs(draw):
    """W runs of ascending distinct u64 codes drawn from a small pool (so runs share keys), an
    int64 and a float64 partial column each; int values near the int64 bounds now and then."""
    W = draw(st.integers(1, 4))
    pool = draw(st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=12, unique=True))
    big = st.sampled_from([2 ** 63 - 1, -2 ** 63, 2 ** 62, -2 ** 62])
    kruns, ints, floats = [], [], []
    for _ in range(W):
        ks = sorted(draw(st.lists(st.sampled_from(pool), max_size=len(pool), unique=True)))
        kruns.append(np.array(ks, np.uint64))
        ints.append(np.array(draw(st.lists(st.integers(-5, 5) | big, min_size=len(ks),
                                           max_size=len(ks))), np.int64))
        floats.append(np.array(draw(st.lists(st.floats(-1e6, 1e6), min_size=len(ks),
                                             max_size=len(ks))), np.float64))
    return kruns, ints, floats


@given(_sum_runs())
@example(([np.array([1, 5], np.uint64), np.array([5], np.uint64)],
          [np.array([2 ** 63 - 1, 1], np.int64), np.array([1], np.int64)],
          [np.array([0.5, 1.0], np.float64), np.array([2.0], np.float64)]))
@example(([np.array([3], np.uint64)] * 3,
          [np.array([2 ** 63 - 1], np.int64), np.array([1], np.int64),
           np.array([-1], np.int64)],   # a partial sum wraps, the exact sum fits
          [np.zeros(1)] * 3))
def test_merge_sum_runs(runs):
    kruns, ints, floats = runs
    got = native.merge_sum_runs(kruns, [ints, floats], [True, False])
    want = ref.merge_sum_runs(kruns, [ints, floats], [True, False])
    same(got[0], want[0])
    same(got[1], want[1])
    same(got[2][0], want[2][0])
    same(got[2][1], want[2][1])
    if want[3] is None:
        assert got[3] is None
    else:
        same(got[3], want[3])


def test_merge_sum_runs_refuses_bad_runs():
    for kern in (native.merge_sum_runs,):
        with pytest.raises(ValueError, match="not ascending"):
            kern([np.array([2, 1], np.uint64)], [[np.zeros(2, np.int64)]], [True])
        with pytest.raises(ValueError, match="column 0 of run 0"):
            kern([np.array([1, 2], np.uint64)], [[np.zeros(3, np.int64)]], [True])


@st.composite
def _key_runs(draw):
    """W non-decreasing runs of u64 codes (a key's rows together), disjoint or not."""
    W = draw(st.integers(1, 4))
    pool = draw(st.lists(st.integers(0, 2 ** 64 - 1), min_size=1, max_size=10, unique=True))
    disjoint = draw(st.booleans())
    runs = []
    for w in range(W):
        mine = [k for i, k in enumerate(pool) if not disjoint or i % W == w]
        ks = sorted(draw(st.lists(st.sampled_from(mine), max_size=8)) if mine else [])
        runs.append(np.array(ks, np.uint64))
    return runs


@given(_key_runs())
@example([np.array([1, 1, 4], np.uint64), np.array([2, 3, 3], np.uint64)])
@example([np.array([1, 5], np.uint64), np.array([2], np.uint64), np.array([5], np.uint64)])
@example([np.zeros(0, np.uint64), np.array([7, 7], np.uint64)])
@example([np.array([1, 4, 4], np.uint64), np.array([2, 4], np.uint64)])  # two runs share 4
def test_merge_disjoint_runs(runs):
    got, want = native.merge_disjoint_runs(runs), ref.merge_disjoint_runs(runs)
    if want is None:
        assert got is None
    else:
        same(got, want)


def test_merge_disjoint_runs_refuses_an_unsorted_run():
    for kern in (native.merge_disjoint_runs, ref.merge_disjoint_runs):
        with pytest.raises(ValueError, match="not ascending"):
            kern([np.array([3, 1], np.uint64)])


_DEALT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
                pa.uint32(), pa.uint64(), pa.float32(), pa.float64(), pa.date32(), pa.date64(),
                pa.time32("ms"), pa.time64("ns"), pa.timestamp("us"), pa.timestamp("s", "UTC"),
                pa.duration("ms")]


@st.composite
def _dealt_batches(draw):
    """(batch, codes, weights): a batch of 1..4 columns (fixed-width, now and then one with a
    null, a string or a bool column, which the kernel leaves to its caller), sliced now and
    then (a non-zero Arrow offset), with a u64 or var code and a weight per row."""
    n = draw(st.integers(0, 80))
    lead = draw(st.integers(0, 3))
    types = draw(st.lists(st.sampled_from(_DEALT_TYPES), min_size=1, max_size=4))
    cols = []
    for t in types:
        width = t.bit_width // 8
        hi = 2 ** (8 * min(width, 4)) - 1
        vals = draw(st.lists(st.integers(0, hi), min_size=n + lead, max_size=n + lead))
        cols.append(pa.array(np.array(vals, np.float64), t) if pa.types.is_floating(t)
                    else pa.array(np.array(vals, np.int64).astype(f"u{width}")).view(t))
    odd = draw(st.sampled_from(["none", "none", "null", "string", "bool"]))
    if odd == "null" and n + lead:
        cols.append(pa.array([None] + list(range(n + lead - 1)), pa.int64()))
    elif odd == "string":
        cols.append(pa.array([str(i) for i in range(n + lead)]))
    elif odd == "bool":
        cols.append(pa.array([i % 2 == 0 for i in range(n + lead)]))
    batch = pa.record_batch(cols, names=[f"c{i}" for i in range(len(cols))]).slice(lead)
    codes = draw(u64_codes(min_size=n, max_size=n) | var_codes(min_size=n, max_size=n))
    weights = np.array(draw(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), min_size=n,
                                     max_size=n)), np.int64)
    return batch, codes, weights


@given(_dealt_batches(), OWNER_MAPS)
def test_deal_batch(dealt, owner_map):
    """Native against the reference: the same rows and weights to the same workers in the
    same order (each worker's rows as owner_rows orders them), None for the same batches."""
    batch, codes, weights = dealt
    bits, workers, owners = owner_map
    owners = np.array(owners, np.int32)
    got = native.deal_batch(batch, codes, weights, owners, bits, workers)
    want = ref.deal_batch(batch, codes, weights, owners, bits, workers)
    assert (got is None) == (want is None)
    if got is None:
        return
    order, bounds = native.owner_rows(codes, owners, bits, workers)
    for w, (g, r) in enumerate(zip(got, want)):
        assert (g is None) == (r is None) == (bounds[w] == bounds[w + 1])
        if g is not None:
            assert g[0].schema == batch.schema and g[0].equals(r[0])
            same(g[1], r[1])
            assert g[0].equals(batch.take(pa.array(order[bounds[w]:bounds[w + 1]])))


@pytest.mark.parametrize("workers", [2, 3, 300])
def test_deal_batch_long_inputs(workers):
    """Past NOGIL_MIN rows (the GIL released): the branch-free two-worker copy and the general
    one (int32 worker numbers past 255 workers), every column width."""
    rng = np.random.default_rng(workers)
    n = 40_003
    k = rng.integers(0, 2 ** 64 - 1, n, dtype=np.uint64, endpoint=True)
    owners = rng.integers(0, workers, 1 << 10).astype(np.int32)
    batch = pa.record_batch([rng.integers(-9, 9, n + 1).astype(t)
                             for t in (np.int8, np.int16, np.int32, np.int64)],
                            names=["a", "b", "c", "d"]).slice(1)
    weights = rng.integers(-5, 5, n)
    got = native.deal_batch(batch, k, weights, owners, 10, workers)
    order, bounds = native.owner_rows(k, owners, 10, workers)
    for w in range(workers):
        idx = order[bounds[w]:bounds[w + 1]]
        if not len(idx):
            assert got[w] is None
            continue
        assert got[w][0].equals(batch.take(pa.array(idx)))
        same(got[w][1], weights[idx])


def test_deal_batch_refuses_bad_input():
    b = pa.record_batch([pa.array([1, 2, 3])], names=["a"])
    k = np.arange(3, dtype=np.uint64)
    for kern in (native.deal_batch, ref.deal_batch):
        with pytest.raises(ValueError):
            kern(b, k, np.ones(2, np.int64), np.zeros(2, np.int32), 1, 1)  # 2 weights, 3 rows
        with pytest.raises(ValueError):
            kern(b, k, np.ones(3, np.int64), np.array([0, 5], np.int32), 1, 2)  # owner 5


_KEY_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(),
              pa.uint64(), pa.date32(), pa.timestamp("us"), pa.duration("s")]


def _plan_of(t: pa.DataType, nullable: bool) -> tuple:
    """``KeyCodec._native_plan``'s entry of a key column of type ``t``."""
    return (t.bit_width // 8, pa.types.is_signed_integer(t) or not pa.types.is_integer(t),
            nullable)


@st.composite
def _disjoint_parts(draw):
    """(batches, weights, schema, plan): W parts of 0..30 rows of the same columns: a key of
    one or two integer / temporal columns (codes within 64 bits), sorted by its code, then
    fixed-width values (now and then a null or a string column, which the kernel leaves to its
    caller); the parts' keys are disjoint, or share a key now and then."""
    W = draw(st.integers(1, 4))
    ktypes = draw(st.lists(st.sampled_from(_KEY_TYPES), min_size=1, max_size=2))
    nullable = [draw(st.booleans()) for _ in ktypes]
    if sum(t.bit_width // 8 + n for t, n in zip(ktypes, nullable)) > 8:
        ktypes, nullable = ktypes[:1], [False]
    vtypes = draw(st.lists(st.sampled_from(_DEALT_TYPES), max_size=2))
    odd = draw(st.sampled_from(["none", "none", "none", "null", "string"]))
    plan = [_plan_of(t, n) for t, n in zip(ktypes, nullable)]
    fields = [pa.field(f"k{i}", t, nullable=n) for i, (t, n) in enumerate(zip(ktypes, nullable))]

    def values(t, m):
        width = t.bit_width // 8
        v = np.array(draw(st.lists(st.integers(0, 2 ** (8 * min(width, 4)) - 1), min_size=m,
                                   max_size=m)), np.int64)
        return pa.array(v.astype(np.float64), t) if pa.types.is_floating(t) \
            else pa.array(v.astype(f"u{width}")).view(t)

    pool = pa.table([values(t, 40) for t in ktypes], names=[f.name for f in fields])
    _, first = np.unique(ref._plan_codes([c.combine_chunks() for c in pool.columns], plan),
                         return_index=True)
    distinct = first.tolist()   # pool rows of distinct keys
    mine = [distinct[w::W] for w in range(W)]
    if draw(st.booleans()) and W > 1 and mine[0]:
        mine[1] = mine[1] + mine[0][:1]      # a key in two parts
    batches, weights = [], []
    for w in range(W):
        rows = [draw(st.sampled_from(mine[w])) for _ in range(draw(st.integers(0, 30)))] \
            if mine[w] else []
        n = len(rows)
        keys = pool.take(pa.array(rows, pa.int64()))
        cols = [keys.column(f.name).combine_chunks().cast(f.type) for f in fields]
        cols += [values(t, n) for t in vtypes]
        if odd == "null":
            cols.append(pa.array([None if i == 1 else i for i in range(n)], pa.int64()))
        elif odd == "string":
            cols.append(pa.array([str(i) for i in range(n)]))
        names = [f.name for f in fields] + [f"v{i}" for i in range(len(cols) - len(fields))]
        schema = pa.schema(fields + [pa.field(nm, c.type) for nm, c in
                                     zip(names[len(fields):], cols[len(fields):])])
        b = pa.record_batch(cols, schema=schema)
        codes = ref._plan_codes([b.column(i) for i in range(len(fields))], plan)
        b = b.take(pa.array(np.argsort(codes, kind="stable"), pa.int64()))  # sorted by key code
        batches.append(b)
        weights.append(np.array(draw(st.lists(st.integers(-2 ** 63, 2 ** 63 - 1), min_size=n,
                                              max_size=n)), np.int64))
    return batches, weights, batches[0].schema, plan


@given(_disjoint_parts())
def test_gather_disjoint(parts):
    """Native against the reference (and against merge_disjoint_runs of the key codes and a
    take of the concatenated parts): the same rows in the same order, None in the same
    cases."""
    batches, weights, schema, plan = parts
    got = native.gather_disjoint(batches, weights, schema, plan)
    want = ref.gather_disjoint(batches, weights, schema, plan)
    assert (got is None) == (want is None)
    if got is None:
        return
    assert got[0].schema == schema and got[0].equals(want[0])
    same(got[1], want[1])
    order = native.merge_disjoint_runs(
        [ref._plan_codes([b.column(i) for i in range(len(plan))], plan) for b in batches])
    whole = pa.Table.from_batches(batches).combine_chunks()
    assert got[0].equals(whole.take(pa.array(order, pa.int64())).to_batches()[0]) \
        if len(order) else got[0].num_rows == 0


def test_gather_disjoint_refuses_bad_input():
    b = pa.record_batch([pa.array([1, 2, 3]), pa.array([1.0, 2.0, 3.0])], names=["k", "v"])
    plan = [(8, True, False)]
    for kern in (native.gather_disjoint, ref.gather_disjoint):
        with pytest.raises(ValueError):
            kern([b], [np.ones(2, np.int64)], b.schema, plan)  # 2 weights for 3 rows
        with pytest.raises(ValueError):
            kern([b, b], [np.ones(3, np.int64)], b.schema, plan)  # 2 batches, 1 weights
        with pytest.raises(ValueError):
            kern([b.take([2, 1, 0])], [np.ones(3, np.int64)], b.schema, plan)  # not ascending
        assert kern([b], [np.ones(3, np.int64)], b.schema, [(4, True, True)]) is None  # width
        assert kern([b, b], [np.ones(3, np.int64)] * 2, b.schema, plan) is None  # shared keys
        assert kern([b], [np.ones(3, np.int64)], b.schema, [(8, True, True)]) is None  # 9 bytes


@given(_dealt_batches(), OWNER_MAPS, st.data())
def test_deal_batch_packs_the_key_codes(dealt, owner_map, data):
    """Without codes, the kernel packs them from key columns by a plan: the same deal as with
    the codes of the reference's packing, and as the reference; None where the reference is
    (a column not copied), False where it is (a key column off its plan, a code past 64
    bits: the caller asks again with the codes)."""
    batch, _, weights = dealt
    bits, workers, owners = owner_map
    owners = np.array(owners, np.int32)
    k = data.draw(st.integers(1, min(2, batch.num_columns)))
    key_cols = data.draw(st.permutations(range(batch.num_columns)))[:k]
    plan = []
    for i in key_cols:
        t = batch.schema.field(i).type
        w = 8 if pa.types.is_string(t) else max(t.bit_width // 8, 1)
        plan.append((data.draw(st.sampled_from([w, w, 4])), data.draw(st.booleans()),
                     data.draw(st.booleans())))
    got = native.deal_batch(batch, None, weights, owners, bits, workers, key_cols, plan)
    want = ref.deal_batch(batch, None, weights, owners, bits, workers, key_cols, plan)
    assert (got is None) == (want is None) and (got is False) == (want is False)
    if got is None:   # a column not copied: not with the codes either
        codes = ref._plan_codes([batch.column(i) for i in key_cols], plan)
        if codes is not None:
            assert native.deal_batch(batch, codes, weights, owners, bits, workers) is None
        return
    if got is False:  # the columns copied, the key codes not packed by this plan
        assert ref._plan_codes([batch.column(i) for i in key_cols], plan) is None
        return
    codes = ref._plan_codes([batch.column(i) for i in key_cols], plan)
    again = native.deal_batch(batch, codes, weights, owners, bits, workers)
    for g, r, a in zip(got, want, again):
        assert (g is None) == (r is None) == (a is None)
        if g is not None:
            assert g[0].equals(r[0]) and g[0].equals(a[0])
            same(g[1], r[1])
            same(g[1], a[1])

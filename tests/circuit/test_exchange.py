"""The exchange's sharding function and dealing (dbsp.circuit.exchange): every row goes to
exactly one worker, the same one for the same key in every process, and dealing a record batch
agrees with sharding the codes the exchange computes after index_by."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.algebra import kernels as K
from dbsp.algebra.codes import codec_for
from dbsp.circuit.exchange import ShardMap, as_shard_map, deal, deal_batch, shard_rows


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-2**40, 2**40), max_size=300), st.integers(1, 9),
       st.sampled_from(["default", "fixed", "resized"]))
def test_shard_rows_partitions_by_key(keys, workers, kind):
    schema = pa.schema([("k", pa.int64())])
    codes = codec_for(schema).encode([pa.array(keys, pa.int64())], len(keys))
    shards = {"default": as_shard_map(workers), "fixed": ShardMap.fixed(workers, 64),
              "resized": ShardMap.dynamic(1).resize(workers + 2).resize(workers)}[kind]
    parts = shard_rows(codes, shards)
    assert len(parts) == workers
    allidx = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    assert sorted(allidx.tolist()) == list(range(len(keys)))  # each row exactly once
    home = {}
    for w, idx in enumerate(parts):
        assert (np.diff(idx) > 0).all()  # ascending
        for i in idx:
            assert home.setdefault(keys[i], w) == w  # a key lives on one worker
    # the worker is the owner of the shard given by the hash's top bits
    shard = (K.hash64(codes) >> np.uint64(64 - shards.bits)) if shards.bits else \
        np.zeros(len(keys), np.uint64)
    assert (shards.owners[shard.astype(np.int64)][allidx] ==
            np.concatenate([np.full(len(p), w) for w, p in enumerate(parts)])).all()


def test_deal_agrees_with_the_exchange_codes():
    data = pa.record_batch({"a": pa.array(["x", "y", "z", "x", None]),
                            "b": pa.array([1, 2, 3, 1, 5], pa.int32()),
                            "v": pa.array([0.5, 1.5, 2.5, 3.5, 4.5])})
    key_schema = pa.schema([("a", pa.string()), ("b", pa.int32())])
    dealt = deal(data, (("a", "b"), key_schema), 3)
    codes = codec_for(key_schema).encode([data["a"], data["b"]], data.num_rows)
    assert [d.tolist() for d in dealt] == [p.tolist() for p in shard_rows(codes, 3)]
    where = {i: w for w, d in enumerate(dealt) for i in d}
    assert where[0] == where[3]  # the same key, the same worker


_DEAL_COLUMNS = {  # type, values (None: a null)
    "i64": (pa.int64(), st.integers(-2 ** 63, 2 ** 63 - 1)),
    "i32?": (pa.int32(), st.none() | st.integers(-3, 3)),
    "u8": (pa.uint8(), st.integers(0, 255)),
    "f64": (pa.float64(), st.floats(allow_nan=False)),
    "str?": (pa.string(), st.none() | st.sampled_from(["", "a", "bc", "déf"])),
    "bool": (pa.bool_(), st.booleans()),
    "ts": (pa.timestamp("us"), st.integers(-2 ** 40, 2 ** 40)),
}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(sorted(_DEAL_COLUMNS)), min_size=1, max_size=4),
       st.integers(0, 60), st.integers(0, 3), st.integers(1, 5), st.booleans(), st.data())
def test_deal_batch_hands_each_worker_the_rows_deal_gives_it(kinds, n, lead, workers, fixed,
                                                             data):
    """Each worker gets the rows (and weights) that :func:`deal` gives it, in order: the native
    copy for fixed-width columns without nulls, the gather otherwise (strings, nulls, bools),
    keys of one to four columns of those types, a sliced batch (a non-zero offset)."""
    cols = []
    for kind in kinds:
        t, values = _DEAL_COLUMNS[kind]
        cols.append(pa.array(data.draw(st.lists(values, min_size=n + lead, max_size=n + lead)),
                             t))
    names = [f"c{i}" for i in range(len(kinds))]
    batch = pa.record_batch(cols, names=names).slice(lead)
    nkey = data.draw(st.integers(1, len(kinds)))
    weights = np.array(data.draw(st.lists(st.integers(-9, 9), min_size=n, max_size=n)), np.int64)
    key = (tuple(names[:nkey]), pa.schema(list(batch.schema)[:nkey]))
    shards = ShardMap.fixed(workers, 64) if fixed else as_shard_map(workers)
    got = deal_batch(batch, weights, key, shards)
    assert len(got) == workers
    for w, idx in enumerate(deal(batch, key, shards)):
        if not len(idx):
            assert got[w] is None
            continue
        assert got[w][0].equals(batch.take(pa.array(idx, pa.int64())))
        assert got[w][1].tolist() == weights[idx].tolist()


def test_deal_batch_copies_fixed_columns_natively():
    """Fixed-width columns without nulls take the one-pass kernel (not the gather), whose rows
    are those of :func:`deal`."""
    rng = np.random.default_rng(3)
    batch = pa.record_batch({"k": rng.integers(0, 50, 500), "v": rng.random(500)})
    key = (("k",), pa.schema([("k", pa.int64())]))
    w = np.ones(500, np.int64)
    codes = codec_for(key[1]).encode_batch(batch.select(["k"]))
    assert K.deal_batch(batch, codes, w, as_shard_map(3).owners, as_shard_map(3).bits, 3) \
        is not None
    for part, idx in zip(deal_batch(batch, w, key, 3), deal(batch, key, 3)):
        assert part[0].equals(batch.take(pa.array(idx)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 4), st.integers(-2, 2)),
                max_size=120),
       st.integers(1, 5), st.sampled_from(["int", "str"]),
       st.sampled_from(["default", "fixed", "resized"]), st.booleans())
def test_exchange_split_of_an_indexed_batch_selects_each_workers_keys(rows, workers, kind,
                                                                     shape, vnull):
    """The exchange's split of an indexed batch (one native pass for every worker) gives each
    worker the same keys, values, codes and weights as selecting its keys' rows by
    ``shard_rows``, and None for a worker without keys; u64 and variable-width key codes."""
    from dbsp.algebra.codes import Codes
    from dbsp.operators.exchange import _split_indexed
    from dbsp.trace.batch import OrdIndexedZSet, ZSet
    kt = pa.int64() if kind == "int" else pa.string()
    keys = [k if kind == "int" else f"k{k}" for k, _, _ in rows]
    # a nullable value column has 9-byte codes (variable-width), a not-null one u64 codes
    schema = pa.schema([pa.field("k", kt), pa.field("v", pa.int64(), nullable=vnull)])
    data = pa.record_batch([pa.array(keys, kt), pa.array([v for _, v, _ in rows], pa.int64())],
                           schema=schema)
    z = ZSet(data, np.array([w for _, _, w in rows], np.int64))
    ix = OrdIndexedZSet.from_loose(z, ["k"])
    shards = {"default": as_shard_map(workers), "fixed": ShardMap.fixed(workers, 64),
              "resized": ShardMap.dynamic(1).resize(workers + 2).resize(workers)}[shape]
    got = _split_indexed(ix, shards)
    want = shard_rows(ix.kcodes, shards)
    assert len(got) == workers
    for part, idx in zip(got, want):
        if len(idx) == 0 or ix.num_keys == 0:
            assert part is None
            continue
        ref = ix.select_keys(idx)
        assert part.keys.equals(ref.keys) and part.vals.equals(ref.vals)
        np.testing.assert_array_equal(part.offsets, ref.offsets)
        np.testing.assert_array_equal(part.weights, ref.weights)
        assert Codes.to_list(part.kcodes) == Codes.to_list(ref.kcodes)
        assert Codes.to_list(part.vcodes) == Codes.to_list(ref.vcodes)

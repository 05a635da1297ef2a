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
from dbsp.circuit.exchange import ShardMap, as_shard_map, deal, shard_rows


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

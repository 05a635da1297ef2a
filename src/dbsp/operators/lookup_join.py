"""lookup_join: each change of a stream joined with the other side *as it is at that step*
(a processing-time temporal join, SQL's ``JOIN t FOR SYSTEM_TIME AS OF s.p_time``).

Maths
-----
Where the incremental inner join (:mod:`dbsp.operators.join`) answers ``I(a) ⋈ I(b)``, revising
past output when either side changes, the lookup join only ever joins *new* left rows::

    lookup(a, b) = Δa ⋈ I(b)                   where I(b) already includes Δb

Its integral, ``Σ_t Δa_t ⋈ I(b)_t``, equals ``I(a) ⋈ I(b)`` when ``b`` changes only before the
left rows that look it up (a bounded side input, a dimension table loaded first); otherwise a
left row keeps the match it found when it arrived, as in Flink's and Nexmark q13's
processing-time lookup join. Left rows are never stored: the state is the right side only, so
a stream joined with a bounded table keeps no history of the stream.

Design
------
:func:`lookup_join` is :class:`~dbsp.operators.join.JoinOperator` without its second term: both
sides sharded by key, the right side integrated in a :class:`~dbsp.trace.spine.Spine`, the
left delta probed against its batches. Null keys match nothing; the output is ``key ++ left
values ++ right values`` as for ``join``.

:func:`lookup_join_rows` is the same join for a *small* right side and a left side of plain
rows: the right side is broadcast (every worker keeps all of it) and the left rows are neither
indexed nor moved. Each step encodes only the left *key* columns, sorts those codes, probes the
right batches with the distinct ones and expands the matches: no sort of the left values, no
consolidation (a join is bilinear: unconsolidated input gives an equal, unconsolidated output),
no exchange of the stream. This is the plan of Nexmark q13 (a stream looked up in a bounded
side table).

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> bid = c.add_input("bid", [("k", pa.int64()), ("price", pa.int64())])
>>> side = c.add_input("side", [("k", pa.int64()), ("v", pa.string())])
>>> j = bid.index_by(["k"]).lookup_join(side.index_by(["k"])).output()
>>> _ = side.insert([(1, "one")]); _ = bid.insert([(1, 10)]); c.step(); j.to_dict()
{(1, 10, 'one'): 1}
>>> _ = side.insert([(1, "uno")]); c.step(); j.to_dict()  # past bids keep their match
{}
>>> _ = bid.insert([(1, 20)]); c.step(); sorted(j.to_dict())
[(1, 20, 'one'), (1, 20, 'uno')]
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.schema import concat_batches, take
from ..circuit.errors import RowError
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet, ZSet, match_batches
from .exchange import broadcast
from .join import (JoinOperator, drop_null_keys, join_matched, null_key_mask, pair_schema,
                   prepare)


class LookupJoinOperator(JoinOperator):
    """``Δa ⋈ I(b)`` on sharded indexed streams (the left side is not stored)."""

    name = "lookup_join"

    def eval(self, da: OrdIndexedZSet, db: OrdIndexedZSet) -> ZSet:
        da, db = drop_null_keys(da), drop_null_keys(db)
        if len(db):
            self.right.insert(db)
        if not len(da):
            return ZSet.empty(self.out_schema)
        pieces = [(da, sub, join_matched(da, pi, sub, ki, "y"))
                  for sub, pi, ki in match_batches(self.right.batches(), da.kcodes)]
        return self._build(pieces, 0, da)  # (every y a stored batch of the right trace)


def lookup_join(left, right):
    """Each change of ``left`` joined with ``right`` as integrated up to this step (see the
    module doc); rows ``key ++ left values ++ right values``."""
    a, b = prepare(left, right, "lookup_join")
    out = pair_schema(a.key_schema, a.val_schema, b.val_schema)
    key, lval, rval = a.key_schema, a.val_schema, b.val_schema
    return a.circuit.add_node(
        "lookup_join", lambda ctx: LookupJoinOperator(ctx, out, "pairs", None, key, lval, rval),
        [a, b], ZSetType(out))


class RowsLookupJoinOperator(JoinOperator):
    """``Δa ⋈ I(b)`` for rows ``Δa`` keyed by ``key`` columns (not indexed, not moved) and a
    broadcast right side (see the module doc)."""

    name = "lookup_join"

    def __init__(self, ctx, out_schema: pa.Schema, key: list[str], lvals: list[str],
                 key_schema: pa.Schema, lval: pa.Schema, rval: pa.Schema):
        super().__init__(ctx, out_schema, "pairs", None, key_schema, lval, rval)
        self.key, self.lvals = key, lvals

    def eval(self, z: ZSet, db: OrdIndexedZSet) -> ZSet:  # type: ignore[override]
        db = drop_null_keys(db)
        if len(db):
            self.right.insert(db)
        batches = self.right.batches()
        if not len(z) or not batches:
            return ZSet.empty(self.out_schema)
        data = z.data
        keys = data.select(self.key)
        rows = None  # the rows with no null key column (None: all of them)
        nulls = null_key_mask(keys)
        if nulls is not None and nulls.any():
            rows = np.flatnonzero(~nulls)
            keys = take(keys, rows)
        codes = batches[0].kcodec.encode(keys.columns, keys.num_rows)  # the right side's codec
        perm = K.argsort(codes)
        sorted_codes = K.take(codes, perm)
        bounds = K.group_bounds(sorted_codes)  # the rows of each distinct key, in perm order
        distinct = K.take(sorted_codes, bounds[:-1])
        lrows, rparts, ws = [], [], []
        for sub, pi, ki in match_batches(batches, distinct):
            xs, ys = K.expand_pairs(bounds, pi, sub.offsets, ki)
            lr = perm[xs]
            if rows is not None:
                lr = rows[lr]
            w, over = K.mul_checked(z.weights[lr], sub.weights[ys])
            if over is not None:
                i = int(np.argmax(over))
                raise RowError("lookup_join", f"the weight of a joined pair would be "
                               f"{int(z.weights[lr[i]]) * int(sub.weights[ys[i]])}, out of the "
                               f"int64 range of weights", data.slice(int(lr[i]), 1).to_pylist()[0])
            lrows.append(lr)
            rparts.append(take(sub.vals, ys))
            ws.append(w)
        if not lrows:
            return ZSet.empty(self.out_schema)
        lr = lrows[0] if len(lrows) == 1 else np.concatenate(lrows)
        left = take(data.select(self.key + self.lvals), lr)
        right = rparts[0] if len(rparts) == 1 else concat_batches(rparts[0].schema, rparts)
        cols = list(left.columns) + list(right.columns)
        w = ws[0] if len(ws) == 1 else np.concatenate(ws)
        return ZSet(pa.RecordBatch.from_arrays(cols, schema=self.out_schema), w)


def lookup_join_rows(left, key: Sequence[str], right):
    """:func:`lookup_join` of the rows of ``left`` (a Z-set stream) by its ``key`` columns with a
    small indexed ``right`` stream, broadcast to every worker; rows ``key ++ left's other columns
    ++ right values`` (see the module doc)."""
    key = [key] if isinstance(key, str) else list(key)
    schema = left.schema
    for k in key:
        if k not in schema.names:
            raise KeyError(f"lookup_join: no left key column {k!r} (columns: {schema.names})")
    ks = pa.schema([schema.field(k) for k in key])
    lvals = [n for n in schema.names if n not in key]
    lv = pa.schema([schema.field(n) for n in lvals])
    if not isinstance(right.type, IndexedType):
        raise TypeError(f"lookup_join: the right input must be an indexed stream (use "
                        f".index_by([...]) first), got {right.type.describe()}")
    rk = right.key_schema
    if len(rk) != len(ks) or any(a.type != b.type for a, b in zip(ks, rk)):
        raise TypeError(f"lookup_join: the key schemas differ: left key {ks.types}, right key "
                        f"{rk.types} (cast or map one side first)")
    if left.circuit is not right.circuit:
        raise ValueError("lookup_join: the two streams belong to different circuits")
    out = pair_schema(ks, lv, right.val_schema)
    rv = right.val_schema
    b = broadcast(right)
    return left.circuit.add_node(
        "lookup_join",
        lambda ctx: RowsLookupJoinOperator(ctx, out, key, lvals, ks, lv, rv), [left, b],
        ZSetType(out))


__all__ = ["LookupJoinOperator", "RowsLookupJoinOperator", "lookup_join", "lookup_join_rows"]

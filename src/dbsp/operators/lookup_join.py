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
It is :class:`~dbsp.operators.join.JoinOperator` without its second term: both sides sharded
by key, the right side integrated in a :class:`~dbsp.trace.spine.Spine`, the left delta probed
against its batches. Null keys match nothing; the output is ``key ++ left values ++ right
values`` as for ``join``.

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

from ..circuit.types import ZSetType
from ..trace.batch import OrdIndexedZSet, ZSet, match_batches
from .join import JoinOperator, drop_null_keys, join_matched, pair_schema, prepare


class LookupJoinOperator(JoinOperator):
    """``Δa ⋈ I(b)`` on sharded indexed streams (the left side is not stored)."""

    name = "lookup_join"

    def eval(self, da: OrdIndexedZSet, db: OrdIndexedZSet) -> ZSet:
        da, db = drop_null_keys(da), drop_null_keys(db)
        if len(db):
            self.right.insert(db)
        if not len(da):
            return ZSet.empty(self.out_schema)
        pieces = [(da, sub, join_matched(da, pi, sub, ki))
                  for sub, pi, ki in match_batches(self.right.batches(), da.kcodes)]
        return self._build(pieces)


def lookup_join(left, right):
    """Each change of ``left`` joined with ``right`` as integrated up to this step (see the
    module doc); rows ``key ++ left values ++ right values``."""
    a, b = prepare(left, right, "lookup_join")
    out = pair_schema(a.key_schema, a.val_schema, b.val_schema)
    key, lval, rval = a.key_schema, a.val_schema, b.val_schema
    return a.circuit.add_node(
        "lookup_join", lambda ctx: LookupJoinOperator(ctx, out, "pairs", None, key, lval, rval),
        [a, b], ZSetType(out))


__all__ = ["LookupJoinOperator", "lookup_join"]

"""distinct: every row of positive weight, with weight 1 (set semantics); incremental.

Maths
-----
``distinct(a)[r] = 1 if a[r] > 0 else 0``. It is not linear, but its incremental form only needs
the integrated input at the rows the delta touches (DBSP, Prop. 4.7)::

    Δdistinct(Δa)[r] = 1   if I(a)_old[r] <= 0 < I(a)_old[r] + Δa[r]
                     = -1  if I(a)_old[r] > 0 >= I(a)_old[r] + Δa[r]
                     = 0   otherwise

State: the integrated input as a :class:`~dbsp.trace.spine.Spine` of :class:`OrdZSet` batches.
Each step consolidates the delta, asks the trace for the old weights of just those rows
(:meth:`Spine.weights_of`), and emits the rows whose sign changed: work proportional to the delta
(times the logarithmic number of batches), never to the history. Rows are sharded by the hash of
the whole row first, so with W workers every row lives on one worker.

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("x", pa.int64())])
>>> out = t.distinct().output()
>>> _ = t.push([(1,), (1,), (2,)]); c.step(); sorted(out.to_dict().items())
[((1,), 1), ((2,), 1)]
>>> _ = t.delete([(1,)]); c.step(); out.to_dict()     # (1,) still has weight 1: no change
{}
>>> _ = t.delete([(1,)]); c.step(); out.to_dict()
{(1,): -1}
"""
from __future__ import annotations

import numpy as np

from ..algebra import kernels as K
from ..algebra.schema import take
from ..circuit.errors import BadRows, RowError
from ..circuit.operator import Operator
from ..circuit.types import ZSetType
from ..trace.batch import OrdZSet, ZSet
from ..trace.spine import Spine
from .exchange import sharded


def sign_changes(old: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """The weight change of ``distinct`` for rows whose weight goes from ``old`` to ``old+delta``:
    ``+1`` where it becomes positive, ``-1`` where it stops being positive, else ``0``."""
    return (old + delta > 0).astype(np.int64) - (old > 0).astype(np.int64)


class DistinctOperator(Operator):
    """``distinct`` over a Z-set stream whose rows are already sharded by row hash."""

    state_attrs = ('trace',)

    name = "distinct"

    def __init__(self, ctx, schema):
        super().__init__(ctx)
        self.schema = schema
        self.trace = Spine(name="distinct")

    def eval(self, z: ZSet) -> ZSet:
        d = z.consolidate()
        if len(d) == 0:
            return ZSet.empty(self.schema)
        old = self.trace.weights_of(d.codes)
        total = old + d.weights  # int64, wraps: checked below
        over = ((old ^ total) & (d.weights ^ total)) < 0
        if over.any():
            d, old = self._overflow(d, old, over)
            if len(d) == 0:
                return ZSet.empty(self.schema)
        w = sign_changes(old, d.weights)
        self.trace.insert(d)
        keep = np.flatnonzero(w)
        if len(keep) == len(d):
            return OrdZSet(d.data, w, d.codes, d.codec)
        return OrdZSet(take(d.data, keep), w[keep], K.take(d.codes, keep), d.codec)

    def _overflow(self, d: OrdZSet, old: np.ndarray, over: np.ndarray):
        """Rows whose integrated weight would leave int64: an error, or (skip_and_report) set
        aside, the rest carrying on."""
        bad = np.flatnonzero(over)
        reasons = [f"the weight of the row would be {int(old[i]) + int(d.weights[i])}, out of "
                   f"the int64 range of weights" for i in bad]
        if not self.skipping:
            i = int(bad[0])
            raise RowError(self.name, reasons[0], d.data.slice(i, 1).to_pylist()[0])
        self.ctx.errors.report(BadRows(self.name, take(d.data, bad), d.weights[bad], reasons))
        keep = np.flatnonzero(~over)
        return OrdZSet(take(d.data, keep), d.weights[keep], K.take(d.codes, keep), d.codec), \
            old[keep]

    def clock_start(self) -> None:
        self.trace.clear()

    def state_rows(self) -> int:
        return len(self.trace)


def distinct(stream):
    """``distinct(stream)``: shards the rows by hash, then keeps a trace of the input."""
    if not isinstance(stream.type, ZSetType):
        raise TypeError(f"distinct needs a stream of Z-sets, got {stream.type.describe()}; "
                        f"flatten() an indexed stream first")
    s = sharded(stream)
    schema = stream.schema
    return stream.circuit.add_node("distinct", lambda ctx: DistinctOperator(ctx, schema), [s],
                                   ZSetType(schema))


__all__ = ["distinct", "DistinctOperator", "sign_changes"]

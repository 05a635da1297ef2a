"""nested: the stateful operators of a recursive body, incremental in outer *and* inner time.

A recursive body (:mod:`dbsp.operators.recursive`) runs, at every outer step ``t``, an inner loop
of iterations ``i = 0, 1, ...``. Every stream ``s`` of the body is then a function of two times,
and what flows on it is its two-dimensional change ``s(t, i)`` (DBSP Sec. 6, differential
dataflow's product timestamps): the value of the stream at ``(t, i)`` is the sum of the changes
at every time ``(t', i') <= (t, i)``. Linear operators (map, filter, flat_map, plus, minus, neg,
index_by, flatten, exchange) commute with that sum, so they need no change. This module gives
the non-linear ones their two-dimensional incremental form, so that the inner state survives
from one outer step to the next and an outer change (an inserted or a *deleted* edge) derives
only what it changes.

State: the trace of every input, indexed by ``(outer, inner)`` time. The outer time is totally
ordered and already consolidated: after step ``t`` the changes of step ``t`` are added into an
``old`` :class:`~dbsp.trace.timed.TimedTrace` that keeps only the inner time. During step ``t``
the operator also holds this step's changes ``n[j]`` for the iterations ``j <= i`` seen so far,
summed in ``N(<=i)``. Writing ``o[j]`` for the old changes at inner time ``j`` and ``O(<=i)`` for
their sum (the accumulated value of the input at ``(t-1, i)``)::

    A(t, i) = O(<=i) + N(<=i)          A(t-1, i) = O(<=i)

Join (bilinear). The change of ``A ⋈ B`` at ``(t, i)`` is
``Δ_t Δ_i (A ⋈ B) = A(t,i)⋈B(t,i) - A(t,i-1)⋈B(t,i-1) - A(t-1,i)⋈B(t-1,i) + A(t-1,i-1)⋈B(t-1,i-1)``;
expanding ``A = O + N`` and cancelling leaves six products, each with at least one factor of
this step's changes::

    n_a[i] ⋈ O_b(<=i)   +  n_a[i] ⋈ N_b(<=i)   +  o_a[i] ⋈ N_b(<=i)
    N_a(<=i-1) ⋈ o_b[i] +  N_a(<=i-1) ⋈ n_b[i] +  O_a(<=i-1) ⋈ n_b[i]

The old traces are probed only with the keys of this step's changes (``n`` and ``N``), so the
work follows the change. Semijoin and antijoin are a join with ``distinct(keys(b))``.

Distinct (and the key set of semi / anti joins). With ``D(w) = 1 if w > 0 else 0`` per row::

    Δ_t Δ_i distinct(A)[r] = D(O(<=i) + N(<=i)) - D(O(<=i-1) + N(<=i-1)) - D(O(<=i)) + D(O(<=i-1))

which is zero unless ``r`` changed in this step, at ``i`` (``n[i][r] != 0``) or earlier
(``N(<=i-1)[r] != 0``) *and* the old trace changed at ``i`` (``o[i][r] != 0``): the rows to look
at are those this step touched, never the history. A deleted edge thus retracts a path at the
iteration where it was derived, and the retraction spreads iteration by iteration; a fact kept
only by a cycle of facts (``a`` derived from ``b`` derived from ``a``) is retracted because its
support is counted per iteration: the cycle's later derivations never made it positive at the
earlier iteration where it first appeared.

Termination. At iteration ``i`` an operator can still produce output while this step touched it
(``N`` is not empty) and the old trace holds changes after ``i`` for the keys it touched (the
old rows of every touched key are looked up once per step and kept, so their latest time is
known: :meth:`NestedOperator.pending`). The loop ends when the fed-back change is empty and no
operator is pending, on every worker.

Cost of an outer step: the rows this step touches, times the iterations at which they have
old changes, plus one lookup in the old traces per touched key; never the size of the fixed
point. Each inner iteration also pays the fixed cost of evaluating the body's operators.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import CodeArray, codec_for
from ..algebra.schema import take
from ..circuit.operator import Operator
from ..trace.batch import OrdIndexedZSet, OrdZSet, ZSet, ranges
from ..trace.timed import TimedTrace, at_times, times_of
from .aggregate import compute_groups
from .distinct import DistinctOperator
from .join import (EMPTY_SCHEMA, JoinOperator, KeySetOperator, drop_null_keys, join_pairs,
                   zero_column_batch)

__all__ = ["NestedOperator", "NestedJoin", "NestedDistinct", "NestedKeySet", "NestedAggregate",
           "nest", "nestable", "LINEAR_NAMES"]

#: names (or name prefixes) of the operators that are linear in both times: a recursive body
#: built only from these and the operators :func:`nest` knows runs as a nested incremental circuit
LINEAR_NAMES = ("import", "feedback", "map", "filter", "flat_map", "plus", "minus", "neg",
                "index_by", "flatten", "exchange", "consolidate", "recode_keys", "pad_nulls",
                "join_fn", "left_join_fn")


def _union_keys(*codes: CodeArray) -> CodeArray:
    """The sorted distinct union of sorted distinct code arrays."""
    codes = [c for c in codes if c is not None and len(c)]
    if len(codes) == 1:
        return codes[0]
    cat = K.concat(codes)
    perm, _ = K.sort_consolidate(cat, None, np.ones(len(cat), np.int64))
    return K.take(cat, perm)


class _Sum:
    """This step's changes so far, ``N(<=i)``: a few consolidated batches whose sizes at least
    double from the newest to the oldest (adding a batch merges the newer ones while they are
    as large as their elder: amortised O(log n) merges a row, never a merge of everything at
    every iteration)."""

    __slots__ = ("batches",)

    def __init__(self):
        self.batches: list = []

    def __bool__(self) -> bool:
        return bool(self.batches)

    def add(self, b) -> None:
        if b is None or len(b) == 0:
            return
        bs = self.batches
        bs.append(b)
        while len(bs) > 1 and len(bs[-2]) <= 2 * len(bs[-1]):
            top = bs.pop()
            m = type(top).merge([bs.pop(), top])
            if len(m):
                bs.append(m)

    def weights_of(self, codes: CodeArray) -> np.ndarray:
        """The summed weight of each sorted distinct row code (Z-set batches)."""
        out = np.zeros(len(codes), np.int64)
        for b in self.batches:
            out += b.row_weights(codes)
        return out


class _Probed:
    """The old trace's rows of every key probed during this outer step.

    The old trace does not change during a step, so each key is looked up once and its timed
    rows are kept here for the later iterations; :attr:`horizon` is the latest time among them
    (after it, nothing old can meet this step's changes)."""

    __slots__ = ("trace", "keys", "rows", "times", "horizon")

    def __init__(self, trace: TimedTrace):
        self.trace = trace
        self.keys: Optional[CodeArray] = None
        self.rows: Optional[OrdIndexedZSet] = None
        self.times = None
        self.horizon = -1

    def of(self, codes: CodeArray) -> Optional[OrdIndexedZSet]:
        """The cached rows, after looking up those of ``codes`` not looked up yet (the result
        may hold other keys too: callers intersect)."""
        if self.trace.max_time < 0 or len(codes) == 0:
            return self.rows
        if self.keys is not None:
            ai, _ = K.intersect(codes, self.keys)
            if len(ai):
                keep = np.ones(len(codes), bool)
                keep[ai] = False
                codes = K.take(codes, np.flatnonzero(keep))
        if len(codes) == 0:
            return self.rows
        self.keys = _union_keys(self.keys, codes)
        got = self.trace.probe(codes)
        if got is not None and len(got):
            t = times_of(got)
            self.horizon = max(self.horizon, int(t.max()))
            if self.rows is None:
                self.rows, self.times = got, t
            else:
                self.rows = OrdIndexedZSet.merge([self.rows, got])
                self.times = times_of(self.rows)
        return self.rows


class NestedOperator(Operator):
    """An operator of a recursive body with timed state (see the module doc).

    The recursive operator calls :meth:`begin` before the inner loop of an outer step, sets
    :attr:`time` before each iteration, asks :meth:`pending` after it, and calls :meth:`end`
    after the loop (this step's changes join the old trace)."""

    time = 0

    def begin(self) -> None:
        self.time = 0

    def end(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def pending(self, i: int) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError


class NestedJoin(NestedOperator):
    """The two-dimensional incremental join (the six products of the module doc); the rows it
    outputs are built by the join it replaces (pairs, semijoin or a join function)."""

    state_attrs = ("old_a", "old_b")

    def __init__(self, ctx, inner: JoinOperator):
        super().__init__(ctx)
        self.inner = inner
        self.name = inner.name
        self.old_a = TimedTrace(inner.key_schema, inner.lval, "nested_join.left")
        self.old_b = TimedTrace(inner.key_schema, inner.rval, "nested_join.right")
        self._reset()

    def _reset(self) -> None:
        self.cum_a = _Sum()
        self.cum_b = _Sum()
        self.parts_a: list = []
        self.parts_b: list = []
        self.seen_a = _Probed(self.old_a)
        self.seen_b = _Probed(self.old_b)

    def begin(self) -> None:
        super().begin()
        self._reset()

    def eval(self, da: OrdIndexedZSet, db: OrdIndexedZSet, *watermarks) -> ZSet:
        # (watermarks of a join's GC are not used in a nested body: its traces are kept)
        da, db = drop_null_keys(da), drop_null_keys(db)
        i = self.time
        ca = self.cum_a.batches             # N_a(<=i-1)
        cb2 = self.cum_b.batches + [db]     # N_b(<=i)
        pieces = []

        def add(x, ys):
            if x is None or len(x) == 0:
                return
            for y in ys:
                if y is not None and len(y):
                    p = join_pairs(x, y)
                    if p is not None:
                        pieces.append((x, y, p))

        if len(da) or ca:
            ob = self.seen_b.of(da.kcodes)   # the keys of ca were looked up when they came
            if ob is not None:
                t = self.seen_b.times
                if len(da):
                    add(da, [at_times(ob, t <= i)])          # n_a[i] ⋈ O_b(<=i)
                if ca:
                    ob_i = at_times(ob, t == i)
                    for x in ca:
                        add(x, [ob_i])                       # N_a(<=i-1) ⋈ o_b[i]
        if len(db) or self.cum_b:
            oa = self.seen_a.of(db.kcodes)
            if oa is not None:
                t = self.seen_a.times
                add(at_times(oa, t == i), cb2)               # o_a[i] ⋈ N_b(<=i)
                if len(db):
                    add(at_times(oa, t < i), [db])           # O_a(<=i-1) ⋈ n_b[i]
        add(da, cb2)                                         # n_a[i] ⋈ N_b(<=i)
        for x in ca:
            add(x, [db])                                     # N_a(<=i-1) ⋈ n_b[i]
        if len(da):
            self.cum_a.add(da)
            self.parts_a.append((i, da))
        if len(db):
            self.cum_b.add(db)
            self.parts_b.append((i, db))
        return self.inner._build(pieces)

    def pending(self, i: int) -> bool:
        return ((bool(self.cum_a) and self.seen_b.horizon > i)
                or (bool(self.cum_b) and self.seen_a.horizon > i))

    def end(self) -> None:
        self.old_a.insert(self.parts_a)
        self.old_b.insert(self.parts_b)
        self._reset()

    def clock_start(self) -> None:
        self.old_a.clear()
        self.old_b.clear()
        self._reset()

    def savepoint(self):
        return self.old_a.max_time, self.old_b.max_time

    def restore(self, saved) -> None:
        self.old_a.max_time, self.old_b.max_time = saved
        self._reset()

    def state_rows(self) -> int:
        return len(self.old_a) + len(self.old_b)


class _OneTrace(NestedOperator):
    """A nested operator over one input trace ``old`` (the earlier steps' changes by inner
    time), this step's changes ``parts`` / ``cum`` and the inner times ``seen`` of the keys it
    touched: what :class:`_NestedSet` and :class:`NestedAggregate` share."""

    def pending(self, i: int) -> bool:
        return bool(self.cum) and self.seen.horizon > i

    def end(self) -> None:
        self.old.insert(self.parts)
        self._reset()

    def clock_start(self) -> None:
        self.old.clear()
        self._reset()

    def savepoint(self):
        return self.old.max_time

    def restore(self, saved) -> None:
        self.old.max_time = saved
        self._reset()

    def state_rows(self) -> int:
        return len(self.old)


class _NestedSet(_OneTrace):
    """The two-dimensional incremental ``distinct`` of a Z-set of rows (module doc)."""

    state_attrs = ("old",)

    def __init__(self, ctx, schema: pa.Schema, name: str):
        super().__init__(ctx)
        self.name = name
        self.old = TimedTrace(schema, EMPTY_SCHEMA, f"nested_{name}")
        self._reset()

    def _reset(self) -> None:
        self.cum = _Sum()
        self.parts: list = []
        self.seen = _Probed(self.old)

    def begin(self) -> None:
        super().begin()
        self._reset()

    def step_rows(self, d: OrdZSet) -> Optional[OrdZSet]:
        """The change of ``distinct`` at this ``(t, i)`` for the change ``d`` of its input.

        The rows to look at: those of ``d``, and those this step touched before (``N(<=i-1)``)
        whose old trace changed at ``i`` (the cached old rows at time ``i``: any other row of
        ``N`` has a zero change here)."""
        i = self.time
        if len(d):
            self.seen.of(d.codes)
        ob, t = self.seen.rows, self.seen.times
        cands = [OrdZSet(d.data, np.ones(len(d), np.int64), d.codes, d.codec)] if len(d) else []
        if ob is not None and self.cum:
            at_i = np.flatnonzero(t == i)
            if len(at_i):
                kidx = np.unique(ob.key_index()[at_i])
                cands.append(OrdZSet(take(ob.keys, kidx), np.ones(len(kidx), np.int64),
                                     K.take(ob.kcodes, kidx), ob.kcodec))
        if not cands:
            return None
        u = cands[0] if len(cands) == 1 else OrdZSet.merge(cands)  # the rows to look at
        nw = d.row_weights(u.codes) if len(d) else np.zeros(len(u), np.int64)
        cw = self.cum.weights_of(u.codes)
        o_i = np.zeros(len(u), np.int64)    # O(<=i)
        o_i1 = np.zeros(len(u), np.int64)   # O(<=i-1)
        if ob is not None:
            ai, bi = K.intersect(u.codes, ob.kcodes)
            if len(ai):
                lo, hi = ob.offsets[bi], ob.offsets[bi + 1]
                rows = ranges(lo, hi - lo)
                owner = np.repeat(ai, hi - lo)
                tr, wr = t[rows], ob.weights[rows]
                np.add.at(o_i, owner, np.where(tr <= i, wr, 0))
                np.add.at(o_i1, owner, np.where(tr < i, wr, 0))
        delta = ((o_i + cw + nw > 0).astype(np.int64) - (o_i1 + cw > 0)
                 - (o_i > 0) + (o_i1 > 0))
        if len(d):
            self.cum.add(d)
            self.parts.append((i, d))
        keep = np.flatnonzero(delta)
        if len(keep) == 0:
            return None
        return OrdZSet(take(u.data, keep), delta[keep], K.take(u.codes, keep), u.codec)



class NestedDistinct(_NestedSet):
    """``distinct`` in a recursive body (rows sharded by row hash, as the operator it replaces)."""

    def __init__(self, ctx, inner: DistinctOperator):
        super().__init__(ctx, inner.schema, "distinct")
        self.schema = inner.schema

    def eval(self, z: ZSet) -> ZSet:
        out = self.step_rows(z.consolidate())
        return out if out is not None else ZSet.empty(self.schema)


class NestedKeySet(_NestedSet):
    """``distinct(keys(b))`` in a recursive body: the right side of semi / anti joins."""

    def __init__(self, ctx, inner: KeySetOperator):
        super().__init__(ctx, inner.key_schema, "distinct_keys")
        self.key_schema = inner.key_schema

    def eval(self, db: OrdIndexedZSet, *watermarks) -> OrdIndexedZSet:
        db = drop_null_keys(db)
        d = None
        if len(db):
            kw = np.add.reduceat(db.weights, db.offsets[:-1])
            nz = np.flatnonzero(kw)
            if len(nz):
                d = OrdZSet(take(db.keys, nz), kw[nz], K.take(db.kcodes, nz), db.kcodec)
        out = self.step_rows(d if d is not None else OrdZSet.empty(self.key_schema))
        if out is None:
            return OrdIndexedZSet.empty(self.key_schema, EMPTY_SCHEMA)
        n = len(out)
        return OrdIndexedZSet(out.data, out.codes, np.arange(n + 1, dtype=np.int64),
                              zero_column_batch(n), np.zeros(n, np.uint64), out.weights,
                              out.codec, codec_for(EMPTY_SCHEMA))


class NestedAggregate(_OneTrace):
    """``aggregate`` in a recursive body: per touched key, the group's aggregate at the four
    corners ``(t, i), (t, i-1), (t-1, i), (t-1, i-1)`` (module doc), from the old timed rows of
    the key and this step's changes. Cost: the size of the touched groups (whole groups are
    read, as a user aggregate reads them), for any mix of built-in and user aggregates."""

    state_attrs = ("old",)

    def __init__(self, ctx, inner, val_schema: pa.Schema):
        super().__init__(ctx)
        self.name = inner.name
        self.specs, self.out_schema = inner.specs, inner.out_schema
        nk = len(self.out_schema) - len(self.specs)
        self.key_schema = pa.schema(list(self.out_schema)[:nk])
        self.val_schema = val_schema
        self.old = TimedTrace(self.key_schema, val_schema, "nested_aggregate")
        self._reset()

    def _reset(self) -> None:
        self.cum = _Sum()
        self.parts: list = []
        self.seen = _Probed(self.old)

    def begin(self) -> None:
        super().begin()
        self._reset()

    def eval(self, d: OrdIndexedZSet) -> ZSet:
        i = self.time
        if len(d):
            self.seen.of(d.kcodes)
        ob, t = self.seen.rows, self.seen.times
        keys = [d.kcodes] if len(d) else []
        if ob is not None and self.cum:
            at_i = np.flatnonzero(t == i)
            if len(at_i):
                keys.append(K.take(ob.kcodes, np.unique(ob.key_index()[at_i])))
        if not keys:
            return ZSet.empty(self.out_schema)
        probe = _union_keys(*keys)                      # the groups to look at
        new_before = [b.select_keys(b.probe_keys(probe)[1]) for b in self.cum.batches]
        old_le, old_lt = [], []
        if ob is not None:
            sub = ob.select_keys(K.intersect(probe, ob.kcodes)[1])
            ts = times_of(sub)
            old_le = [self._untimed(at_times(sub, ts <= i))]
            old_lt = [self._untimed(at_times(sub, ts < i))]
        if len(d):
            self.cum.add(d)
            self.parts.append((i, d))
        corners = [(old_le + new_before + [d], 1), (old_lt + new_before, -1),
                   (old_le, -1), (old_lt, 1)]
        outs = [self._groups(parts, sign) for parts, sign in corners]
        outs = [o for o in outs if o is not None]
        if not outs:
            return ZSet.empty(self.out_schema)
        z = OrdZSet.merge(outs) if len(outs) > 1 else outs[0]
        return z if len(z) else ZSet.empty(self.out_schema)

    def _untimed(self, ix: Optional[OrdIndexedZSet]) -> Optional[OrdIndexedZSet]:
        """A loose timed selection summed over its times (a consolidated batch)."""
        if ix is None:
            return None
        vals = pa.RecordBatch.from_arrays(ix.vals.columns, schema=self.val_schema)
        return OrdIndexedZSet.from_parts(ix.key_rows(), vals, ix.weights)

    def _groups(self, parts: list, sign: int) -> Optional[OrdZSet]:
        """``sign`` times the aggregate rows of the groups of the sum of ``parts``."""
        parts = [p for p in parts if p is not None and len(p)]
        if not parts:
            return None
        g = parts[0] if len(parts) == 1 else OrdIndexedZSet.merge(parts)
        if len(g) == 0:
            return None
        rows, cols = compute_groups(self.specs, g.vals, g.weights, g.offsets)
        keep = np.flatnonzero(rows != 0)
        if len(keep) == 0:
            return None
        idx = pa.array(keep)
        data = pa.RecordBatch.from_arrays(
            list(g.keys.take(idx).columns) + [c.take(idx) for c in cols], schema=self.out_schema)
        return OrdZSet.from_loose(ZSet(data, np.full(len(keep), sign, np.int64)))



def _kind(node, nodes) -> Optional[str]:
    name = node.name
    if name.startswith("join("):
        return "join"
    if name in ("distinct", "distinct_keys"):
        return name
    if name.startswith("aggregate(") and nodes[node.inputs[0]].info.get("exchange"):
        return "aggregate"  # (an aggregate that pre-aggregates before its exchange is not)
    return None


def nestable(node, nodes) -> bool:
    """Whether the operator of ``node`` (in the body's node list ``nodes``) can run in a nested
    incremental body."""
    return _kind(node, nodes) is not None or node.name.startswith(LINEAR_NAMES)


def nest(node, nodes):
    """The factory of the nested form of ``node``'s operator (its own for a linear one)."""
    kind, factory = _kind(node, nodes), node.factory
    if kind == "join":
        return lambda ctx: NestedJoin(ctx, factory(ctx))
    if kind == "distinct":
        return lambda ctx: NestedDistinct(ctx, factory(ctx))
    if kind == "distinct_keys":
        return lambda ctx: NestedKeySet(ctx, factory(ctx))
    if kind == "aggregate":
        vals = nodes[node.inputs[0]].type.val
        return lambda ctx: NestedAggregate(ctx, factory(ctx), vals)
    return factory

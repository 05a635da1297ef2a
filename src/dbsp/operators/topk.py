"""topk: the first ``k`` values of every key in a given order, maintained incrementally.

Maths
-----
``topk(a)[key] = the first k values of a[key]`` ordered by ``order_by`` (ascending, or descending:
one flag for all columns, or one per column as in ``ORDER BY b ASC, c DESC``; nulls sort first
ascending, last descending), ties broken by the whole value row in ascending order, so the result
is deterministic. Weights are
multiplicities: a value of weight 3 fills three places (the last one may be cut, keeping part of
its weight); only values of positive weight count. With ``rank="r"`` each place becomes its own
row with ``r`` = 1..k (SQL ``ROW_NUMBER()``).

Like every non-linear group operator, only the keys ``T`` touched by ``Δa`` can change::

    Δtopk = Σ_{key in T} ( topk(I(a)[key]) - topk(z^-1(I(a))[key]) )

State: the input trace (a spine of :class:`OrdIndexedZSet`), its value rows stored with the
``order_by`` columns first so each key's values sit in place order. A step reads, for the touched
keys only, the values at the front (descending: the back) of the key in every batch, in windows
that grow until they hold ``k`` places of positive weight (:class:`TopKOperator`), before and after
adding ``Δa``; selects the top ``k`` of both with vectorised sorting (``np.lexsort`` over group,
order rank and value position) and emits the difference, consolidated so unchanged places cancel;
with a rank column, every place of a changed key is re-emitted. Cost: ``O(log group + k)`` a
touched key (plus retracted values still in front of its top ``k``), never the whole group. The
input is sharded by key first.

*Append-only input* (``append_only=True``: the input only ever inserts, as an event stream
does): a value outside a key's top ``k`` can never come back (only a deletion in front of it
could lift it), so the state is the integral of the top ``k`` places instead of every value:
each step reads the old tops of the touched keys, takes the new tops from the old ones plus
``Δa`` and stores the change of the tops, not ``Δa``. State ``O(keys * k)``; a deletion in the
input is an error (:class:`~dbsp.circuit.errors.RowError`), never a wrong result. With every
``order_by`` column ascending, a step also cuts ``Δa`` to its own top ``k`` per key first, and
:func:`topk_prefilter` (before the index and the exchange) drops the rows of ``Δa`` that ``k``
places of the same key beat on the first ``order_by`` column alone, so neither the index nor
the merge copies rows that cannot win.

*Ascending order*: the values of a key are stored in place order (``order_by`` first, ties by
the rest of the row), so the top ``k`` is read from the storage order (:func:`select_sorted`),
without encoding or sorting anything.

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> t = c.add_input("t", [("k", pa.string()), ("x", pa.int64())])
>>> top = t.index_by(["k"]).topk(2, ["x"], descending=True, rank="r").output()
>>> _ = t.insert([("a", 1), ("a", 7), ("a", 3)]); c.step(); sorted(top.view_dict())
[('a', 3, 2), ('a', 7, 1)]
>>> _ = t.insert([("a", 5)]); c.step(); sorted(top.view_dict())
[('a', 5, 2), ('a', 7, 1)]
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import KeyCodec
from ..algebra.schema import take
from ..circuit.errors import RowError
from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet, ZSet, ranges
from ..trace.probe import ValueWindows, codes_equal as _code_eq
from ..trace.spine import Spine
from .exchange import sharded


def dense_rank(codes) -> np.ndarray:
    """Rank of each code among the distinct codes (equal codes share a rank)."""
    if isinstance(codes, np.ndarray):
        return np.unique(codes, return_inverse=True)[1].astype(np.int64).reshape(-1)
    perm = K.argsort(codes)
    bounds = K.group_bounds(K.take(codes, perm))
    out = np.empty(len(perm), dtype=np.int64)
    out[perm] = np.repeat(np.arange(len(bounds) - 1, dtype=np.int64), np.diff(bounds))
    return out


def _descending_flags(descending, order_by: Sequence[str]) -> tuple:
    """One descending flag per ``order_by`` column, from one flag or a sequence of them."""
    if isinstance(descending, (bool, np.bool_)):
        return (bool(descending),) * len(order_by)
    if isinstance(descending, (list, tuple)):
        flags = tuple(descending)
        if len(flags) != len(order_by) or not all(isinstance(f, (bool, np.bool_))
                                                  for f in flags):
            raise ValueError(f"topk: descending must be one bool or one bool per order_by "
                             f"column ({len(order_by)}: {list(order_by)}), got {descending!r}")
        return tuple(bool(f) for f in flags)
    raise TypeError(f"topk: descending must be a bool or a list of bools, got {descending!r}")


def select_topk(g: OrdIndexedZSet, k: int, codec: KeyCodec, order_by: list[str],
                descending):
    """Top-k places of every group of a consolidated batch.

    ``descending``: one flag, or one per ``order_by`` column (then ``codec`` is unused and each
    column is ranked by its own codes). Returns ``(rows, counts, first_rank)`` in (group, rank)
    order: value row ``rows[i]`` fills ``counts[i]`` places starting at rank ``first_rank[i]``
    (1-based)."""
    empty = np.zeros(0, np.int64)
    cand = np.flatnonzero(g.weights > 0)
    if len(cand) == 0:
        return empty, empty, empty
    key_index = g.key_index()[cand]
    ob = g.vals.select(order_by).take(pa.array(cand))
    flags = _descending_flags(descending, order_by)
    if len(set(flags)) == 1:  # one direction: rank the order_by columns together
        r = dense_rank(codec.encode(ob.columns, ob.num_rows))
        ranks = [-r if flags[0] else r]
    else:  # a direction per column: rank each, the first column is the primary sort key
        ranks = []
        for c, f, desc in zip(ob.columns, ob.schema, flags):
            r = dense_rank(KeyCodec([f]).encode([c], ob.num_rows))
            ranks.append(-r if desc else r)
    o = np.lexsort((cand, *reversed(ranks), key_index))
    return _places(cand[o], key_index[o], g.weights[cand[o]], k)


def select_sorted(g: OrdIndexedZSet, k: int):
    """:func:`select_topk` of a batch whose values sit in place order already: every
    ``order_by`` column ascending and stored first, so a key's value codes order its values by
    ``order_by``, ties by the whole value row, as :func:`select_topk` ranks them. No encode, no
    sort: the places are running sums of the positive weights in storage order."""
    empty = np.zeros(0, np.int64)
    cand = np.flatnonzero(g.weights > 0)
    if len(cand) == 0:
        return empty, empty, empty
    return _places(cand, g.key_index()[cand], g.weights[cand], k)


def _places(rows: np.ndarray, ki: np.ndarray, w: np.ndarray, k: int):
    """Of ``rows`` in place order within their groups ``ki`` (positive weights ``w``): those
    that take one of their group's first ``k`` places, how many places each takes, and the
    first place of each (from 1)."""
    cs = np.cumsum(w)
    first = np.ones(len(ki), dtype=bool)
    first[1:] = ki[1:] != ki[:-1]
    starts = np.flatnonzero(first)
    base = np.repeat(cs[starts] - w[starts], np.diff(np.append(starts, len(ki))))
    before = cs - w - base  # places taken by earlier values of the same group
    cnt = np.clip(k - before, 0, w)
    sel = cnt > 0
    return rows[sel], cnt[sel], before[sel] + 1


def _top_batch(g: OrdIndexedZSet, rows: np.ndarray, counts: np.ndarray) -> OrdIndexedZSet:
    """The sub-batch of the selected rows with their counts as weights (still sorted)."""
    order = np.argsort(rows, kind="stable")
    rows, counts = rows[order], counts[order]
    ki = g.key_index()[rows]
    keys_idx, starts = np.unique(ki, return_index=True)
    offsets = np.append(starts, len(rows)).astype(np.int64)
    return OrdIndexedZSet(take(g.keys, keys_idx), K.take(g.kcodes, keys_idx), offsets,
                          take(g.vals, rows), K.take(g.vcodes, rows), counts.astype(np.int64),
                          g.kcodec, g.vcodec)


def _ranked_rows(g: OrdIndexedZSet, rows, counts, first, key_mask: np.ndarray, sign: int,
                 out_schema: pa.Schema) -> Optional[ZSet]:
    """One row per place (key ++ value ++ rank) of the keys in ``key_mask``."""
    ki = g.key_index()[rows]
    sel = key_mask[ki]
    rows, counts, first, ki = rows[sel], counts[sel], first[sel], ki[sel]
    if len(rows) == 0:
        return None
    rep = np.repeat(np.arange(len(rows)), counts)
    rank = ranges(first, counts)
    cols = (list(take(g.keys, ki[rep]).columns) + list(take(g.vals, rows[rep]).columns)
            + [pa.array(rank, pa.int64())])
    return ZSet(pa.RecordBatch.from_arrays(cols, schema=out_schema),
                np.full(len(rank), sign, dtype=np.int64))


class TopKOperator(Operator):
    """Top-k per key from the first ``k`` places of each touched key's values (see the module doc).

    The trace stores each value row with the ``order_by`` columns first, so a key's values sit in
    place order (ascending; reversed for ``descending``, ties aside). A step reads, for the
    touched keys, windows of values from the front (back) of every batch
    (:class:`~dbsp.trace.probe.ValueWindows`) until the known values hold ``k`` places of
    positive weight; descending, the tie group at the window's edge does not count, since its
    ascending tie order runs the other way. With a direction per column, the windows are read
    in the first column's direction and the edge tie group is taken over the leading columns
    of that direction (the order inside it is not the storage order). Cost: ``O(log group + k)`` a touched key, plus the
    retracted values in front of its top ``k``.
    """

    state_attrs = ('trace',)

    name = "topk"

    def __init__(self, ctx, k: int, order_by: list[str], descending, rank: Optional[str],
                 type_: IndexedType, out_schema: pa.Schema, append_only: bool = False):
        super().__init__(ctx)
        self.k, self.order_by, self.rank = k, order_by, rank
        self.append_only = append_only
        self.descending = _descending_flags(descending, order_by)
        self.type, self.out_schema = type_, out_schema
        vs = type_.val
        self.vorder = order_by + [n for n in vs.names if n not in order_by]
        self.ivals = pa.schema([vs.field(n) for n in self.vorder])
        self.ivcodec = KeyCodec(list(self.ivals))
        self.codec = KeyCodec([vs.field(c) for c in order_by])
        # windows are read from the side of the first column's direction; values are stored
        # ascending, so the read order is the place order only over the leading columns of that
        # same direction, and only when ascending is the tie order too: otherwise the tie group
        # (on those columns) at a window's edge may continue beyond it and does not count
        flags = self.descending
        self.read_last = flags[0]
        j = next((i for i, f in enumerate(flags) if f != flags[0]), len(flags))
        self.edge_cols = order_by[:j] if (flags[0] or j < len(flags)) else None
        self.edge_codec = KeyCodec([vs.field(c) for c in order_by[:j]])
        self.trace = Spine(name="topk")

    def _select(self, g):
        if g is None or len(g) == 0:
            e = np.zeros(0, np.int64)
            return e, e, e
        if not any(self.descending):  # values stored in place order (see select_sorted)
            return select_sorted(g, self.k)
        return select_topk(g, self.k, self.codec, self.order_by, self.descending)

    def _internal(self, d: OrdIndexedZSet) -> OrdIndexedZSet:
        """``d`` with the value columns in trace order (order_by first)."""
        if self.vorder == d.vals.schema.names:
            return d
        ki = d.key_index()
        return OrdIndexedZSet.from_parts(take(d.keys, ki), d.vals.select(self.vorder), d.weights,
                                         kcodec=d.kcodec, vcodec=self.ivcodec,
                                         kcodes=K.take(d.kcodes, ki))

    def _heads(self, d: OrdIndexedZSet) -> Optional[OrdIndexedZSet]:
        """The values of the trace that can be among the top ``k`` of each key of ``d``
        (consolidated; keys without such values absent)."""
        G = d.num_keys
        vw = ValueWindows(self.trace.batches(), d.kcodes)
        last = self.read_last
        todo = np.arange(G, dtype=np.int64)
        m = max(2 * self.k, 8)
        got = []  # (key positions, vals, vcodes, weights) of finished keys
        while len(todo):
            w = vw.read(todo, m, last)
            if w is None:
                break
            n = len(todo)
            pos = w.weights > 0
            vals = vw.vals(w, np.arange(len(w.k))) if len(w.k) else None
            trusted = pos
            lim_e = w.limited[w.k]
            if self.edge_cols is not None and lim_e.any():
                # the tie group nearest the window's edge may continue beyond it
                obc = self.edge_codec.encode([vals.column(c) for c in self.edge_cols], len(w.k))
                first = np.r_[True, w.k[1:] != w.k[:-1]]
                seg = np.cumsum(first) - 1
                # the edge is the key's last value read: its first in storage order when
                # reading from the back, its last when reading from the front
                ends = first if last else np.r_[first[1:], True]
                edge = np.flatnonzero(ends)[seg]
                edge_tie = _code_eq(obc, np.arange(len(w.k)), obc, edge)
                trusted = pos & ~(edge_tie & lim_e)
            places = np.bincount(w.k, np.where(trusted, w.weights, 0), minlength=n)
            done = ~w.limited | (places >= self.k)
            sel = np.flatnonzero(done[w.k])
            if len(sel):
                got.append((todo[w.k[sel]], take(vals, sel), K.take(w.vcodes, sel),
                            w.weights[sel]))
            todo = todo[~done]
            m *= 4
        if not got:
            return None
        gk = np.concatenate([g[0] for g in got])
        order = np.argsort(gk, kind="stable")  # each part is sorted by (key, value) already
        gk = gk[order]
        vals = take(pa.concat_batches([g[1] for g in got]), order)
        vcodes = K.take(K.concat([g[2] for g in got]), order)
        w = np.concatenate([g[3] for g in got])[order]
        bounds = np.flatnonzero(np.r_[True, gk[1:] != gk[:-1], True])
        uk = gk[bounds[:-1]]
        return OrdIndexedZSet(take(d.keys, uk), K.take(d.kcodes, uk), bounds.astype(np.int64),
                              vals, vcodes, w, d.kcodec, self.ivcodec)

    def _external(self, z: ZSet) -> ZSet:
        """Rows ``key ++ value [++ rank]`` back in the output column order."""
        return ZSet(z.data.select(self.out_schema.names)
                    if z.data.schema.names != self.out_schema.names else z.data, z.weights)

    def eval(self, d: OrdIndexedZSet) -> ZSet:
        if len(d) == 0:
            return ZSet.empty(self.out_schema)
        d = self._internal(d)
        if self.append_only and d.weights.min() < 0:
            i = int(np.argmin(d.weights))
            raise RowError("topk", "a deletion in the input of an append-only top-k (its state "
                                   "keeps only the top k values of each key)",
                           d.keys.slice(int(d.key_index()[i]), 1).to_pylist()[0])
        if self.append_only and not any(self.descending):
            # a value below the delta's own top k of its key cannot enter the key's top k (the
            # old tops only add places in front): keep the delta's tops only, found from its
            # storage order, so the merge below and its column copies see k rows per key
            rows, counts, _ = select_sorted(d, self.k)
            if len(rows) < len(d):
                d = _top_batch(d, rows, counts)
        old = self._heads(d)
        if self.append_only:  # the trace holds the tops: the new ones come from old + delta
            new = d if old is None or len(old) == 0 else OrdIndexedZSet.merge([old, d])
        else:
            self.trace.insert(d)
            new = self._heads(d)
        so, sn = self._select(old), self._select(new)
        parts = []
        if old is not None and len(so[0]):
            parts.append(_top_batch(old, so[0], so[1]).neg())
        if new is not None and len(sn[0]):
            parts.append(_top_batch(new, sn[0], sn[1]))
        if not parts:
            return ZSet.empty(self.out_schema)
        diff = OrdIndexedZSet.merge(parts) if len(parts) > 1 else parts[0]
        if len(diff) == 0:
            return ZSet.empty(self.out_schema)
        if self.append_only:
            self.trace.insert(diff)  # the change of the tops (places as weights)
        if self.rank is None:
            return self._external(diff.flatten())
        rschema = pa.schema(list(d.keys.schema) + list(self.ivals)
                            + [self.out_schema.field(self.rank)])
        out = []
        for g, s_, sign in ((old, so, -1), (new, sn, 1)):
            if g is None or len(g) == 0 or len(s_[0]) == 0:
                continue
            mask = np.zeros(g.num_keys, dtype=bool)
            ai, _ = K.intersect(g.kcodes, diff.kcodes)
            mask[ai] = True
            z = _ranked_rows(g, *s_, mask, sign, rschema)
            if z is not None:
                out.append(z)
        if not out:
            return ZSet.empty(self.out_schema)
        if len(out) == 1:
            return self._external(out[0])
        data = pa.concat_batches([z.data for z in out])
        return self._external(ZSet(data, np.concatenate([z.weights for z in out])))

    def clock_start(self) -> None:
        self.trace.clear()

    def state_rows(self) -> int:
        return len(self.trace)


def _int_view(col) -> Optional[np.ndarray]:
    """The values of a non-null integer or temporal column as numpy integers (their order);
    None for other columns."""
    t = col.type
    if col.null_count or not (pa.types.is_integer(t) or pa.types.is_temporal(t)):
        return None
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        col = col.view(pa.int32())
    elif pa.types.is_temporal(t):
        col = col.view(pa.int64())
    return col.to_numpy(zero_copy_only=False)


def _pack(cols: list) -> Optional[tuple[np.ndarray, int]]:
    """Integer columns packed into one uint64 per row that sorts as the rows do (each column
    offset by its minimum, in as many bits as its range needs, the first column highest), and
    the bit width of the last column; None when they need more than 64 bits."""
    spans = []
    for x in cols:
        lo, hi = int(x.min()), int(x.max())
        spans.append((lo, (hi - lo).bit_length()))
    if sum(b for _, b in spans) > 64:
        return None
    code = np.zeros(len(cols[0]), dtype=np.uint64)
    for x, (lo, b) in zip(cols, spans):
        if b:  # x - lo in [0, 2^b), exact in uint64 arithmetic (modulo 2^64)
            d = x.astype(np.uint64) - np.uint64(lo % (1 << 64))
            code = d if b == 64 else (code << np.uint64(b)) | d
    return code, spans[-1][1]


class TopKPrefilterOperator(Operator):
    """Drops the rows of an insert-only delta that its own rows push out of every top ``k``:
    a row of some key whose ``first`` value (the leading ``order_by`` column, ascending) has
    ``k`` places of the same key strictly before it. Whatever the other order columns and the
    tie order, those places beat it, and an append-only top-k (whose earlier values only add
    places in front) can never take it. Stateless, so it runs before the index and the
    exchange, which then encode and move fewer rows (q18: about a third of the bids).

    Only on deltas it can read cheaply: key and ``first`` columns of non-null integers or
    temporal values, every weight positive; any other delta passes unchanged (a deletion then
    reaches the top-k, which reports it)."""

    name = "topk.prefilter"
    passes_empty = True

    def __init__(self, ctx, key: list[str], first: str, k: int):
        super().__init__(ctx)
        self.key, self.first, self.k = key, first, k

    def eval(self, z: ZSet) -> ZSet:
        n = len(z)
        if n == 0 or (z.weights <= 0).any() or int(z.weights.sum()) <= self.k:
            return z  # a deletion, or too few places for any row to be pushed out
        v = _int_view(z.data.column(self.first))
        ks = [_int_view(z.data.column(c)) for c in self.key]
        if v is None or any(x is None for x in ks):
            return z
        packed = _pack([*ks, v])
        new_key = np.zeros(n, dtype=bool)
        new_key[0] = True
        if packed is not None:  # one sort of one u64 per row: (key, value) offsets in bits
            code, vbits = packed
            order = np.argsort(code)
            cs = code[order]
            kc = cs >> np.uint64(vbits) if vbits < 64 else np.zeros_like(cs)
            new_key[1:] = kc[1:] != kc[:-1]
            new_val = new_key.copy()
            new_val[1:] |= cs[1:] != cs[:-1]
        else:
            order = np.lexsort((v, *reversed(ks)))
            for x in ks:
                xs = x[order]
                new_key[1:] |= xs[1:] != xs[:-1]
            vs = v[order]
            new_val = new_key.copy()
            new_val[1:] |= vs[1:] != vs[:-1]
        w = z.weights[order]
        before = np.cumsum(w) - w  # places of the rows sorted before each row
        key_base = np.maximum.accumulate(np.where(new_key, before, 0))
        val_base = np.maximum.accumulate(np.where(new_val, before, 0))
        keep = val_base - key_base < self.k  # places of the key strictly before the value
        if keep.all():
            return z
        idx = np.sort(order[keep])
        return ZSet(take(z.data, idx), z.weights[idx])


def topk_prefilter(stream, key: Sequence[str], first: str, k: int):
    """The rows of an insert-only stream that may enter a top ``k`` per ``key`` ordered by
    ``first`` ascending first (:class:`TopKPrefilterOperator`); for ``topk(...,
    append_only=True)``."""
    key = list(key)
    return stream.circuit.add_node(
        f"topk.prefilter({k})", lambda ctx: TopKPrefilterOperator(ctx, key, first, int(k)),
        [stream], stream.type)


def topk(stream, k: int, order_by: Sequence[str], descending=False,
         rank: Optional[str] = None, append_only: bool = False):
    """The first ``k`` values of each key by ``order_by`` (see the module doc); ``descending``:
    one bool, or one per ``order_by`` column; ``append_only``: the input never deletes, so
    only each key's top ``k`` is kept in state."""
    if not isinstance(stream.type, IndexedType):
        raise TypeError(f"topk needs an indexed stream (use .index_by([...]) first), got "
                        f"{stream.type.describe()}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"topk: k must be a positive integer, got {k!r}")
    if isinstance(order_by, str):
        order_by = [order_by]
    order_by = list(order_by)
    vs = stream.val_schema
    if not order_by:
        raise ValueError("topk: order_by needs at least one value column")
    for c in order_by:
        if c not in vs.names:
            raise KeyError(f"topk: no value column '{c}' to order by (value columns: "
                           f"{vs.names})")
    descending = _descending_flags(descending, order_by)
    flat = stream.type.flat_schema
    if rank is not None:
        if rank in flat.names:
            raise ValueError(f"topk: rank column '{rank}' clashes with a column of {flat.names}")
        out = pa.schema(list(flat) + [pa.field(rank, pa.int64(), nullable=False)])
    else:
        out = flat
    t = stream.type
    s = sharded(stream)
    return stream.circuit.add_node(
        f"topk({k})", lambda ctx: TopKOperator(ctx, int(k), order_by, descending, rank, t, out,
                                               bool(append_only)),
        [s], ZSetType(out))


__all__ = ["topk", "topk_prefilter", "TopKPrefilterOperator", "TopKOperator", "select_topk", "select_sorted", "dense_rank"]

"""Value probes of an indexed trace: the weight of given ``(key, value)`` pairs, and the first
(or last) value of positive weight of given keys, without reading whole groups.

A spine of :class:`~dbsp.trace.batch.OrdIndexedZSet` batches keeps the values of every key sorted
by value code, in each batch. Operators whose result per key depends on a few values of the group
(min / max: the extreme value of positive weight; count distinct: whether a value's weight
crosses zero) ask these probes instead of :meth:`Spine.lookup`, which returns whole groups.

Design
------
* :func:`pair_weights`: for sorted ``(key, value)`` code pairs, per batch: the matching keys
  (:meth:`BatchReader.match`), then a vectorised binary search of each pair's value inside its
  key's value range (native ``range_lower_bound``: a binary search per pair, or a gallop from
  the previous pair's answer when it probes the same key). Cost ``O(pairs * log(group) *
  batches)``.
* :func:`first_positive`: the first (``last=True``: last) value of positive *consolidated*
  weight of each key. A value's weight is spread over the batches, so each batch contributes a
  window of ``m`` values at the key's start (end); a value no further than the nearest window end
  of the batches not yet exhausted has been seen in every batch, so its weight is known. Keys
  whose known values all have non-positive weight double their window and try again. Cost
  ``O(log(group) + m)`` per key and batch, ``m`` bounded by the values retracted at the front.

Both read in-memory batches through their arrays; a batch in a layer file answers ``match`` with
an in-memory selection of the matched keys (which reads their groups from the file).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import Codes
from ..algebra.schema import take
from .batch import OrdIndexedZSet, match_batches, ranges

__all__ = ["pair_weights", "first_positive", "codes_le", "ValueWindows", "Window", "rows_from",
           "codes_equal"]


def _search_u64(vcodes: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                target: np.ndarray) -> np.ndarray:
    """For each ``i``: the first position in ``[lo[i], hi[i])`` of ``vcodes`` whose code is
    ``>= target[i]`` (vectorised bisection; each range sorted)."""
    lo, hi = lo.copy(), hi.copy()
    while True:
        act = lo < hi
        if not act.any():
            return lo
        mid = (lo + hi) >> 1
        midc = np.where(act, mid, 0)
        less = act & (vcodes[midc] < target)
        lo = np.where(less, mid + 1, lo)
        hi = np.where(act & ~less, mid, hi)


def _fixed_rows(c) -> Optional[np.ndarray]:
    """Var-length codes whose rows all have one length as a ``(n, width)`` uint8 matrix (the
    codes of fixed-width columns wider than 8 bytes); None otherwise."""
    lens = np.diff(c.offsets)
    if len(lens) == 0 or not (lens == lens[0]).all():
        return None
    return c.data[c.offsets[:-1, None] + np.arange(int(lens[0]))]


def _cmp_var(a, b) -> tuple[np.ndarray, np.ndarray]:
    """``(a < b, a == b)`` of two aligned var-length code arrays (vectorised when both hold
    rows of one common length)."""
    fa, fb = _fixed_rows(a), _fixed_rows(b)
    if fa is not None and fb is not None and fa.shape[1] == fb.shape[1]:
        diff = fa != fb
        at = np.argmax(diff, axis=1)
        r = np.arange(len(fa))
        eq = ~diff[r, at]
        return ~eq & (fa[r, at] < fb[r, at]), eq
    la, lb = a.to_list(), b.to_list()
    return (np.asarray([x < y for x, y in zip(la, lb)], dtype=bool),
            np.asarray([x == y for x, y in zip(la, lb)], dtype=bool))


def codes_equal(a: Codes, ai: np.ndarray, b: Codes, bi: np.ndarray) -> np.ndarray:
    """Element-wise ``a[ai] == b[bi]``."""
    if isinstance(a, np.ndarray):
        return a[ai] == b[bi]
    if len(ai) == 0:
        return np.zeros(0, dtype=bool)
    return _cmp_var(K.take(a, ai), K.take(b, bi))[1]


def pair_weights(batches: Sequence, kcodes: Codes, key_of: np.ndarray, vcodes: Codes
                 ) -> np.ndarray:
    """The total weight over ``batches`` (a spine snapshot) of each ``(key, value)`` pair.

    ``kcodes``: sorted distinct key codes; pair ``i`` is key ``kcodes[key_of[i]]`` with value code
    ``vcodes[i]`` (any order). Returns int64, one weight per pair (0 where absent).
    """
    n = len(key_of)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    u64 = isinstance(vcodes, np.ndarray)
    for b, pi, ki in match_batches(batches, kcodes):
        pos = np.full(len(kcodes), -1, dtype=np.int64)
        pos[pi] = ki
        bk = pos[key_of]
        q = np.flatnonzero(bk >= 0)
        if len(q) == 0:
            continue
        lo, hi = b.offsets[bk[q]], b.offsets[bk[q] + 1]
        at = K.range_lower_bound(b.vcodes, lo, hi, vcodes[q] if u64 else K.take(vcodes, q))
        inside = at < hi
        q, at = q[inside], at[inside]
        hit = codes_equal(b.vcodes, at, vcodes, q)
        out[q[hit]] += b.weights[at[hit]]
    return out


def codes_le(a: Codes, b: Codes) -> np.ndarray:
    """Element-wise ``a <= b`` of two aligned code arrays."""
    if isinstance(a, np.ndarray):
        return a <= b
    if len(a) == 0:
        return np.zeros(0, dtype=bool)
    lt, eq = _cmp_var(a, b)
    return lt | eq


def _per_key_extreme(keys: np.ndarray, codes: Codes, largest: bool) -> tuple[np.ndarray, Codes]:
    """For code rows tagged with a key position: ``(distinct keys, the smallest (``largest``:
    largest) code of each)``."""
    order = K.argsort(keys.astype(np.uint64), codes)
    ks = keys[order]
    cs = K.take(codes, order)
    if largest:
        at = np.flatnonzero(np.r_[ks[1:] != ks[:-1], True])
    else:
        at = np.flatnonzero(np.r_[True, ks[1:] != ks[:-1]])
    return ks[at], K.take(cs, at)


class Window:
    """The values read by one :meth:`ValueWindows.read`: consolidated ``(key, value)`` entries
    (non-zero weight) sorted by key then value code, each one's weight fully known (inside the
    frontier of its key).

    ``keys``: the probe positions read; ``k`` (index into ``keys``), ``vcodes``, ``weights``,
    ``src`` / ``rows`` (batch number and row of one copy of the value); ``limited``: per entry of
    ``keys``, whether some batch has values beyond the window (the answer may need more)."""

    __slots__ = ("keys", "k", "vcodes", "weights", "src", "rows", "limited")

    def __init__(self, keys, k, vcodes, weights, src, rows, limited):
        self.keys, self.k, self.vcodes, self.weights = keys, k, vcodes, weights
        self.src, self.rows, self.limited = src, rows, limited


class ValueWindows:
    """Windows of the first (``last``: last) ``m`` values of probe keys in every batch of a
    spine snapshot, consolidated (see the module doc). ``kcodes``: sorted distinct key codes."""

    def __init__(self, batches: Sequence, kcodes: Codes):
        self.G = len(kcodes)
        self.matched = []  # per batch: (in-memory batch, its key position per probe key or -1)
        for b, pi, ki in match_batches(batches, kcodes):
            pos = np.full(self.G, -1, dtype=np.int64)
            pos[pi] = ki
            self.matched.append((b, pos))

    def read(self, todo: np.ndarray, m: int, last: bool) -> Optional[Window]:
        ks, vs, ws, bs, rs, fk, fv = [], [], [], [], [], [], []
        for bno, (b, pos) in enumerate(self.matched):
            bk = pos[todo]
            sel = np.flatnonzero(bk >= 0)
            if len(sel) == 0:
                continue
            lo, hi = b.offsets[bk[sel]], b.offsets[bk[sel] + 1]
            cnt = np.minimum(hi - lo, m)
            rows = ranges(hi - cnt if last else lo, cnt)
            ks.append(np.repeat(sel, cnt))
            vs.append(K.take(b.vcodes, rows))
            ws.append(b.weights[rows])
            bs.append(np.full(len(rows), bno, dtype=np.int64))
            rs.append(rows)
            more = np.flatnonzero(hi - lo > m)  # this batch has values beyond its window
            if len(more):
                fk.append(sel[more])
                fv.append(K.take(b.vcodes, (hi - m)[more] if last else (lo + m - 1)[more]))
        if not ks:
            return None
        kq, vq, wq = np.concatenate(ks), K.concat(vs), np.concatenate(ws)
        bq, rq = np.concatenate(bs), np.concatenate(rs)
        perm, gw = K.sort_consolidate(kq.astype(np.uint64), vq, wq)  # by (key, value)
        gk, gv = kq[perm], K.take(vq, perm)
        limited = np.zeros(len(todo), dtype=bool)
        keep = np.ones(len(gk), dtype=bool)
        if fk:
            # a value is known only up to the nearest window end of the unexhausted batches
            lk, lv = _per_key_extreme(np.concatenate(fk), K.concat(fv), largest=last)
            limited[lk] = True
            lim_at = np.full(len(todo), -1, dtype=np.int64)
            lim_at[lk] = np.arange(len(lk), dtype=np.int64)
            q = np.flatnonzero(limited[gk])
            if len(q):
                lim = K.take(lv, lim_at[gk[q]])
                within = codes_le(lim, K.take(gv, q)) if last else codes_le(K.take(gv, q), lim)
                keep[q[~within]] = False
        at = np.flatnonzero(keep)
        return Window(todo, gk[at], K.take(gv, at), gw[at], bq[perm[at]], rq[perm[at]], limited)

    def vals(self, w: Window, idx: np.ndarray):
        """The value rows of entries ``idx`` of a window (a record batch, in that order)."""
        pieces, where, base = [], np.empty(len(idx), dtype=np.int64), 0
        src = w.src[idx]
        for bno in np.unique(src).tolist():
            sel = np.flatnonzero(src == bno)
            pieces.append(take(self.matched[bno][0].vals, w.rows[idx[sel]]))
            where[sel] = base + np.arange(len(sel))
            base += len(sel)
        if not pieces:
            return None
        got = pa.concat_batches(pieces) if len(pieces) > 1 else pieces[0]
        return take(got, where)


def first_positive(batches: Sequence, kcodes: Codes, last: bool = False, window: int = 4
                   ) -> tuple[np.ndarray, list, np.ndarray]:
    """The first (``last``: last) value of positive consolidated weight of each key.

    ``kcodes``: sorted distinct key codes. Returns ``(found, sources, rows)``: ``found[i]`` whether
    key ``i`` has such a value; for the found keys (in key order), the value is row ``rows[j]``
    of the in-memory batch ``sources[j]``.
    """
    G = len(kcodes)
    found = np.zeros(G, dtype=bool)
    src_of: list = [None] * G
    row_of = np.zeros(G, dtype=np.int64)
    vw = ValueWindows(batches, kcodes)
    todo = np.arange(G, dtype=np.int64)
    m = window
    while len(todo):
        w = vw.read(todo, m, last)
        if w is None:
            break
        cand = np.flatnonzero(w.weights > 0)
        done = ~w.limited  # every batch exhausted: the answer (or its absence) is final
        if len(cand):
            ck = w.k[cand]
            edge = np.r_[ck[1:] != ck[:-1], True] if last else np.r_[True, ck[1:] != ck[:-1]]
            pick = cand[edge]
            pk = w.k[pick]
            keys = todo[pk]
            found[keys] = True
            row_of[keys] = w.rows[pick]
            for key, bno in zip(keys.tolist(), w.src[pick].tolist()):
                src_of[key] = vw.matched[bno][0]
            done[pk] = True
        todo = todo[~done]
        m *= 4
    keys = np.flatnonzero(found)
    return found, [src_of[k] for k in keys.tolist()], row_of[keys]


def _time_view(col: pa.Array) -> np.ndarray:
    """A zero-copy numpy view of a non-null time / integer column's physical values."""
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        col = col.view(pa.int64())
    elif pa.types.is_date32(t):
        col = col.view(pa.int32())
    return col.to_numpy(zero_copy_only=False)


def rows_from(batches: Sequence, keys, kcodes: Codes, lo: np.ndarray):
    """The consolidated rows of each key ``kcodes[i]`` whose leading value column (a non-null
    time or integer, by which each key's values are sorted) is ``>= lo[i]``: an
    :class:`~dbsp.trace.batch.OrdIndexedZSet` (keys without such rows absent), or None.

    Per batch: the matched keys' value ranges, a vectorised bisection on the time column inside
    each, and the suffix from there: ``O(log group + rows read)`` a key. ``keys``: the key
    columns of ``kcodes`` (a record batch, row-aligned). Also returns a bool per key: whether
    every row of the key was read (nothing lies before ``lo``)."""
    parts = []
    whole = np.ones(len(kcodes), dtype=bool)
    for b, pi, ki in match_batches(batches, kcodes):
        lo_r, hi_r = b.offsets[ki], b.offsets[ki + 1]
        t = _time_view(b.vals.column(0))
        at = _search_u64(t, lo_r, hi_r, lo[pi].astype(t.dtype, copy=False)
                         if t.dtype.kind == "i" else lo[pi])
        cnt = hi_r - at
        whole[pi[at > lo_r]] = False
        has = np.flatnonzero(cnt > 0)
        if len(has) == 0:
            continue
        rows = ranges(at[has], cnt[has])
        offsets = np.zeros(len(has) + 1, np.int64)
        np.cumsum(cnt[has], out=offsets[1:])
        kk = pi[has]
        parts.append(OrdIndexedZSet(take(keys, kk), K.take(kcodes, kk), offsets,
                                    take(b.vals, rows), K.take(b.vcodes, rows), b.weights[rows],
                                    b.kcodec, b.vcodec))
    if not parts:
        return None, whole
    m = OrdIndexedZSet.merge(parts) if len(parts) > 1 else parts[0]
    return (m if len(m) else None), whole

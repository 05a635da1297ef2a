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
  key's value range (``log2`` of the largest range numpy passes over all pairs at once, for u64
  value codes). Cost ``O(pairs * log(group) * batches)``.
* :func:`first_positive`: the first (``last=True``: last) value of positive *consolidated*
  weight of each key. A value's weight is spread over the batches, so each batch contributes a
  window of ``m`` values at the key's start (end); a value no further than the nearest window end
  of the batches not yet exhausted has been seen in every batch, so its weight is known. Keys
  whose known values all have non-positive weight double their window and try again. Cost
  ``O(log(group) + m)`` per key and batch, ``m`` bounded by the values retracted at the front.

Both read in-memory batches through their arrays; a batch in a layer file answers ``match`` with
an in-memory selection of the matched keys (which reads their groups from the file).
Var-length value codes (strings, decimals, wide types) take a per-pair search loop.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..algebra import kernels as K
from ..algebra.codes import Codes
from .batch import match_batches, ranges

__all__ = ["pair_weights", "first_positive", "codes_le"]


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


def _search_var(vcodes, lo: np.ndarray, hi: np.ndarray, target) -> np.ndarray:
    """:func:`_search_u64` for var-length codes (a loop over the pairs)."""
    out = np.empty(len(lo), dtype=np.int64)
    for i in range(len(lo)):
        a, b = int(lo[i]), int(hi[i])
        if a >= b:
            out[i] = a
            continue
        seg = type(vcodes)(vcodes.offsets[a:b + 1], vcodes.data)
        out[i] = a + int(K.lower_bound(seg, K.take(target, np.asarray([i], np.int64)))[0])
    return out


def _code_eq(a: Codes, ai: np.ndarray, b: Codes, bi: np.ndarray) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a[ai] == b[bi]
    ta, tb = K.take(a, ai), K.take(b, bi)
    la, lb = np.diff(ta.offsets), np.diff(tb.offsets)
    eq = la == lb
    for i in np.flatnonzero(eq):
        eq[i] = ta.row(i) == tb.row(i)
    return eq


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
        if u64:
            at = _search_u64(b.vcodes, lo, hi, vcodes[q])
        else:
            at = _search_var(b.vcodes, lo, hi, K.take(vcodes, q))
        inside = at < hi
        q, at = q[inside], at[inside]
        hit = _code_eq(b.vcodes, at, vcodes, q)
        out[q[hit]] += b.weights[at[hit]]
    return out


def codes_le(a: Codes, b: Codes) -> np.ndarray:
    """Element-wise ``a <= b`` of two aligned code arrays."""
    if isinstance(a, np.ndarray):
        return a <= b
    return np.asarray([x <= y for x, y in zip(a.to_list(), b.to_list())], dtype=bool)


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
    matched = []  # per batch: (in-memory batch, its key position of each probe key or -1)
    for b, pi, ki in match_batches(batches, kcodes):
        pos = np.full(G, -1, dtype=np.int64)
        pos[pi] = ki
        matched.append((b, pos))
    todo = np.arange(G, dtype=np.int64)
    m = window
    while len(todo) and matched:
        ks, vs, ws, bs, rs, fk, fv = [], [], [], [], [], [], []
        for bno, (b, pos) in enumerate(matched):
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
            break
        kq, vq, wq = np.concatenate(ks), K.concat(vs), np.concatenate(ws)
        bq, rq = np.concatenate(bs), np.concatenate(rs)
        perm, gw = K.sort_consolidate(kq.astype(np.uint64), vq, wq)  # by (key, value)
        gk, gv = kq[perm], K.take(vq, perm)
        ok = gw > 0
        limited = np.zeros(len(todo), dtype=bool)
        if fk:
            # a value is known only up to the nearest window end of the unexhausted batches
            lk, lv = _per_key_extreme(np.concatenate(fk), K.concat(fv), largest=last)
            limited[lk] = True
            lim_at = np.full(len(todo), -1, dtype=np.int64)
            lim_at[lk] = np.arange(len(lk), dtype=np.int64)
            q = np.flatnonzero(ok & limited[gk])
            if len(q):
                lim = K.take(lv, lim_at[gk[q]])
                within = codes_le(lim, K.take(gv, q)) if last else codes_le(K.take(gv, q), lim)
                ok[q[~within]] = False
        cand = np.flatnonzero(ok)
        done = ~limited  # every batch exhausted: the answer (or its absence) is final
        if len(cand):
            ck = gk[cand]
            edge = np.r_[ck[1:] != ck[:-1], True] if last else np.r_[True, ck[1:] != ck[:-1]]
            pick = cand[edge]
            pk = gk[pick]
            keys = todo[pk]
            found[keys] = True
            row_of[keys] = rq[perm[pick]]
            for k, bno in zip(keys.tolist(), bq[perm[pick]].tolist()):
                src_of[k] = matched[bno][0]
            done[pk] = True
        todo = todo[~done]
        m *= 4
    keys = np.flatnonzero(found)
    return found, [src_of[k] for k in keys.tolist()], row_of[keys]

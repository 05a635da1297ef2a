"""A naive, obviously-right model of every operator, for tests: Z-sets as ``dict[row, weight]``.

A Z-set here is a ``dict`` from a row tuple (Python values: ``int``, ``float``, ``str``, ``bool``,
``Decimal``, ``date``, ``None`` ...) to a non-zero ``int`` weight. Every function returns a new
normalised dict (no zero weights) and computes the *whole* result from its whole inputs: the
engine's incremental output is checked against ``reference(I_t) - reference(I_{t-1})`` and its
integrated output against ``reference(I_t)``.

Conventions shared with the engine:

* indexing by key columns reorders a row to ``key ++ other columns`` (``index_by`` + ``flatten``);
* joins follow SQL: a key with a null column matches nothing;
* orders put nulls first (ascending), values in their natural Python order;
* aggregates follow SQL null semantics (see :func:`aggregate`).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable, Optional, Sequence

ZDict = dict


# -- Z-set algebra ------------------------------------------------------------------------------

def zset(pairs: Iterable[tuple[tuple, int]] | dict) -> ZDict:
    """Normalise ``(row, weight)`` pairs (or a dict) into a Z-set: weights summed, zeros gone."""
    out: dict = defaultdict(int)
    items = pairs.items() if isinstance(pairs, dict) else pairs
    for r, w in items:
        out[tuple(r)] += int(w)
    return {r: w for r, w in out.items() if w != 0}


def add(*zs: ZDict) -> ZDict:
    out: dict = defaultdict(int)
    for z in zs:
        for r, w in z.items():
            out[r] += w
    return {r: w for r, w in out.items() if w != 0}


def neg(z: ZDict) -> ZDict:
    return {r: -w for r, w in z.items()}


def sub(a: ZDict, b: ZDict) -> ZDict:
    return add(a, neg(b))


def integrate(deltas: Iterable[ZDict]) -> ZDict:
    return add(*deltas)


# -- linear operators ---------------------------------------------------------------------------

def map_rows(z: ZDict, f: Callable[[tuple], tuple]) -> ZDict:
    return zset((f(r), w) for r, w in z.items())


def filter_rows(z: ZDict, p: Callable[[tuple], Any]) -> ZDict:
    return {r: w for r, w in z.items() if p(r)}


def flat_map_rows(z: ZDict, f: Callable[[tuple], Iterable[tuple]]) -> ZDict:
    return zset((o, w) for r, w in z.items() for o in f(r))


def reorder(z: ZDict, key: Sequence[int]) -> ZDict:
    """``index_by(key).flatten()``: rows become ``key ++ other columns``."""
    return zset((_kv(r, key)[0] + _kv(r, key)[1], w) for r, w in z.items())


def _kv(r: tuple, key: Sequence[int]) -> tuple[tuple, tuple]:
    ks = set(key)
    return tuple(r[i] for i in key), tuple(v for i, v in enumerate(r) if i not in ks)


def index(z: ZDict, key: Sequence[int]) -> dict[tuple, dict[tuple, int]]:
    """``key -> {value row: weight}``."""
    out: dict = defaultdict(dict)
    for r, w in z.items():
        k, v = _kv(r, key)
        out[k][v] = out[k].get(v, 0) + w
    return {k: {v: w for v, w in vs.items() if w} for k, vs in out.items()
            if any(w for w in vs.values())}


# -- non-linear operators -----------------------------------------------------------------------

def distinct(z: ZDict) -> ZDict:
    return {r: 1 for r, w in z.items() if w > 0}


def _has_null(k: tuple) -> bool:
    return any(v is None for v in k)


def join(a: ZDict, b: ZDict, ka: Sequence[int], kb: Sequence[int]) -> ZDict:
    """Inner equi-join: rows ``key ++ a's other columns ++ b's other columns``."""
    ia, ib = index(a, ka), index(b, kb)
    out = []
    for k, avs in ia.items():
        if _has_null(k) or k not in ib:
            continue
        for av, aw in avs.items():
            for bv, bw in ib[k].items():
                out.append((k + av + bv, aw * bw))
    return zset(out)


def _positive_keys(b: ZDict, kb: Sequence[int]) -> set:
    ib = index(b, kb)
    return {k for k, vs in ib.items() if sum(vs.values()) > 0 and not _has_null(k)}


def semijoin(a: ZDict, b: ZDict, ka: Sequence[int], kb: Sequence[int]) -> ZDict:
    """Rows ``key ++ a's other columns`` whose key has positive total weight in ``b``."""
    keys = _positive_keys(b, kb)
    return zset((_kv(r, ka)[0] + _kv(r, ka)[1], w) for r, w in a.items() if _kv(r, ka)[0] in keys)


def antijoin(a: ZDict, b: ZDict, ka: Sequence[int], kb: Sequence[int]) -> ZDict:
    return sub(reorder(a, ka), semijoin(a, b, ka, kb))


def left_join(a: ZDict, b: ZDict, ka: Sequence[int], kb: Sequence[int], b_vals: int) -> ZDict:
    """Inner join plus the rows of ``a`` without a (positive) match, padded with ``b_vals``
    nulls."""
    pad = (None,) * b_vals
    return add(join(a, b, ka, kb), {r + pad: w for r, w in antijoin(a, b, ka, kb).items()})


def _sum(vals: list[tuple[Any, int]]):
    total: Any = 0
    for v, w in vals:
        total = total + v * w
    return total


def aggregate(z: ZDict, key: Sequence[int], aggs: Sequence[tuple[Any, Optional[int]]]) -> ZDict:
    """``key ++ one value per aggregate`` for every group of non-zero total weight.

    ``aggs``: ``(kind, column)`` with column indices into the *value* row (``key`` removed), kinds
    as in :mod:`dbsp.operators.aggregate`, or ``(callable(list of (value row, weight)), column)``.
    SQL semantics: count(None) = Σ w; count(c) = Σ w over non-null c; sum = Σ w·c over non-null
    (null when that count is 0); avg = sum / count (float); min / max / count_distinct over the
    non-null values of positive total weight in the group's projection on the column (the
    weights of rows with equal values summed; min / max null when there are none).
    """
    out = {}
    for k, vs in index(z, key).items():
        total = sum(vs.values())
        if total == 0:
            continue
        res = []
        for kind, c in aggs:
            rows = sorted(vs.items(), key=lambda p: row_key(p[0]))
            if callable(kind):
                res.append(kind(rows if c is None else [((v[c],), w) for v, w in rows]))
                continue
            if kind == "count":
                res.append(total if c is None else sum(w for v, w in rows if v[c] is not None))
                continue
            nn = [(v[c], w) for v, w in rows if v[c] is not None]
            n = sum(w for _, w in nn)
            col: dict = {}  # the projection on the column: weights of equal values summed
            for x, w in nn:
                col[x] = col.get(x, 0) + w
            pos = [x for x, w in col.items() if w > 0]
            if kind == "sum":
                res.append(None if n == 0 else _sum(nn))
            elif kind == "avg":
                res.append(None if n == 0 else float(_sum(nn)) / n)
            elif kind == "min":
                res.append(min(pos, key=value_key) if pos else None)
            elif kind == "max":
                res.append(max(pos, key=value_key) if pos else None)
            elif kind == "count_distinct":
                res.append(len(set(pos)))
            else:
                raise ValueError(kind)
        out[k + tuple(res)] = 1
    return out


def value_key(v: Any) -> tuple:
    """Sort key of one value in the engine's order: nulls first."""
    return (0,) if v is None else (1, v)


def row_key(r: tuple) -> tuple:
    return tuple(value_key(v) for v in r)


def topk(z: ZDict, key: Sequence[int], k: int, order_by: Sequence[int], descending: bool = False,
         rank: bool = False) -> ZDict:
    """The first ``k`` places of every group (rows ``key ++ value [++ rank]``).

    ``order_by`` indexes the value row. Values are ordered by ``order_by`` (reversed when
    ``descending``; ``descending`` may also be one flag per ``order_by`` column), ties by the
    whole value row ascending; a value of weight ``w > 0`` fills ``w`` places; values of
    non-positive weight are ignored.
    """
    flags = [descending] * len(order_by) if isinstance(descending, bool) else list(descending)
    out = []
    for kk, vs in index(z, key).items():
        cand = sorted(((v, w) for v, w in vs.items() if w > 0), key=lambda p: row_key(p[0]))
        for i, desc in reversed(list(zip(order_by, flags))):  # stable sorts, last column first
            cand.sort(key=lambda p, i=i: value_key(p[0][i]), reverse=desc)
        placed = 0
        for v, w in cand:
            if placed >= k:
                break
            n = min(w, k - placed)
            if rank:
                for r in range(placed + 1, placed + n + 1):
                    out.append((kk + v + (r,), 1))
            else:
                out.append((kk + v, n))
            placed += n
    return zset(out)


# -- recursion ----------------------------------------------------------------------------------

def fixpoint(fn: Callable[[ZDict], ZDict], start: Optional[ZDict] = None,
             max_iterations: int = 10_000) -> ZDict:
    """Iterate ``x = fn(x)`` from ``start`` (empty) until it stops changing."""
    x = dict(start or {})
    for _ in range(max_iterations):
        nx = fn(x)
        if nx == x:
            return x
        x = nx
    raise RuntimeError("no fixed point")


def transitive_closure(edges: ZDict) -> ZDict:
    """Pairs ``(a, c)`` connected by a path of edges of positive weight (set semantics)."""
    e = {r for r, w in edges.items() if w > 0}
    succ: dict = defaultdict(set)
    for a, b in e:
        succ[a].add(b)
    out = set()
    for a in list(succ):
        seen: set = set()
        todo = list(succ[a])
        while todo:
            n = todo.pop()
            if n in seen:
                continue
            seen.add(n)
            todo.extend(succ.get(n, ()))
        out.update((a, n) for n in seen)
    return {r: 1 for r in out}


__all__ = ["zset", "add", "neg", "sub", "integrate", "map_rows", "filter_rows", "flat_map_rows",
           "reorder", "index", "distinct", "join", "semijoin", "antijoin", "left_join",
           "aggregate", "topk", "fixpoint", "transitive_closure", "value_key", "row_key"]

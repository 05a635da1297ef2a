"""A naive model of the fluent API for tests: Z-sets as ``{row tuple: weight}``, recomputed from
scratch; windows, sessions, rolling frames and lateness written the obvious way (loops).

Every function takes whole (integrated) Z-sets and returns the whole result; tests compare the
engine's integrated view with it after every step, and its delta with the difference of two
consecutive results.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Iterable, Optional, Sequence


def zset(pairs: Iterable[tuple[tuple, int]] | dict) -> dict:
    out: dict = defaultdict(int)
    items = pairs.items() if isinstance(pairs, dict) else pairs
    for r, w in items:
        out[tuple(r)] += int(w)
    return {r: w for r, w in out.items() if w != 0}


def add(*zs: dict) -> dict:
    out: dict = defaultdict(int)
    for z in zs:
        for r, w in z.items():
            out[r] += w
    return {r: w for r, w in out.items() if w != 0}


def sub(a: dict, b: dict) -> dict:
    return add(a, {r: -w for r, w in b.items()})


def close(a: dict, b: dict, rel: float = 1e-9) -> bool:
    """Z-sets equal up to float rounding in the row values."""
    if len(a) != len(b):
        return False
    ka = sorted(a.items(), key=lambda rw: _key(rw[0]))
    kb = sorted(b.items(), key=lambda rw: _key(rw[0]))
    for (ra, wa), (rb, wb) in zip(ka, kb):
        if wa != wb or len(ra) != len(rb):
            return False
        for x, y in zip(ra, rb):
            if isinstance(x, float) and isinstance(y, float):
                if not (x == y or math.isclose(x, y, rel_tol=rel, abs_tol=1e-9)):
                    return False
            elif x != y:
                return False
    return True


def _key(r: tuple) -> tuple:
    return tuple((v is not None, round(v, 6) if isinstance(v, float) else v) for v in r)


# -- aggregates (SQL null semantics over positive weights) ---------------------------------------

def agg_value(kind: str, vals: list[tuple[Any, int]]) -> Any:
    """``kind`` over ``(value, weight)`` pairs of one group."""
    if kind == "count_all":
        return sum(w for _, w in vals)
    nn = [(v, w) for v, w in vals if v is not None]
    if kind == "count":
        return sum(w for _, w in nn)
    if kind == "count_distinct":
        return len({v for v, w in nn if w > 0})
    if not nn:
        return None
    if kind == "sum":
        return sum(v * w for v, w in nn)
    if kind == "avg":
        return sum(v * w for v, w in nn) / sum(w for _, w in nn)
    pos = [v for v, w in nn if w > 0]
    if not pos:
        return None
    return min(pos) if kind == "min" else max(pos)


def group_agg(z: dict, key: Callable[[tuple], tuple], aggs: Sequence[tuple[str, Optional[int]]]
              ) -> dict:
    """``{key ++ aggregates: 1}`` for every group of positive total weight; ``aggs`` are
    ``(kind, column index or None)``."""
    groups: dict = defaultdict(list)
    for r, w in z.items():
        groups[key(r)].append((r, w))
    out = {}
    for k, rows in groups.items():
        if sum(w for _, w in rows) <= 0:
            continue
        vals = [agg_value(kind, [((r[c] if c is not None else 1), w) for r, w in rows])
                for kind, c in aggs]
        out[tuple(k) + tuple(vals)] = 1
    return out


# -- windows ----------------------------------------------------------------------------------

def window_starts(t: int, size: int, every: int, offset: int = 0) -> list[int]:
    first = t - (t - offset) % every
    out = []
    s = first
    while s + size > t:
        out.append(s)
        s -= every
    return out


def window_agg(z: dict, t: int, keys: Sequence[int], size: int, every: int,
               aggs: Sequence[tuple[str, Optional[int]]], offset: int = 0) -> dict:
    """Rows ``keys ++ (start, end) ++ aggregates`` of tumbling (every == size) / hopping windows."""
    expanded: dict = defaultdict(int)
    for r, w in z.items():
        if r[t] is None:
            continue
        for s in window_starts(r[t], size, every, offset):
            expanded[(s,) + r] += w
    res = group_agg(expanded, lambda r: tuple(r[1 + k] for k in keys) + (r[0], r[0] + size),
                    [(kind, None if c is None else c + 1) for kind, c in aggs])
    return res


def session_agg(z: dict, t: int, keys: Sequence[int], gap: int,
                aggs: Sequence[tuple[str, Optional[int]]]) -> dict:
    per_key: dict = defaultdict(list)
    for r, w in z.items():
        if r[t] is None or w <= 0:
            continue
        per_key[tuple(r[k] for k in keys)].append((r, w))
    out = {}
    for k, rows in per_key.items():
        rows.sort(key=lambda rw: rw[0][t])
        sessions: list[list] = []
        for r, w in rows:
            if sessions and r[t] - sessions[-1][-1][0][t] < gap:
                sessions[-1].append((r, w))
            else:
                sessions.append([(r, w)])
        for s in sessions:
            vals = [agg_value(kind, [((r[c] if c is not None else 1), w) for r, w in s])
                    for kind, c in aggs]
            out[k + (s[0][0][t], s[-1][0][t] + gap) + tuple(vals)] = 1
    return out


def rolling(z: dict, t: int, keys: Sequence[int], aggs: Sequence[tuple[str, Optional[int]]],
            range_: Optional[int] = None, rows: Optional[int] = None) -> dict:
    """Each row ++ aggregates over its frame (see dbsp.operators.rolling)."""
    per_key: dict = defaultdict(list)
    for r, w in z.items():
        if r[t] is None or w <= 0:
            continue
        per_key[tuple(r[k] for k in keys)].append((r, w))
    out: dict = defaultdict(int)
    for rs in per_key.values():
        if range_ is not None:
            for r, w in rs:
                frame = [(q, v) for q, v in rs if r[t] - range_ <= q[t] <= r[t]]
                vals = [agg_value(kind, [((q[c] if c is not None else 1), v) for q, v in frame])
                        for kind, c in aggs]
                out[r + tuple(vals)] += w
        else:
            # order by (time, the other columns in the engine's value order)
            copies = []
            for r, w in sorted(rs, key=lambda rw: (rw[0][t],) + _rest_key(rw[0], t, keys)):
                copies.extend([r] * w)
            for i, r in enumerate(copies):
                frame = [(q, 1) for q in copies[max(0, i - rows + 1):i + 1]]
                vals = [agg_value(kind, [((q[c] if c is not None else 1), v) for q, v in frame])
                        for kind, c in aggs]
                out[r + tuple(vals)] += 1
    return dict(out)


def _rest_key(r: tuple, t: int, keys: Sequence[int]) -> tuple:
    return tuple((v is not None, v) for i, v in enumerate(r) if i != t and i not in keys)


# -- lateness ---------------------------------------------------------------------------------

class Lateness:
    """The lateness filter, step by step: ``step(delta) -> (kept, late count)``."""

    def __init__(self, t: int, lateness: int):
        self.t, self.lateness = t, lateness
        self.max_seen: Optional[int] = None
        self.late = 0

    @property
    def watermark(self) -> Optional[int]:
        return None if self.max_seen is None else self.max_seen - self.lateness

    def step(self, delta: dict) -> dict:
        wm = self.watermark
        kept = {}
        for r, w in delta.items():
            v = r[self.t]
            if v is None or (wm is not None and v < wm):
                self.late += abs(w)
            else:
                kept[r] = w
        times = [r[self.t] for r in kept]
        if times:
            m = max(times)
            self.max_seen = m if self.max_seen is None else max(self.max_seen, m)
        return kept

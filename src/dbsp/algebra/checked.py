"""Checked int64 arithmetic for columns: sums that are right or flagged, never wrapped.

numpy's int64 arithmetic wraps silently. These helpers compute with numpy (wrapping) and say
*where* the exact result leaves the int64 range, at the cost of a bound on the fast path:

* :func:`weighted_group_sums` (``Σ x·w`` per group): when ``max|x| · max|w| · rows < 2**62``
  nothing can overflow (two max reductions, the fast path); otherwise a float64 shadow of the
  products and sums finds the suspects (its error is far below ``2**62`` for any int64 input),
  and only the suspects are recomputed exactly with Python integers.
* :func:`add_overflows` (``a + b`` element-wise): the sign test ``(a ^ s) & (b ^ s) < 0`` on the
  wrapped sum ``s``, which is exact.
* :func:`mul_overflows` (``a * b`` element-wise, the weights of joined pairs): a bound on the
  fast path, then float suspects checked exactly.

Modular arithmetic makes the wrapped group sum right whenever the exact one fits, whatever
happened to the partial sums in between, so checking the results is enough.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["weighted_group_sums", "group_sums", "add_overflows", "mul_overflows", "I64_MIN",
           "I64_MAX", "WeightOverflowError", "exact_sum_overflows"]

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
_SAFE = float(1 << 62)


def _reduce(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    if len(starts) == 0:
        return np.zeros(0, dtype=x.dtype)
    return np.add.reduceat(x, starts)


def weighted_group_sums(x: np.ndarray, w: np.ndarray,
                        starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Σ x·w per group, bool mask of the groups whose exact sum is out of int64)`` for int64
    ``x`` and ``w``; groups start at ``starts`` (rows sorted by group). Flagged sums are
    meaningless."""
    n = len(x)
    prod = x * w
    sums = _reduce(prod, starts)
    bad = np.zeros(len(sums), dtype=bool)
    if n == 0:
        return sums, bad
    xm = max(abs(float(x.max())), abs(float(x.min())))
    wm = max(abs(float(w.max())), abs(float(w.min())))
    if xm * wm * n < _SAFE:
        return sums, bad
    fprod = x.astype(np.float64) * w.astype(np.float64)
    fsum = _reduce(np.abs(fprod), starts)
    suspects = np.flatnonzero(fsum >= _SAFE)
    if len(suspects) == 0:
        return sums, bad
    ends = np.append(starts[1:], n)
    for g in suspects:  # exact, in Python integers: rare and only for huge values
        lo, hi = int(starts[g]), int(ends[g])
        exact = sum(int(a) * int(b) for a, b in zip(x[lo:hi].tolist(), w[lo:hi].tolist()))
        if not I64_MIN <= exact <= I64_MAX:
            bad[g] = True
    return sums, bad


def add_overflows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(a + b wrapped, bool mask where the exact sum is out of int64)`` for int64 arrays."""
    s = a + b
    return s, ((a ^ s) & (b ^ s)) < 0


def group_sums(w: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(Σ w per group, bool mask of the groups whose exact sum is out of int64)``."""
    sums = _reduce(w, starts)
    n = len(w)
    if n == 0 or max(abs(float(w.max())), abs(float(w.min()))) * n < _SAFE:
        return sums, np.zeros(len(sums), dtype=bool)
    return weighted_group_sums(np.ones(n, dtype=np.int64), w, starts)


def mul_overflows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """``(a * b wrapped, None when nothing overflows else the bool mask where the exact product is
    out of int64)`` for int64 arrays; the fast path is a bound on ``max|a| · max|b|``."""
    p = a * b
    if len(a) == 0:
        return p, None
    am = max(abs(float(a.max())), abs(float(a.min())))
    bm = max(abs(float(b.max())), abs(float(b.min())))
    if am * bm < _SAFE:
        return p, None
    suspects = np.flatnonzero(np.abs(a.astype(np.float64) * b.astype(np.float64)) >= _SAFE)
    over = np.zeros(len(a), dtype=bool)
    for i in suspects:
        if not I64_MIN <= int(a[i]) * int(b[i]) <= I64_MAX:
            over[i] = True
    return p, (over if over.any() else None)


class WeightOverflowError(OverflowError):
    """The exact sum of equal rows' weights is out of the int64 range (a consolidated weight
    that would wrap). ``rows``: for each such group, its first input row (an index into what the
    kernel was given); ``sums``: the exact sums. Layers above name the row
    (:attr:`row`, a dict of its column values, set by the batch that knows them)."""

    def __init__(self, rows: list, sums: list, row: Optional[dict] = None,
                 where: str = "") -> None:
        self.rows, self.sums, self.row, self.where = list(rows), list(sums), row, where
        what = "" if row is None else " of row {" + ", ".join(
            f"{k}={v!r}" for k, v in row.items()) + "}"
        at = f" in {where}" if where else ""
        super().__init__(f"the weight{what}{at} is out of the int64 range: "
                         f"{self.sums[0] if self.sums else '?'} (the weights summed to more than "
                         f"int64 holds; a weight never wraps)")

    def __reduce__(self):
        return (WeightOverflowError, (self.rows, self.sums, self.row, self.where))


def _row_keys(codes) -> list:
    if codes is None:
        return []
    if isinstance(codes, np.ndarray):
        return codes.tolist()
    o = np.asarray(codes.offsets).tolist()
    d = np.asarray(codes.data).tobytes()
    return [d[o[i]:o[i + 1]] for i in range(len(o) - 1)]


def exact_sum_overflows(kcodes: list, vcodes: list, weights: list) -> tuple[list, list]:
    """The groups of equal ``(kcodes[i], vcodes[i])`` whose exact weight sum leaves int64, as
    ``(first rows, exact sums)`` in row order. ``kcodes`` / ``vcodes``: lists of code arrays
    (u64 or :class:`~dbsp.algebra.codes.VarCodes`; ``vcodes`` entries may be None), read as one
    concatenation; ``weights`` the matching int64 arrays. Python integers, row by row: only run
    after a native kernel flagged a wrapped partial sum (rare, and only for huge weights)."""
    sums: dict = {}
    first: dict = {}
    base = 0
    for kc, vc, w in zip(kcodes, vcodes, weights):
        ks = _row_keys(kc)
        vs = _row_keys(vc) if vc is not None else [None] * len(ks)
        for i, (k, v, x) in enumerate(zip(ks, vs, np.asarray(w).tolist())):
            key = (k, v)
            if key in sums:
                sums[key] += x
            else:
                sums[key] = x
                first[key] = base + i
        base += len(ks)
    bad = sorted((first[k], s) for k, s in sums.items() if not I64_MIN <= s <= I64_MAX)
    return [r for r, _ in bad], [s for _, s in bad]

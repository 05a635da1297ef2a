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
           "I64_MAX"]

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

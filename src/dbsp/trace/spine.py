"""Spine: the LSM of batches that holds one piece of operator state (a trace).

Goals
-----
Inserting a delta costs work proportional to the delta (amortised), not to the history; reading
the state for a set of keys costs ``O(keys * batches * log(batch size))``; the number of batches
stays logarithmic in the state size.

Design
------
Batches live in levels by size: a batch of ``n`` rows sits at level ``floor(log_F(n))`` with
fan-out ``F`` (4 by default). Inserting a batch into a level that already holds one merges the two
(one native k-way merge, GIL released) and carries the result up, like binary addition. Readers
get an immutable snapshot (a tuple of batches); merges replace batches but never change one.

Invariants
----------
* The state is the sum of the batches: merging never changes what :meth:`lookup` returns.
* Every batch is consolidated; no batch is empty.
"""
from __future__ import annotations

import math
import threading
from typing import Optional, Sequence, Union

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import Codes
from ..algebra.schema import concat_batches, take
from .batch import OrdIndexedZSet, OrdZSet, ranges

Batch = Union[OrdZSet, OrdIndexedZSet]


def _merge(batches: Sequence[Batch]) -> Batch:
    if isinstance(batches[0], OrdIndexedZSet):
        return OrdIndexedZSet.merge(batches)  # type: ignore[arg-type]
    return OrdZSet.merge(batches)  # type: ignore[arg-type]


class Spine:
    """An LSM trace of :class:`OrdZSet` or :class:`OrdIndexedZSet` batches."""

    def __init__(self, fanout: int = 4, name: str = "trace"):
        self.fanout = fanout
        self.name = name
        self._levels: dict[int, Batch] = {}
        self._lock = threading.Lock()
        self._proto: Optional[Batch] = None  # an empty batch of the right schema

    # -- writing --------------------------------------------------------------------------
    def insert(self, batch: Batch) -> None:
        if self._proto is None:
            self._proto = batch
        if len(batch) == 0:
            return
        with self._lock:
            b = batch
            while True:
                lvl = self._level(len(b))
                other = self._levels.pop(lvl, None)
                if other is None:
                    self._levels[lvl] = b
                    return
                b = _merge([other, b])
                if len(b) == 0:
                    return

    def _level(self, n: int) -> int:
        return int(math.log(max(n, 1), self.fanout))

    def clear(self) -> None:
        with self._lock:
            self._levels.clear()

    # -- reading --------------------------------------------------------------------------
    def batches(self) -> tuple[Batch, ...]:
        """An immutable snapshot, largest (oldest) batch first."""
        with self._lock:
            return tuple(self._levels[k] for k in sorted(self._levels, reverse=True))

    def __len__(self) -> int:
        """Rows stored, summed over batches (an upper bound on the consolidated size)."""
        return sum(len(b) for b in self.batches())

    @property
    def num_batches(self) -> int:
        return len(self._levels)

    def consolidated(self) -> Optional[Batch]:
        """All the state as one batch (None when empty)."""
        bs = self.batches()
        if not bs:
            return None
        return _merge(bs) if len(bs) > 1 else bs[0]

    def lookup(self, probe: Codes) -> Optional[OrdIndexedZSet]:
        """The consolidated rows of the sorted distinct key codes ``probe`` (indexed traces only).

        Keys absent from the trace (or whose rows cancel out) are missing from the result.
        Returns None when nothing matches.
        """
        parts = []
        for b in self.batches():
            assert isinstance(b, OrdIndexedZSet)
            ai, bi = K.intersect(probe, b.kcodes)
            if len(bi):
                parts.append(b.select_keys(bi))
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        m = OrdIndexedZSet.merge(parts)
        return m if len(m) else None

    def weights_of(self, codes: Codes) -> np.ndarray:
        """The total weight of each of the sorted distinct row codes (Z-set traces only)."""
        out = np.zeros(len(codes), np.int64)
        for b in self.batches():
            assert isinstance(b, OrdZSet)
            ai, bi = K.intersect(codes, b.codes)
            if len(ai):
                out[ai] += b.weights[bi]
        return out


__all__ = ["Spine", "Batch"]
_ = (pa, take, concat_batches, ranges)

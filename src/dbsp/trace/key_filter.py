"""Bloom filters over the keys of large in-memory batches, so a point probe skips a batch that
certainly does not hold its key.

Why
---
An operator that reads its state at the rows of a step's change (``distinct``'s old weights,
:meth:`dbsp.trace.spine.Spine.weights_of`) probes every batch of the spine. A probe of a batch is
a binary search whose cost grows with the batch: about ``log2(n)`` rows, most of them cold in
the cache once the batch is larger than it (a 10M-row batch of 16-byte codes is 240 MB). When the
probed rows are new, as most inserted rows are, every batch answers "absent" after a full search;
when they are old, all but one batch does. Layer files already carry a Bloom filter over their
keys (:mod:`dbsp.storage.writer`); this module gives the large batches that stay in memory the
same: one cache line read per probe instead of a search, where the key is absent.

Design
------
* The filter is the storage layer's blocked Bloom filter (one 512-bit block per key: a query costs
  one cache miss), built by the native kernels ``hash_u64`` / ``hash_var`` and ``bloom_add``, which
  run without the GIL.
* It is built for batches of at least :data:`MIN_KEYS` keys by the spine's merger, on its own
  thread, right after the merge that made the batch and before the batch is visible (the step
  never waits for it). Small batches are searched directly: they are cache-resident.
* A probe uses it only when the probes are sparse against the batch (fewer than one in
  :data:`SPARSE` of its keys); a dense probe is a merge-like scan that costs less than hashing.

Invariants: a filter never answers "absent" for a key of its batch (a false positive only costs
the search it would have made anyway), and it belongs to one immutable batch (slices do not carry
it).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .._native import block as _nb
from ..algebra import kernels as K
from ..algebra.codes import CodeArray
from ..storage.format import bloom_params, hash_codes

__all__ = ["KeyFilter", "MIN_KEYS", "SPARSE", "FPR", "filtered_intersect", "attach_filter"]

#: batches with fewer keys are not filtered (their search is cache-resident)
MIN_KEYS = 1 << 16
#: a filter is consulted only when there are fewer than 1/SPARSE probes per key of the batch
SPARSE = 8
#: target false-positive rate (about 10 bits a key)
FPR = 0.01
_SEED = 0x2545F4914F6CDD1D


def _hashes(codes: CodeArray) -> np.ndarray:
    return hash_codes(codes, _SEED)


class KeyFilter:
    """A blocked Bloom filter over a batch's sorted distinct key codes."""

    __slots__ = ("words", "k", "keys")

    def __init__(self, words: np.ndarray, k: int, keys: int):
        self.words, self.k, self.keys = words, k, keys

    @classmethod
    def build(cls, codes: CodeArray, fpr: float = FPR) -> "KeyFilter":
        bits_per_key, k = bloom_params(fpr)
        n = len(codes)
        blocks = max(1, int(np.ceil(max(n, 1) * bits_per_key / 512)))
        words = np.zeros(blocks * 8, dtype=np.uint64)
        if n:
            _nb.bloom_add(words, k, _hashes(codes))
        return cls(words, k, n)

    def may_contain(self, codes: CodeArray) -> np.ndarray:
        """Bool per code: False where the code is certainly not a key of the batch."""
        if len(codes) == 0:
            return np.zeros(0, dtype=bool)
        return _nb.bloom_query(self.words, self.k, _hashes(codes))

    @property
    def nbytes(self) -> int:
        return self.words.nbytes


def filtered_intersect(probes: CodeArray, keys: CodeArray,
                       filt: Optional[KeyFilter]) -> tuple[np.ndarray, np.ndarray]:
    """``K.intersect(probes, keys)``, skipping the probes that ``filt`` (a filter over ``keys``,
    or None) rules out when the probes are sparse against ``keys``."""
    if filt is None or len(probes) * SPARSE >= len(keys):
        return K.intersect(probes, keys)
    sel = np.flatnonzero(filt.may_contain(probes))
    if len(sel) == len(probes):
        return K.intersect(probes, keys)
    if len(sel) == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e
    ai, bi = K.intersect(K.take(probes, sel), keys)
    return sel[ai], bi


def attach_filter(batch) -> None:
    """Give an in-memory batch of at least :data:`MIN_KEYS` keys its filter, if it has none (the
    merger calls this on the batch a merge made, before publishing it)."""
    if getattr(batch, "is_file", False) or getattr(batch, "key_filter", 1) is not None:
        return
    codes = batch.kcodes if batch.indexed else batch.codes
    if len(codes) >= MIN_KEYS:
        batch.key_filter = KeyFilter.build(codes)

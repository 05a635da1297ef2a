"""Streaming merges: the sum of consolidated batches, chunk by chunk, never whole inputs at once.

A spine's merge of file batches (or of in-memory batches whose sum is large) must not load its
inputs: state larger than memory is exactly the case where it cannot. :func:`merge_pieces` reads
every input in *pieces* (``iter_pieces``: about ``chunk_rows`` rows each, read ahead from files)
and runs the native k-way merge (:meth:`OrdIndexedZSet.merge`) on one round of pieces at a time;
:func:`merge_stream` writes the rounds into a new batch file (or keeps a small result in memory).

Design
------
Each input has a *head* piece. A round may only emit rows that no later piece can precede, so its
*bound* is the smallest last row ``(key code, value code)`` over the inputs that have more pieces
after their head (inputs on their last piece do not bound anything). Every head's prefix of rows
``<= bound`` goes into the round's merge; the rest of a head waits for the next round. The input
whose head ends at the bound is consumed whole and reads its next piece, so every round makes
progress, and memory holds one piece per input plus one round's output. Pieces may split a key's
values; the file sink writes such a key once.

The key bound of ``truncate_keys_below`` is applied by cutting the inputs first (file batches cut
by one index seek); a ``retain_values`` filter is applied to each round's output, so it must be
row-local (true of every filter the engine sets).

Invariants
----------
* Rounds come out in ``(key, value)`` order, consolidated, with no row in two rounds: their
  concatenation is the consolidated sum of the inputs.
"""
from __future__ import annotations

import contextlib

from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from ..algebra import kernels as K
from ..algebra.codes import Codes
from ..algebra.schema import concat_batches
from ..storage.faults import kill_point
from .batch import OrdIndexedZSet, OrdZSet
from .file_batch import BatchFileSink

__all__ = ["merge_pieces", "merge_stream", "sum_batches", "concat_rounds", "chunk_rows"]


def _last(piece) -> tuple:
    n = len(piece)
    if piece.indexed:
        return (Codes.at(piece.kcodes, piece.num_keys - 1), Codes.at(piece.vcodes, n - 1))
    return (Codes.at(piece.codes, n - 1),)


def _count_le(piece, bound: tuple) -> int:
    """Rows of a sorted piece whose ``(key, value)`` is ``<= bound``."""
    if not piece.indexed:
        return int(K.upper_bound(piece.codes, Codes.one(bound[0], like=piece.codes))[0])
    kc = piece.kcodes
    bk, bv = bound
    k = int(K.lower_bound(kc, Codes.one(bk, like=kc))[0])
    off = piece.offsets
    if k < piece.num_keys and Codes.at(kc, k) == bk:
        a, b = int(off[k]), int(off[k + 1])
        vc = Codes.slice(piece.vcodes, a, b)
        return a + int(K.upper_bound(vc, Codes.one(bv, like=vc))[0])
    return int(off[k])


def _split(piece, p: int):
    if piece.indexed:
        return piece.row_slice(0, p), piece.row_slice(p, len(piece))
    return piece.slice(0, p), piece.slice(p, len(piece))


def sum_batches(parts: Sequence) -> object:
    """The sum of non-empty in-memory consolidated batches of one kind (one native merge)."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].indexed:
        return OrdIndexedZSet.merge(parts)
    return OrdZSet.merge(parts)


def concat_rounds(rounds: Sequence):
    """One batch from consecutive rounds of :func:`merge_pieces` (ordered, disjoint; a key may
    continue from one round into the next): a concatenation, no merge."""
    if len(rounds) == 1:
        return rounds[0]
    r0 = rounds[0]
    if not r0.indexed:
        return OrdZSet(concat_batches(r0.schema, [r.data for r in rounds]),
                       np.concatenate([r.weights for r in rounds]),
                       K.concat([r.codes for r in rounds]), r0.codec)
    keys, kcodes, offs = [], [], []
    base = 0
    last = None
    for r in rounds:
        skip = 1 if last is not None and Codes.at(r.kcodes, 0) == last else 0
        nk = r.num_keys
        keys.append(r.keys.slice(skip) if skip else r.keys)
        kcodes.append(Codes.slice(r.kcodes, skip, nk))
        offs.append(r.offsets[skip:nk] + base)
        base += len(r)
        last = Codes.at(r.kcodes, nk - 1)
    offs.append(np.asarray([base], dtype=np.int64))
    return OrdIndexedZSet(concat_batches(r0.key_schema, keys), K.concat(kcodes),
                          np.concatenate(offs), concat_batches(r0.val_schema, [r.vals for r in rounds]),
                          K.concat([r.vcodes for r in rounds]),
                          np.concatenate([r.weights for r in rounds]), r0.kcodec, r0.vcodec)


class _Source:
    __slots__ = ("it", "left", "head")

    def __init__(self, batch, chunk_rows: int):
        self.it = iter(batch.iter_pieces(chunk_rows))
        self.left = len(batch)
        self.head = None
        self.advance()

    def advance(self) -> None:
        h = next(self.it, None)
        while h is not None and len(h) == 0:
            h = next(self.it, None)
        self.head = h
        if h is not None:
            self.left -= len(h)

    @property
    def more(self) -> bool:
        return self.left > 0


def merge_pieces(inputs: Sequence, chunk_rows: int, bound=None,
                 keep: Optional[Callable] = None) -> Iterator:
    """The consolidated sum of ``inputs`` (batches of one kind, in memory or in files) as
    in-memory rounds in ``(key, value)`` order (see the module doc). ``bound``: drop keys
    below it; ``keep``: a row filter applied to each round."""
    srcs = []
    for b in inputs:
        if bound is not None:
            b = b.cut_below(bound)
        if len(b):
            srcs.append(_Source(b, chunk_rows))
    while True:
        live = [s for s in srcs if s.head is not None]
        if not live:
            return
        bounded = [_last(s.head) for s in live if s.more]
        bnd = min(bounded) if bounded else None
        parts = []
        for s in live:
            h = s.head
            p = len(h) if bnd is None else _count_le(h, bnd)
            if p == 0:
                continue
            if p == len(h):
                parts.append(h)
                s.advance()
            else:
                pre, s.head = _split(h, p)
                parts.append(pre)
        out = sum_batches(parts)
        if keep is not None and len(out):
            out = out.filter_rows(keep(out))
        if len(out):
            yield out


def chunk_rows(inputs: Sequence, cfg) -> int:
    """Rows to read from each input per round: ``cfg.merge_chunk_rows``, fewer when a round of
    all the inputs would take more than ``cfg.merge_round_bytes`` (a round's merge holds about
    three copies of its rows: the pieces, their concatenation, the merged output)."""
    rows = sum(len(b) for b in inputs)
    if rows == 0:
        return cfg.merge_chunk_rows
    size = sum(b.file_bytes if b.is_file else b.nbytes_in_memory for b in inputs)
    per_row = max(size / rows, 8.0)
    fit = int(cfg.round_bytes / (len(inputs) * per_row))
    return max(min(cfg.merge_chunk_rows, fit), 256)


def merge_stream(inputs: Sequence, storage, *, bound=None, keep: Optional[Callable] = None,
                 name: str = "", to_file: Optional[bool] = None, reserve: bool = True,
                 open_output: bool = True, on_round: Optional[Callable] = None):
    """Merge ``inputs`` chunk by chunk (:func:`merge_pieces`) into one batch: a new file
    batch when ``to_file`` (default: when the inputs sum to ``storage.config.min_file_rows``
    rows or more; the merge first reserves their size on disk, waiting if it must, unless
    ``reserve`` is False because the caller did), else an in-memory batch. Returns None when
    everything cancels. ``open_output=False``: return the new file's path, unopened (the merge
    helper process, whose parent opens it). ``on_round``: called after each round is written
    (the helper samples its memory there)."""
    cfg = storage.config
    total = sum(len(b) for b in inputs)
    if to_file is None:
        to_file = total >= cfg.min_file_rows
    rounds = merge_pieces(inputs, chunk_rows(inputs, cfg), bound, keep)
    if not to_file:
        outs = list(rounds)
        if not outs:
            return None
        return concat_rounds(outs)
    need = sum(b.file_bytes if b.is_file else b.nbytes_in_memory for b in inputs)
    keys = sum(b.num_keys for b in inputs)
    gate = storage.reserve_disk(need, f"merge of {name or 'a spine'}") if reserve else \
        contextlib.nullcontext()
    with gate:
        sink = None
        try:
            for r in rounds:
                if sink is None:
                    sink = BatchFileSink(storage, r, keys, name)
                sink.append(r)
                kill_point("merge-mid")  # (crash tests: a partly written merge output)
                if on_round is not None:
                    on_round()
        except BaseException:
            if sink is not None:
                sink.abort()
            raise
        if sink is None:
            return None
        return sink.finish() if open_output else sink.finish_path()

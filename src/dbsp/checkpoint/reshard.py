"""Re-sharding a checkpoint's state for another layout: the cold layout change of seed 000
("Scale in and out", "Layout changes").

Goals
-----
* A pipeline checkpointed with ``W`` workers resumes with ``W'``: every new worker loads only the
  state of the keys it now owns (the shards its :class:`~dbsp.circuit.exchange.ShardMap` gives
  it); no input is processed in between, and the first thing the resumed pipeline does is
  commit a checkpoint in the new layout (:meth:`dbsp.checkpoint.CheckpointStore.restore`,
  :meth:`dbsp.ft.DurableCircuit.open`).
* Only reassigned shards' state moves: the new map is the old one resized
  (:meth:`ShardMap.resize`: about ``1/(W+1)`` of the keys change owner from ``W`` to ``W+1``),
  and a batch file whose keys all stay with its worker is reused as it is (not copied).

Design
------
New worker ``w`` reads every old worker's state file (:func:`dbsp.checkpoint.state.read_state`:
spines as lists of batch files, the rest as pickled values) and merges the ``W`` state trees,
which have the same shape (the circuits are identical), node by node:

* a spine (:class:`~dbsp.trace.spine.SpineImage`): the batches of all old workers, each cut to
  the keys whose shard ``w`` owns (by the hash of the key's code, exactly as the exchange
  shards it); a batch entirely ``w``'s own stays the same object (its file is shared);
* a batch held as a value (a delay's or differentiate's previous value): the parts of all old
  workers cut the same way and summed;
* a scalar: equal on every worker (a watermark, a step number: taken as it is), else a flag
  (``and``: "every insert so far was positive" holds for the union only if it held for each) or
  a counter (the largest: version counters only grow); anything else is refused with an error
  naming the state.

Why cutting every piece of state by the hash of its key is right: every operator whose result
depends on having a key's rows together (join, aggregate, distinct, top-k, windows) keeps state
keyed by the key its exchange shards by, so after the cut each key's state lives where the
exchange now sends the key's changes. Every other piece of state is used linearly (an integral,
a delay of a linear stream) and the circuit's output is the sum over workers, so any partition
of it is as good as another; the cut is one.

Invariants
----------
* The union over new workers of the cut state equals the union over old workers: each stored
  row goes to exactly one new worker (its key's owner).
* The old checkpoint is not modified; the new layout's first checkpoint references the reused
  files and the new worker directories' files.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..circuit.exchange import ShardMap
from ..circuit.operator import NestedState
from ..trace.batch import KeyedZSet, OrdIndexedZSet, OrdZSet, ZSet
from ..trace.file_batch import is_file_batch
from ..trace.spine import SpineImage
from ..trace.timed import OrdKeyBatch, OrdValBatch
from .state import CheckpointError, read_state

__all__ = ["load_worker_resharded", "ReshardStats", "old_worker_count", "cut_batch",
           "moved_fraction"]


@dataclass
class ReshardStats:
    """What one new worker took: stored rows it kept from its own old state, rows that came
    from another old worker's state (moved), batches reused unchanged and batches cut."""

    kept_rows: int = 0
    moved_rows: int = 0
    reused_batches: int = 0
    cut_batches: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def old_worker_count(ckpt_dir: str) -> int:
    """Workers of the checkpoint in ``ckpt_dir`` (its ``worker-<w>.state`` files, 0..W-1)."""
    n = 0
    while os.path.exists(os.path.join(ckpt_dir, f"worker-{n}.state")):
        n += 1
    if n == 0:
        raise CheckpointError(f"{ckpt_dir}: no worker state in the checkpoint")
    return n


def load_worker_resharded(sched: Any, root: str, name: str, old_workers: int,
                          layout: dict) -> dict:
    """Restore this worker's operators from checkpoint ``name`` written by ``old_workers``
    workers in another layout: the state of the keys that ``layout`` (a
    :meth:`ShardMap.to_dict`) gives this worker (a module-level function: run on each worker
    through the runtime's ``apply``). Returns the :class:`ReshardStats` as a dict."""
    t0 = time.perf_counter()
    shards = ShardMap.from_dict(layout)
    w = sched.ctx.worker
    if shards.workers != sched.ctx.workers:
        raise CheckpointError(f"worker {w}: layout for {shards.workers} workers, the circuit "
                              f"has {sched.ctx.workers}")
    st = ReshardStats()
    # one old worker at a time: its files are open only while they are cut (a batch kept
    # whole keeps its file open, as any live batch does)
    cut = [_pre(read_state(os.path.join(root, name, f"worker-{v}.state"), sched.ctx.storage,
                           root), v, shards, w, st)
           for v in range(old_workers)]
    merged = _merge(list(enumerate(cut)), shards, w, st, "state")
    sched.restore_state(merged)
    st.seconds = time.perf_counter() - t0
    return st.as_dict()


# -- merging W state trees into one worker's --------------------------------------------------

class _Cut:
    """A batch held as a value, cut: the part for the new worker (a list, maybe empty) and an
    empty batch of its kind."""

    __slots__ = ("parts", "empty")

    def __init__(self, parts: list, empty: Any):
        self.parts, self.empty = parts, empty


def _pre(x: Any, v: int, shards: ShardMap, w: int, st: ReshardStats) -> Any:
    """Old worker ``v``'s state tree with every batch cut to new worker ``w``'s part."""
    if isinstance(x, SpineImage):
        return SpineImage(tuple(p for b in x.batches for p in _cut(b, v, shards, w, st)),
                          x.key_bound)
    if isinstance(x, NestedState):
        return NestedState({k: _pre(y, v, shards, w, st) for k, y in x.items()})
    if isinstance(x, dict):
        return {k: _pre(y, v, shards, w, st) for k, y in x.items()}
    if isinstance(x, (list, tuple)) and not isinstance(x, str):
        return type(x)(_pre(y, v, shards, w, st) for y in x)
    if _is_batch(x):
        return _Cut(_cut(x, v, shards, w, st), _empty_like(x))
    return x


#: Z-sets of loose rows (a linear stream's value: a delayed input, say), cut by the code of the
#: whole row; a :class:`KeyedZSet` is an input's rows as the split dealt them
_LOOSE = (ZSet, KeyedZSet)


def _empty_like(b: Any) -> Any:
    m = b.to_memory() if is_file_batch(b) else b
    if type(m) in _LOOSE:
        return ZSet.empty(m.schema)
    return cut_batch(m, np.zeros(len(_key_rows(m)[0]), dtype=bool))


def _merge(vals: list, shards: ShardMap, w: int, st: ReshardStats, where: str) -> Any:
    """``vals``: ``[(old worker, value)]`` of one place in the (cut) state trees."""
    first = vals[0][1]
    if isinstance(first, SpineImage):
        batches = [b for _, im in vals for b in im.batches]
        return SpineImage(tuple(batches), _bound([im.key_bound for _, im in vals]))
    if isinstance(first, NestedState):
        return NestedState(_merge_dict(vals, shards, w, st, where))
    if isinstance(first, dict):
        return _merge_dict(vals, shards, w, st, where)
    if isinstance(first, (list, tuple)) and not isinstance(first, str):
        n = len(first)
        if any(len(x) != n for _, x in vals):
            raise CheckpointError(f"{where}: the workers' states differ in length")
        return type(first)(_merge([(v, x[i]) for v, x in vals], shards, w, st, f"{where}[{i}]")
                           for i in range(n))
    if any(isinstance(x, _Cut) for _, x in vals):  # None: nothing held on that worker
        parts = [p for _, c in vals if c is not None for p in c.parts]
        return _sum(next(x for _, x in vals if isinstance(x, _Cut)).empty, parts)
    return _scalar([x for _, x in vals], where)


def _merge_dict(vals: list, shards, w, st, where) -> dict:
    keys = list(vals[0][1])
    if any(list(x) != keys for _, x in vals):
        raise CheckpointError(f"{where}: the workers' states have different parts "
                              f"({sorted(map(str, keys))} ...)")
    return {k: _merge([(v, x[k]) for v, x in vals], shards, w, st, f"{where}[{k!r}]")
            for k in keys}


def _bound(bounds: list) -> Any:
    """The key bound (GC of late rows) of the merged spine: the lowest (keeps the most rows),
    none if any worker had none."""
    if all(b == bounds[0] for b in bounds):
        return bounds[0]
    if any(b is None for b in bounds):
        return None
    return min(bounds)


def _scalar(xs: list, where: str) -> Any:
    x0 = xs[0]
    if all(_same(x, x0) for x in xs):
        return x0
    if all(isinstance(x, (bool, np.bool_)) for x in xs):
        return all(bool(x) for x in xs)
    nums = [x for x in xs if x is not None]
    if nums and all(isinstance(x, (int, float, np.integer, np.floating))
                    and not isinstance(x, (bool, np.bool_)) for x in nums):
        return max(nums)
    raise CheckpointError(f"{where}: the workers hold different values "
                          f"({', '.join(repr(x)[:40] for x in xs)}) and there is no rule to "
                          f"merge them for a layout change")


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


# -- cutting batches by the owner of their keys -----------------------------------------------

def _is_batch(x: Any) -> bool:
    return isinstance(x, (ZSet, OrdIndexedZSet, OrdKeyBatch, OrdValBatch)) or is_file_batch(x)


def _key_rows(b: Any) -> tuple:
    """``(key codes, stored rows per key)`` of an in-memory batch."""
    if isinstance(b, OrdZSet):
        return b.codes, None
    if isinstance(b, OrdIndexedZSet):
        return b.kcodes, np.diff(b.offsets)
    if isinstance(b, OrdKeyBatch):
        return b.kcodes, np.diff(b.offsets)
    if isinstance(b, OrdValBatch):
        return b.kcodes, np.diff(b.val_offsets[b.key_offsets])
    raise CheckpointError(f"cannot re-shard a batch of type {type(b).__name__}")


def cut_batch(b: Any, mine: np.ndarray) -> Any:
    """The part of in-memory batch ``b`` whose keys ``mine`` (a bool per key) selects."""
    if isinstance(b, (OrdZSet, OrdIndexedZSet)):
        return b.select_keys(np.flatnonzero(mine))
    if isinstance(b, OrdKeyBatch):
        ki = b.key_index()
        rows = np.flatnonzero(mine[ki])
        return OrdKeyBatch._build(b.keys, b.kcodes, ki[rows], b.times[rows], b.weights[rows],
                                  b.kcodec)
    if isinstance(b, OrdValBatch):
        vi = b.val_index()
        rk = b.val_key_index()[vi]
        rows = np.flatnonzero(mine[rk])
        return OrdValBatch._build(b.keys, b.kcodes, rk[rows], b.vals, b.vcodes, vi[rows],
                                  b.times[rows], b.weights[rows], b.kcodec, b.vcodec)
    raise CheckpointError(f"cannot re-shard a batch of type {type(b).__name__}")


def _cut(b: Any, v: int, shards: ShardMap, w: int, st: ReshardStats) -> list:
    """The part of old worker ``v``'s batch ``b`` that new worker ``w`` owns (a list: empty or
    one batch; ``b`` itself when all of it is ``w``'s)."""
    if len(b) == 0:
        return []
    m = b.to_memory() if is_file_batch(b) else b
    if type(m) in _LOOSE:  # loose rows: by the code of the whole row
        m = m.consolidate()
    codes, per_key = _key_rows(m)
    mine = shards.worker_of(codes) == w
    rows = int(mine.sum()) if per_key is None else int(per_key[mine].sum())
    if rows == 0:
        return []
    if v == w:
        st.kept_rows += rows
    else:
        st.moved_rows += rows
    if mine.all():
        st.reused_batches += 1
        return [b]
    st.cut_batches += 1
    return [cut_batch(m, mine)]


def _sum(proto: Any, parts: list) -> Any:
    """The sum of ``parts`` (cut batches of ``proto``'s kind); ``proto`` (empty) when there
    are none."""
    parts = [p.to_memory() if is_file_batch(p) else p for p in parts]
    parts = [p.consolidate() if type(p) in _LOOSE else p for p in parts if len(p)]
    if not parts:
        return proto
    if len(parts) == 1:
        return parts[0]
    return type(parts[0]).merge(parts)


def moved_fraction(stats: list[dict]) -> Optional[float]:
    """Rows that changed worker over all rows of state, from every new worker's stats."""
    moved = sum(s["moved_rows"] for s in stats)
    total = moved + sum(s["kept_rows"] for s in stats)
    return None if total == 0 else moved / total

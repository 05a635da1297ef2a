"""The exchange: where a key lives, and how workers hand each other the rows that live elsewhere.

One home for the concept, below the operators and the runtime:

* **the sharding function** :func:`shard_rows`: a key lives on the worker that owns its shard in
  the circuit's :class:`ShardMap` (its *layout*; the shard is the top bits of
  :func:`dbsp.algebra.kernels.hash64` over the key's normalized code, the same in every
  process); the exchange operator (:mod:`dbsp.operators.exchange`), the linear aggregate's
  combiner and the driver's input placement (:mod:`dbsp.runtime.placement`) all ask it, so they
  always agree. A checkpoint stores the map, and a resume with another worker count re-shards
  the state by it (:mod:`dbsp.checkpoint.reshard`);
* **dealing rows** :func:`deal`: the rows of a record batch for each worker, by the hash of some
  of its columns encoded as the exchange after ``index_by`` encodes them; :func:`deal_batch`
  hands each worker its rows themselves, copied in one native pass
  (:func:`dbsp.algebra.kernels.deal_batch`: no permutation of the rows and no gather through it);
* **shard maps** :class:`ShardMap`: the layout of 000 ("Scale in and out"), where a key's
  *shard* is the top ``log2(S)`` bits of its hash and an array of ``S`` owners says which worker
  holds each shard. Fixed sharding keeps ``S`` (say 1024) whatever ``W``; dynamic sharding picks
  ``S = next_power_of_two(W / k)`` (``k``: the largest load inaccuracy tolerated) and, when a
  change of ``W`` doubles or halves ``S``, splits every shard into its two halves (the next bit
  of the hash: no key changes owner) or merges pairs. Either way :meth:`ShardMap.resize` then
  moves only the shards needed to even the counts (within one shard), so ``W -> W+1`` moves
  about ``1/(W+1)`` of the keys, where ``hash % W`` moves ``W/(W+1)``;
* **the transport interface** :class:`Transport`: how W worker replicas swap parts. All workers
  call it in the same order (the circuits are identical and step in lockstep), so a call is
  identified by its sequence number. Implementations live in the runtime: threads of one process
  (:class:`dbsp.runtime.threads.InProcTransport`), a socket mesh between processes or hosts
  (:class:`dbsp.runtime.socket_transport.SocketTransport`).
"""
from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import CodeArray, codec_for
from ..algebra.schema import take

__all__ = ["Transport", "TransportAborted", "shard_rows", "deal", "deal_order", "deal_batch",
           "deal_sorted", "sorted_plan", "SORTED_DEAL_ROWS",
           "ShardMap", "DEFAULT_K", "as_shard_map"]

#: the dynamic algorithm's load tolerance used unless a circuit is given another layout:
#: ``S = next_power_of_two(W / 0.1)`` shards (16 for one worker, 32 for two or three)
DEFAULT_K = 0.1


class Transport(Protocol):
    """What the exchange operator needs from the runtime."""

    workers: int

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        """Send ``parts[j]`` to worker ``j``; return the parts every worker sent to ``worker``."""

    def all_gather(self, worker: int, value: Any) -> list[Any]:
        """Every worker's ``value``, in worker order."""

    def abort(self) -> None:
        """Wake every worker blocked in the transport with an error (a worker failed)."""


class TransportAborted(RuntimeError):
    """Another worker failed while this one waited in an exchange."""


def exchange_source(nodes: Sequence, e: Any) -> Optional[tuple[int, tuple]]:
    """``(input node id, (key column names, key schema))`` when node ``e`` is an exchange (or a
    linear aggregate's combiner, which swaps partials by key) that reads ``index_by(key)`` of a
    circuit input directly (also through a join's ``recode_keys``, which only widens the key's
    nullability), else None. The key schema is the one whose codes that exchange hashes (for a
    combiner, its input's key). The one place that says which input rows an exchange re-shards:
    the input placement (:mod:`dbsp.runtime.placement`) and a replica dealing a sliced input
    (:class:`~dbsp.circuit.scheduler.Scheduler`) both read it."""
    if not e.inputs or not (e.info.get("exchange") or e.info.get("combiner")):
        return None
    src = nodes[e.inputs[0]]
    if src.info.get("recode_keys"):  # a join aligning key nullability: same columns
        src = nodes[src.inputs[0]]
    names = src.info.get("index_key")
    if names is None or not src.inputs or nodes[src.inputs[0]].kind != "input":
        return None
    key = e.type.key if e.info.get("exchange") else nodes[e.inputs[0]].type.key
    return src.inputs[0], (names, key)


def as_shard_map(shards: "ShardMap | int") -> "ShardMap":
    """``shards`` itself, or the default layout (dynamic, :data:`DEFAULT_K`) of that many
    workers."""
    if isinstance(shards, ShardMap):
        return shards
    return ShardMap.dynamic(int(shards), DEFAULT_K)


def shard_rows(codes: CodeArray, shards: "ShardMap | int") -> list[np.ndarray]:
    """The row indices (ascending) of ``codes`` that go to each worker of the layout ``shards``
    (a :class:`ShardMap`, or a worker count for the default one): the one definition of "where
    a key lives" that exchanges and the driver's input placement share."""
    return as_shard_map(shards).rows(codes)


def deal(data: pa.RecordBatch, key: tuple, shards: "ShardMap | int") -> list[np.ndarray]:
    """Row indices of ``data`` for each worker, by the hash of ``key`` = ``(column names, key
    schema)`` as the exchange after ``index_by(names)`` computes it."""
    order, bounds = deal_order(data, key, shards)
    return [order[bounds[w]:bounds[w + 1]] for w in range(len(bounds) - 1)]


def deal_order(data: pa.RecordBatch, key: tuple, shards: "ShardMap | int"
               ) -> tuple[np.ndarray, list[int]]:
    """:func:`deal` as one permutation: ``(order, bounds)``, worker ``w``'s rows being
    ``order[bounds[w]:bounds[w + 1]]`` (ascending), so that a caller takes the rows of every
    worker with one gather and slices it."""
    names, schema = key
    codes = codec_for(schema).encode_batch(data.select(list(names)))
    return as_shard_map(shards).order(codes)


def deal_batch(data: pa.RecordBatch, weights: np.ndarray, key: tuple, shards: "ShardMap | int"
               ) -> list[Optional[tuple[pa.RecordBatch, np.ndarray]]]:
    """The rows of ``data`` and their ``weights`` for each worker, as :func:`deal` deals them:
    per worker ``(its rows, their weights)`` in their order in ``data``, or None for a worker
    without rows. Fixed-width columns without nulls are copied to each worker's batch in one
    native pass (:func:`dbsp.algebra.kernels.deal_batch`); other batches take the rows of
    :func:`deal_order` in one gather, sliced per worker."""
    shards = as_shard_map(shards)
    W = shards.workers
    if W == 1:
        return [(data, weights) if data.num_rows else None]
    names, schema = key
    codec = codec_for(schema)
    got: Any = False
    if codec._native_plan is not None:   # the key codes packed from the kernel's own export
        cols = [data.schema.get_field_index(n) for n in names]
        got = K.deal_batch(data, None, weights, shards.owners, shards.bits, W, cols,
                           codec._native_plan)
        if got:
            return got
    codes = codec.encode_batch(data.select(list(names)))
    if got is False:   # (None: a column the kernel cannot copy, with these codes or any)
        got = K.deal_batch(data, codes, weights, shards.owners, shards.bits, W)
        if got is not None:
            return got
    order, b = shards.order(codes)
    data, weights = take(data, order), weights[order]
    return [(data.slice(b[i], b[i + 1] - b[i]), weights[b[i]:b[i + 1]]) if b[i + 1] > b[i]
            else None for i in range(W)]


#: rows a worker from which the driver's split no longer sorts an input for the workers'
#: ``index_by`` (:func:`deal_sorted`): below it each worker's own sort is small and its per-call
#: costs count; from it the workers' sorts run in parallel and the driver's one sort of every
#: row would hold them all back (join_avg, 100K events a step, 2 workers: wall speed-up 0.93 ->
#: 0.83). The threads runtime's bound for running a step's workers in the driver's thread.
SORTED_DEAL_ROWS = 1 << 14


def sorted_plan(schema: pa.Schema, names: Sequence[str]) -> Optional[tuple]:
    """What :func:`deal_sorted` needs to deal rows of ``schema`` by the key columns ``names``,
    worked out once per input: ``(key column indices, key plan, value column indices, value
    plan, key schema)`` (the values: the other columns in schema order, as ``index_by(names)``
    takes them; the plans: ``KeyCodec._native_plan``; the key schema: the key columns' fields,
    as ``index_by`` keeps its keys); None when either codes are not u64 packed from the
    columns."""
    names = list(names)
    vnames = [n for n in schema.names if n not in names]
    if not names or not vnames or len(vnames) + len(names) != len(schema.names):
        return None
    kc, vc = codec_for(schema, names), codec_for(schema, vnames)
    if kc._native_plan is None or vc._native_plan is None:
        return None
    return ([schema.get_field_index(n) for n in names], kc._native_plan,
            [schema.get_field_index(n) for n in vnames], vc._native_plan,
            pa.schema([schema.field(n) for n in names]))


def deal_sorted(data: pa.RecordBatch, weights: np.ndarray, plan: tuple, shards: "ShardMap | int"
                ) -> Optional[list[Optional[tuple[pa.RecordBatch, np.ndarray, np.ndarray,
                                                  np.ndarray]]]]:
    """The rows of ``data`` for each worker as :func:`deal_batch` deals them, but consolidated
    and in the order ``index_by(key)`` keeps them: by ``(key code, value code)`` (``plan``:
    :func:`sorted_plan` of ``data``'s schema and the key); per worker ``(its rows, their
    weights, key codes, value codes, key batch, distinct key codes, offsets)`` (the last three:
    the key layer of an indexed batch of those rows), or None for a worker without rows. None
    when a column is not fixed-width without nulls (the caller then deals the rows with
    :func:`deal_batch`).

    All the rows are sorted once (one sort of the whole step, where each worker's
    ``index_by`` sorted its part: the per-call costs are paid once) and copied once to their
    worker in that order (:func:`dbsp.algebra.kernels.deal_sorted`), and each worker's keys
    grouped in the same call: each worker's ``index_by`` then neither sorts, groups nor
    gathers them again. A row's worker is the one
    :func:`deal` gives it (the same hash of the same key code)."""
    shards = as_shard_map(shards)
    kidx, kplan, vidx, vplan, kschema = plan
    return K.deal_sorted(data, weights, kidx, kplan, vidx, vplan, shards.owners, shards.bits,
                         shards.workers, K.sort_consolidate, kschema)


def _next_pow2(x: float) -> int:
    n = 1
    while n < x:
        n *= 2
    return n


class ShardMap:
    """``S`` shards (a power of two) owned by ``W`` workers: ``owners[s]`` is shard ``s``'s
    worker. A code's shard is ``hash64(code) >> (64 - log2 S)``, the hash's most significant
    bits, so shard ``s`` of ``S`` is exactly shards ``2s`` and ``2s + 1`` of ``2S``.

    ``k`` is None for fixed sharding (``S`` never changes), else the dynamic algorithm's
    tolerance: ``S = next_power_of_two(W / k)``.
    """

    __slots__ = ("owners", "workers", "k", "bits")

    def __init__(self, owners: np.ndarray, workers: int, k: Optional[float] = None):
        owners = np.asarray(owners, dtype=np.int32)
        S = len(owners)
        if S < 1 or S & (S - 1):
            raise ValueError(f"ShardMap: the number of shards must be a power of two, got {S}")
        if workers < 1 or (len(owners) and (owners.min() < 0 or owners.max() >= workers)):
            raise ValueError(f"ShardMap: owners must be workers 0..{workers - 1}")
        if k is not None and not 0 < k < 1:
            raise ValueError(f"ShardMap: k must be in (0, 1), got {k}")
        self.owners = owners
        self.workers = int(workers)
        self.k = k
        self.bits = S.bit_length() - 1

    @property
    def shards(self) -> int:
        return len(self.owners)

    @classmethod
    def fixed(cls, workers: int, shards: int = 1024) -> "ShardMap":
        """Fixed sharding: ``shards`` shards, about ``shards / workers`` contiguous ones each."""
        if shards < workers:
            raise ValueError(f"ShardMap.fixed: {shards} shards cannot cover {workers} workers")
        return cls(_even(shards, workers), workers)

    @classmethod
    def dynamic(cls, workers: int, k: float = 0.1) -> "ShardMap":
        """Dynamic sharding: ``S = next_power_of_two(workers / k)`` shards."""
        if not 0 < k < 1:
            raise ValueError(f"ShardMap.dynamic: k must be in (0, 1), got {k}")
        return cls(_even(_next_pow2(workers / k), workers), workers, k)

    def shard_of(self, codes: CodeArray) -> np.ndarray:
        """The shard of each code (int64)."""
        h = K.hash64(codes)
        if self.bits == 0:
            return np.zeros(len(h), dtype=np.int64)
        return (h >> np.uint64(64 - self.bits)).astype(np.int64)

    def worker_of(self, codes: CodeArray) -> np.ndarray:
        """The worker that holds each code."""
        return self.owners[self.shard_of(codes)]

    def rows(self, codes: CodeArray) -> list[np.ndarray]:
        """Row indices (ascending) of ``codes`` for each worker, as :func:`shard_rows`."""
        order, b = self.order(codes)
        return [order[b[w]:b[w + 1]] for w in range(self.workers)]

    def order(self, codes: CodeArray) -> tuple[np.ndarray, list[int]]:
        """:meth:`rows` as one permutation of the rows and the workers' bounds in it (a list
        of ``workers + 1`` ints): worker ``w``'s rows are ``order[b[w]:b[w + 1]]``."""
        if self.workers == 1:
            return np.arange(len(codes), dtype=np.int64), [0, len(codes)]
        # one pass hashing each row to its worker, one scatter of the row numbers (no
        # temporaries of the whole length: numpy's hash -> shard -> owner -> W scans made five,
        # each a fresh allocation whose pages fault in)
        order, bounds = K.owner_rows(codes, self.owners, self.bits, self.workers)
        return order, bounds.tolist()

    def counts(self) -> np.ndarray:
        return np.bincount(self.owners, minlength=self.workers)

    def slices(self, worker: int) -> list[tuple[int, int]]:
        """The shard ranges ``[lo, hi)`` that ``worker`` owns."""
        mine = np.flatnonzero(self.owners == worker)
        if not len(mine):
            return []
        cuts = np.flatnonzero(np.diff(mine) != 1) + 1
        return [(int(r[0]), int(r[-1]) + 1) for r in np.split(mine, cuts)]

    def _at(self, shards: int) -> np.ndarray:
        """The owners refined to ``shards`` (a multiple of this map's)."""
        return np.repeat(self.owners, shards // self.shards)

    def moved(self, other: "ShardMap") -> float:
        """The fraction of the hash space (of keys, for a uniform hash) whose worker differs
        between this map and ``other``."""
        S = max(self.shards, other.shards)
        return float(np.mean(self._at(S) != other._at(S)))

    def resize(self, workers: int) -> "ShardMap":
        """The map for ``workers`` workers that moves the fewest shards: workers ``0..W-1``
        stay, new ones are added at the end or the last ones removed. Dynamic maps first
        double (split every shard, no move) or halve (merge pairs) ``S`` as ``W / k`` asks."""
        if workers < 1:
            raise ValueError(f"ShardMap.resize: workers must be >= 1, got {workers}")
        owners = self.owners
        if self.k is not None:
            S = _next_pow2(workers / self.k)
            while len(owners) < S:
                owners = np.repeat(owners, 2)
            while len(owners) > S:
                pairs = owners.reshape(-1, 2)
                # a pair with two owners goes to one that stays (the other half moves)
                keep = np.where(pairs[:, 0] < workers, pairs[:, 0], pairs[:, 1])
                owners = keep.astype(np.int32)
        elif len(owners) < workers:
            raise ValueError(f"ShardMap.resize: {len(owners)} fixed shards cannot cover "
                             f"{workers} workers")
        owners = owners.copy()
        S = len(owners)
        counts = np.bincount(owners[owners < workers], minlength=workers)
        base, extra = divmod(S, workers)
        # the +1 targets go to the workers that hold most already (fewer moves)
        order = np.argsort(-counts, kind="stable")
        target = np.full(workers, base, dtype=np.int64)
        target[order[:extra]] += 1
        free = list(np.flatnonzero(owners >= workers))  # shards of removed workers
        for w in range(workers):
            over = counts[w] - target[w]
            if over > 0:  # give up its highest shards
                free.extend(np.flatnonzero(owners == w)[-over:])
        free.sort()
        i = 0
        for w in range(workers):
            need = target[w] - counts[w]
            if need > 0:
                owners[free[i:i + need]] = w
                i += need
        return ShardMap(owners, workers, self.k)

    def to_dict(self) -> dict:
        """The layout as plain data (to store with a checkpoint)."""
        return {"workers": self.workers, "k": self.k, "owners": self.owners.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "ShardMap":
        return cls(np.asarray(d["owners"], dtype=np.int32), int(d["workers"]), d.get("k"))

    def __eq__(self, other) -> bool:
        return (isinstance(other, ShardMap) and self.workers == other.workers
                and self.k == other.k and np.array_equal(self.owners, other.owners))

    def __repr__(self) -> str:
        kind = "fixed" if self.k is None else f"dynamic k={self.k}"
        return f"ShardMap({kind}, S={self.shards}, W={self.workers})"


def _even(shards: int, workers: int) -> np.ndarray:
    """``shards`` shards in ``workers`` contiguous slices of equal size (within one)."""
    bounds = (np.arange(workers + 1, dtype=np.int64) * shards) // workers
    return np.repeat(np.arange(workers, dtype=np.int32), np.diff(bounds))

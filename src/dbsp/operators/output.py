"""Output handles: a step's delta and the integrated view, as Arrow / pandas / dicts.

Each worker's output operator keeps its part of the delta; after the step the handle gathers
the parts of all workers, consolidates them into one :class:`OrdZSet` (rows from different
workers may coincide when the stream was not sharded) and, when asked for, adds it to the
integrated view (a spine).

An indexed part (an aggregate's or a join's output) is already sorted and consolidated by
``(key code, value code)``; since codes are prefix-free byte strings concatenated column by
column, that is also the order of the row codes of its flattened rows. So each worker turns its
part into a :class:`SortedPart`: its flattened rows, marked as in row-code order, whose row
codes are built only when something reads them (:attr:`SortedPart.codes`: a merge, a view, a
consumer of codes) - on the driver, from the key and value codes when the indexed batch is at
hand (threads), else by encoding the rows. A part that crosses a process boundary carries its
rows only (half the bytes of rows plus codes), and a reader of Arrow never pays for codes.

The handle sums W such parts without sorting: parts whose keys are disjoint (the stream was
sharded by key, as an aggregate's or a join's output is) are merged by their integer key codes
alone and concatenated key by key (:func:`_merge_disjoint`); parts that share a key are merged
by row code (:meth:`OrdZSet.merge`: linear, and it sums rows that several workers produced);
one part is the delta as it is.
"""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import pyarrow as pa

from ..algebra.checked import I64_MAX, I64_MIN, WeightOverflowError
from ..algebra.codes import KeyCodec, VarCodes, codec_for
from ..algebra import kernels as K
from ..algebra.schema import WEIGHT, concat_batches, take
from ..circuit.operator import Operator, Stateful, sum_memory
from ..storage.osthreads import name_os_thread
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import DistinctZSet, OrdIndexedZSet, OrdZSet, ZSet
from ..trace.spine import Spine
from ._values import add


class OutputOperator(Operator):
    name = "output"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.last = None
        self._codec: Optional[KeyCodec] = None  # the flattened rows' codec, found once

    def eval(self, value):
        if isinstance(value, OrdIndexedZSet):
            flat = value.flatten()
            if len(flat):
                codec = self._codec
                if codec is None or codec.fields != list(flat.schema):
                    codec = self._codec = codec_for(flat.schema, flat.schema.names)
                # sorted and consolidated already (see the module doc): codes when read
                flat = SortedPart(flat.data, flat.weights, codec, value.keys.num_columns, value)
            value = flat
        self.last = value
        return None


_CODES = OrdZSet.__dict__["codes"]   # the slot under SortedPart.codes


class SortedPart(OrdZSet):
    """The flattened rows of an indexed batch (consolidated, in row-code order: see the module
    doc), the first ``nkey`` columns its key, with row codes built at the first read of
    :attr:`codes`. ``src``: the indexed batch it was flattened from (its key and value codes
    make the row codes without encoding the rows), kept only within a process: a pickled part
    is its rows, weights and codec."""

    __slots__ = ("nkey", "_src")

    def __init__(self, data: pa.RecordBatch, weights: np.ndarray, codec: KeyCodec, nkey: int,
                 src: Optional[OrdIndexedZSet] = None):
        OrdZSet.__init__(self, data, weights, None, codec)  # type: ignore[arg-type]
        self.nkey = nkey
        self._src = src

    @property  # type: ignore[override]
    def codes(self):
        c = _CODES.__get__(self)
        if c is None:
            src = self._src
            c = _row_codes(src, self.codec) if src is not None else None
            if c is None:
                c = self.codec.encode_batch(self.data)
            _CODES.__set__(self, c)
            self._src = None
        return c

    @codes.setter
    def codes(self, value) -> None:
        _CODES.__set__(self, value)

    def key_codes(self, kcodec: KeyCodec):
        """The key code of every row (``kcodec``: the codec of the first ``nkey`` columns)."""
        src = self._src
        if src is not None and type(src.kcodes) is np.ndarray and kcodec.u64:
            return np.repeat(src.kcodes, np.diff(src.offsets))
        return kcodec.encode_batch(self.data.select(list(range(self.nkey))))

    def __reduce__(self):
        return SortedPart, (self.data, self.weights, self.codec, self.nkey)


class OutputHandle(Stateful):
    """The delta of the last step (:meth:`delta`) and, with ``view=True``, the integrated view.

    Gathering costs nothing per step: the workers' parts are kept as they are, and consolidated
    only when read (:meth:`delta`, :meth:`view`), so a pipeline whose output is read rarely does
    not pay for sorting every step.

    *Bounded.* Only the last step's delta is kept as such (the next step replaces it). With a
    view, the steps' deltas not read yet wait to be added to the view's spine, but never more
    than :attr:`MAX_PENDING_STEPS` steps or :attr:`MAX_PENDING_ROWS` rows of them: past either
    bound they are consolidated into the spine at once (where a row and its retraction cancel
    and merges keep the view to its consolidated size), so an output that is never read holds
    at most its view plus that backlog, not every delta since the start.
    """

    #: most steps of unread deltas kept before they are folded into the view's spine
    MAX_PENDING_STEPS = 64
    #: most rows of unread deltas kept before they are folded into the view's spine
    MAX_PENDING_ROWS = 1_000_000

    state_attrs = ("_view", "rows_out")

    def __init__(self, node: int, schema: pa.Schema, name: str, keep_view: bool):
        self.node = node
        self.schema = schema
        self._codec = codec_for(schema, schema.names)  # the delta's row codec
        self._kcodecs: dict[int, KeyCodec] = {}  # codec of the first n columns (the key), by n
        self.name = name
        self.keep_view = keep_view
        self._parts: list[ZSet] = []
        self._delta: Optional[OrdZSet] = OrdZSet.empty(schema)
        self._view: Optional[Spine] = Spine(name=f"view:{name}") if keep_view else None
        self._view_pending: list[ZSet] = []
        self._pending_steps = 0
        self._pending_rows = 0
        self._folding: Optional[_Fold] = None  # a fold running on a thread of its own
        self._view_cache: Optional[OrdZSet] = None
        self.rows_out = 0  # rows produced by all steps (before consolidation)
        # every view weight's magnitude is at most the sum over steps of the largest |weight|
        # each added: while that stays below 2**62, no view weight can leave int64 (check)
        self._bound = 0

    def check(self, values: list) -> None:
        """Refuse a step's parts (before the step commits) if they would put a weight of the view
        out of the int64 range (:class:`~dbsp.algebra.checked.WeightOverflowError` naming the
        row). Costs a max and a min per part while the bound above holds; past it, the rows of
        the step are looked up in the view and summed exactly where a float shadow says they
        may not fit."""
        if not self.keep_view:
            return
        parts = [v for v in values if v is not None and len(v)]
        if not parts:
            return
        m = 0
        for p in parts:
            m += max(abs(int(p.weights.max())), abs(int(p.weights.min())))
        if self._bound + m < (1 << 62):
            self._bound += m
            return
        self._fold_view()
        d = _consolidate_parts(self.schema, self._codec, parts, self._kcodecs)  # raises if the sum wraps
        adds = self._view.weight_parts(d.codes) + [d.weights]  # type: ignore[union-attr]
        shadow = np.zeros(len(d), np.float64)
        for a in adds:
            shadow += np.abs(a.astype(np.float64))
        for i in np.flatnonzero(shadow >= float(1 << 62)).tolist():
            exact = sum(int(a[i]) for a in adds)
            if not I64_MIN <= exact <= I64_MAX:
                raise WeightOverflowError([i], [exact], d.data.slice(i, 1).to_pylist()[0],
                                          f"the view of output '{self.name}'")
        self._bound = max(self._bound, 1 << 62) + m

    def _gather(self, values: list) -> None:
        parts = [v for v in values if v is not None and len(v)]
        self._parts = parts
        self._delta = None
        for p in parts:
            self.rows_out += len(p)
        if self.keep_view and parts:
            self._view_pending.extend(parts)
            self._pending_steps += 1
            self._pending_rows += sum(len(p) for p in parts)
            self._view_cache = None
            if self._pending_steps >= self.MAX_PENDING_STEPS or \
                    self._pending_rows >= self.MAX_PENDING_ROWS:
                self._fold_in_background()

    def checkpoint_state(self) -> dict:
        self._fold_view()
        return super().checkpoint_state()

    def restore_state(self, state: dict) -> None:
        self._join_fold()  # (its rows belong to the view being replaced)
        self._view_pending, self._view_cache = [], None
        self._pending_steps = self._pending_rows = 0
        self._parts, self._delta = [], OrdZSet.empty(self.schema)
        super().restore_state(state)
        self._bound = 0
        if self._view is not None:
            for b in self._view.batches():   # once per restore (a file batch is read)
                if len(b):
                    w = b.weights if hasattr(b, "weights") else b.to_memory().weights
                    self._bound += max(abs(int(w.max())), abs(int(w.min())))

    # -- delta ----------------------------------------------------------------------------
    def delta(self) -> OrdZSet:
        """The consolidated change of the last step."""
        if self._delta is None:
            self._delta = _consolidate_parts(self.schema, self._codec, self._parts,
                                             self._kcodecs)
        return self._delta

    def delta_loose(self) -> ZSet:
        """The change of the last step, unconsolidated (rows may repeat; cheapest to read)."""
        return add(ZSetType(self.schema), self._parts)  # type: ignore[return-value]

    def to_arrow(self) -> pa.Table:
        """The last step's delta as a table with a ``__weight`` column (consolidated; in code
        order, or as made when the parts are already consolidated: no sort then)."""
        if self._delta is None and self._parts and \
                all(type(p) is DistinctZSet for p in self._parts):
            t = pa.Table.from_batches([p.data for p in self._parts], schema=self.schema)
            return t.append_column(WEIGHT, pa.array(np.concatenate(
                [p.weights for p in self._parts]), pa.int64()))
        return self.delta().to_arrow()

    def to_pandas(self):
        return self.delta().to_pandas()

    def to_dict(self) -> dict[tuple, int]:
        return self.delta().to_dict()

    # -- integrated view ------------------------------------------------------------------
    def view(self) -> OrdZSet:
        """Everything output so far, consolidated (the materialised view)."""
        if self._view is None:
            raise RuntimeError(f"output '{self.name}' keeps no view (created with view=False)")
        self._fold_view()
        if self._view_cache is None:
            v = self._view.consolidated()
            self._view_cache = v if v is not None else OrdZSet.empty(self.schema)
        return self._view_cache  # type: ignore[return-value]

    def _fold_in_background(self) -> None:
        """Fold the unread deltas into the view on a thread of its own (:class:`_Fold`): the
        step that reached the bound does not wait for the sort. At most one fold runs."""
        if self._join_fold():  # the last one failed: fold here, and raise here if it fails
            self._fold_view()
            return
        parts, steps = self._view_pending, self._pending_steps
        self._view_pending = []
        self._pending_steps = self._pending_rows = 0
        self._folding = _Fold(self, parts, steps)

    def _join_fold(self) -> bool:
        """Wait for the fold in flight, if any. One that failed hands its parts back to the
        unread deltas, so the next :meth:`_fold_view` folds them again in the caller's thread
        and raises there; returns whether it failed."""
        f = self._folding
        if f is None:
            return False
        f.thread.join()
        self._folding = None
        if f.error is None:
            return False
        self._view_pending[:0] = f.parts
        self._pending_steps += f.steps
        self._pending_rows += sum(len(p) for p in f.parts)
        return True

    def _fold_view(self) -> None:
        """Add the steps' deltas not yet in the view's spine to it (the fold in flight
        first)."""
        self._join_fold()
        if self._view is not None and self._view_pending:
            _fold_into(self._view, self.schema, self._codec, self._kcodecs, self._view_pending,
                       self._pending_steps)
            self._view_pending = []
            self._pending_steps = self._pending_rows = 0

    def memory(self) -> dict:
        """The view's :meth:`~dbsp.trace.spine.Spine.memory`, its unread deltas counted as
        in-memory rows (all zero without a view)."""
        if self._view is None:
            return sum_memory(())
        m = self._view.memory()
        f = self._folding
        for p in self._view_pending + (f.parts if f is not None else []):
            m["rows"] += len(p)
            m["batches"] += 1
            m["memory_rows"] += len(p)
            m["memory_bytes"] += p.data.nbytes + p.weights.nbytes
            m["arrow_bytes"] += p.data.nbytes
        return m

    def view_arrow(self) -> pa.Table:
        return self.view().to_arrow()

    def view_pandas(self):
        return self.view().to_pandas()

    def view_dict(self) -> dict[tuple, int]:
        return self.view().to_dict()


def _fold_into(view: Spine, schema: pa.Schema, codec: KeyCodec, kcodecs: dict, parts: list,
               steps: int) -> None:
    """Insert the sum of ``steps`` steps' unread ``parts`` into ``view`` (an output's view
    spine), consolidated: what a fold does, in the reader's thread or a :class:`_Fold`'s."""
    # the deltas of several steps share keys: no merge by key codes (it would give up only
    # after sorting them all)
    b = _consolidate_parts(schema, codec, parts, kcodecs, disjoint=steps <= 1)
    if type(b) is SortedPart:   # the spine keeps plain batches (codes built now)
        b = OrdZSet(b.data, b.weights, b.codes, b.codec)
    if len(b):
        view.insert(b)


class _Fold:
    """Unread deltas of an output being folded into its view's spine on a thread of its own.

    A fold consolidates up to :attr:`OutputHandle.MAX_PENDING_ROWS` rows of many steps from
    scratch (concatenated, encoded, sorted): on a keyed count over 1M keys at 10K events a
    step, 240 ms every ~50 steps, a step time's p99 of 140-260 ms against a median of 3-5 ms
    when the step that reached the bound paid it (``bench/workloads/view_latency.py``). Its sort, encoding and concatenation run
    without the GIL, beside the next steps. The view's spine takes the result like any insert
    (Z-set addition commutes, and no step reads the view); readers of the view, checkpoints and
    restores wait for the fold first (:meth:`OutputHandle._join_fold`)."""

    __slots__ = ("parts", "steps", "error", "thread")

    def __init__(self, handle: "OutputHandle", parts: list, steps: int):
        self.parts = parts
        self.steps = steps
        self.error: Optional[BaseException] = None
        # (a copy of the key codecs' cache: the handle's own is filled by its reads meanwhile)
        args = (handle._view, handle.schema, handle._codec, dict(handle._kcodecs), parts, steps)
        self.thread = threading.Thread(target=self._run, args=args,
                                       name=f"dbsp-fold-{handle.name}"[:40], daemon=True)
        self.thread.start()

    def _run(self, *args) -> None:
        name_os_thread()
        try:
            _fold_into(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the reader (_join_fold)
            self.error = e


def _consolidate_parts(schema: pa.Schema, codec: KeyCodec, parts: list,
                       kcodecs: Optional[dict] = None, disjoint: bool = True) -> OrdZSet:
    """The parts summed and consolidated; ``codec``: the schema's row codec (the handle's,
    found once, not looked up by hashing the schema every step); ``kcodecs``: the handle's key
    codecs by key width (filled here); ``disjoint``: try the merge by key codes of parts whose
    keys are disjoint, and the k-way merge of more than two sorted parts (false for parts
    known to share keys: several steps' deltas, sorted from scratch)."""
    if not parts:
        return OrdZSet.empty(schema)
    if len(parts) > 1 and all(_sorted_by(p, codec) for p in parts):
        if disjoint and all(type(p) is SortedPart for p in parts):
            got = _merge_disjoint(schema, parts, codec, {} if kcodecs is None else kcodecs)
            if got is not None:
                return got
        if disjoint or len(parts) <= 2:
            return OrdZSet.merge(parts)   # sorted runs of the same codes: a k-way merge
        # many steps' deltas (a view's fold): concatenated and sorted, faster than the k-way
        # merge from three runs on (18 parts of 1.1M rows: 105 vs 165 ms)
    z = add(ZSetType(schema), parts)
    return OrdZSet.from_loose(z, codec)  # (an OrdZSet is returned as it is)


def _merge_disjoint(schema: pa.Schema, parts: list, codec: KeyCodec,
                    kcodecs: dict) -> Optional[SortedPart]:
    """The sum of sorted parts (:class:`SortedPart`) whose keys are disjoint, by a merge of their
    integer key codes alone (a stable merge of W sorted runs: every key's rows stay together,
    in their part's order, which is row-code order), or None when the key codes are not
    integers or some key is in two parts (then the rows must be merged by row code and
    summed). The parts' rows are distinct from each other then, so the merge sums nothing.
    ``schema``: the output's (the parts' columns are its types: they have its codec)."""
    nkey = parts[0].nkey
    if any(p.nkey != nkey for p in parts) or not 0 < nkey < len(codec.fields):
        return None
    kc = kcodecs.get(nkey)
    if kc is None:
        kc = kcodecs[nkey] = KeyCodec(codec.fields[:nkey])
    if not kc.u64:
        return None
    if kc._native_plan is not None:
        # fixed-width columns: the key codes packed from each part's export, one merge of them
        # and one gather of every column from the W parts into one batch (no encode, no
        # concatenation, no take through the order)
        got = K.gather_disjoint([p.data for p in parts], [p.weights for p in parts], schema,
                                kc._native_plan)
        if got is not None:
            return SortedPart(got[0], got[1], codec, nkey)
    # else one k-way merge of the W sorted runs of key codes (None: a key on two workers, a
    # stream not sharded by this key); the rows then in one take of the concatenated parts
    gidx = K.merge_disjoint_runs([p.key_codes(kc) for p in parts])
    if gidx is None:
        return None
    w = np.concatenate([p.weights for p in parts])[gidx]
    return SortedPart(take(concat_batches(parts[0].schema, [p.data for p in parts]), gidx), w,
                      codec, nkey)


def _row_codes(b: OrdIndexedZSet, codec: KeyCodec):
    """The row codes of ``b``'s flattened rows put together from its key and value codes (a row's
    code is its key's bytes then its value's), when every column is fixed-width; else None (the
    rows are encoded then)."""
    kw, vw = b.kcodec.width, b.vcodec.width
    if not codec.fixed or not kw or not vw or kw + vw != codec.width:
        return None
    counts = np.diff(b.offsets)
    if codec.u64:   # big-endian integers of at most 8 bytes: shift the key's past the value's
        return (np.repeat(b.kcodes, counts) << np.uint64(8 * vw)) | b.vcodes
    # rows of kw + vw bytes, each part copied as one opaque item (not byte by byte)
    rows = np.empty(len(b.vcodes), [("k", f"V{kw}"), ("v", f"V{vw}")])
    rows["k"] = np.repeat(_fixed_bytes(b.kcodes, kw).view(f"V{kw}").reshape(-1), counts)
    rows["v"] = _fixed_bytes(b.vcodes, vw).view(f"V{vw}").reshape(-1)
    return VarCodes(np.arange(len(rows) + 1, dtype=np.int64) * codec.width, rows.view(np.uint8))


def _fixed_bytes(codes, w: int) -> np.ndarray:
    """Codes of ``w`` bytes each as a contiguous ``(n, w)`` byte matrix."""
    if isinstance(codes, np.ndarray):   # u64: the big-endian integer of the w bytes
        return np.ascontiguousarray(codes.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - w:])
    return codes.data[codes.offsets[0]:codes.offsets[-1]].reshape(-1, w)


def _sorted_by(part, codec: KeyCodec) -> bool:
    """Whether ``part`` is an in-memory :class:`OrdZSet` whose codes are ``codec``'s (a part
    that came from another process carries an equal codec, not the same object)."""
    return (type(part) is OrdZSet or type(part) is SortedPart) and \
        (part.codec is codec or part.codec.fields == codec.fields)


def output(stream, name: Optional[str], view: bool) -> OutputHandle:
    circuit = stream.circuit
    schema = stream.type.flat_schema if isinstance(stream.type, IndexedType) else stream.schema
    name = name or f"output{len(circuit.outputs)}"
    s = circuit.add_node(f"output:{name}", OutputOperator, [stream], stream.type, kind="output")
    h = OutputHandle(s.node, schema, name, view)
    circuit.outputs.append(h)
    return h


__all__ = ["OutputHandle", "OutputOperator", "SortedPart", "output"]

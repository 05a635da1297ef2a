"""Cursors: walking a batch, or all the batches of a spine, key by key and value by value.

The one cursor vocabulary of the project (after differential dataflow / Feldera):
``key_valid``, ``val_valid``, ``key``, ``val``, ``weight``, ``step_key``, ``seek_key``,
``step_val``, ``seek_val``, ``rewind_keys``, ``rewind_vals``. Keys are visited in code order
(:mod:`dbsp.algebra.codes`), the values of a key likewise. Seeks only move forward.

Operators do bulk, vectorised work on whole batches; cursors serve tests, inspection and walks
that are sequential by nature (top-k, rolling windows). They stay cheap anyway: positions are
integers into the batch's arrays, keys and values become Python tuples only when asked for
(:meth:`key`, :meth:`val`), and ``seek_*`` gallops (exponential then binary search, the last
step through ``K.lower_bound``) so a walk of sorted probes costs ``O(log distance)`` per probe.
``keys_between(lo, hi)`` is the vectorised way to read a key range as one batch.

Cursors:

* :class:`OrdZSetCursor` - over an :class:`OrdZSet`: the keys are the rows, each has one value,
  the unit ``()``, whose weight is the row's weight.
* :class:`OrdIndexedZSetCursor` - over an :class:`OrdIndexedZSet`.
* :class:`SpineCursor` - the merging cursor over the batches of a spine snapshot: a k-way merge
  over key codes (a heap); for the current key, the values of every batch holding it are
  consolidated (weights summed by value code, zero sums skipped), and keys whose values all
  cancel are skipped.
* :class:`OrdKeyBatchCursor`, :class:`OrdValBatchCursor` - over the timed batches of
  :mod:`dbsp.trace.timed`; ``weight`` is the sum over times and :meth:`times` lists
  ``(time, weight)`` pairs.

``seek_key`` / ``seek_val`` take either a Python tuple of column values or a code (``int`` for
u64 codes, ``bytes`` for var codes), as do ``keys_between`` bounds.
"""
from __future__ import annotations

import bisect
import heapq
from typing import Any, Optional, Protocol, Sequence, Union

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import Codes, KeyCodec, VarCodes
from .batch import OrdIndexedZSet, OrdZSet, slice_codes

Code = Union[int, bytes]
KeyLike = Union[tuple, Code]

__all__ = ["Cursor", "OrdZSetCursor", "OrdIndexedZSetCursor", "SpineCursor", "OrdKeyBatchCursor",
           "OrdValBatchCursor", "cursor_for", "encode_tuple"]

_LINEAR = 32  # below this many rows a seek finishes with a Python binary search


class Cursor(Protocol):
    """What every cursor offers."""

    def key_valid(self) -> bool: ...
    def val_valid(self) -> bool: ...
    def key(self) -> tuple: ...
    def val(self) -> tuple: ...
    def weight(self) -> int: ...
    def key_code(self) -> Code: ...
    def step_key(self) -> None: ...
    def seek_key(self, key: KeyLike) -> None: ...
    def step_val(self) -> None: ...
    def seek_val(self, val: KeyLike) -> None: ...
    def rewind_keys(self) -> None: ...
    def rewind_vals(self) -> None: ...


# --- helpers ----------------------------------------------------------------------------------

def _code_at(codes: Codes, i: int) -> Code:
    if isinstance(codes, np.ndarray):
        return int(codes[i])
    o = codes.offsets
    return codes.data[o[i]:o[i + 1]].tobytes()


def _probe(codes: Codes, target: Code) -> Codes:
    if isinstance(codes, np.ndarray):
        return np.asarray([target], dtype=np.uint64)
    return VarCodes.from_list([target])  # type: ignore[list-item]


def encode_tuple(codec: KeyCodec, values: Sequence[Any]) -> Code:
    """The code of one key given as a tuple of column values."""
    if len(values) != len(codec.fields):
        raise ValueError(f"expected {len(codec.fields)} values, got {len(values)}")
    cols = [pa.array([v], type=f.type) for f, v in zip(codec.fields, values)]
    c = codec.encode(cols, 1)
    return _code_at(c, 0)


def _as_code(codec: KeyCodec, k: KeyLike) -> Code:
    if isinstance(k, tuple):
        return encode_tuple(codec, k)
    if isinstance(k, (bytes, bytearray)):
        return bytes(k)
    return int(k)


def _gallop(codes: Codes, lo: int, hi: int, target: Code) -> int:
    """First position in ``[lo, hi)`` whose code is ``>= target`` (``hi`` if none), searching
    outwards from ``lo``: ``O(log(answer - lo))``."""
    if lo >= hi or _code_at(codes, lo) >= target:  # type: ignore[operator]
        return lo
    prev, step = lo, 1  # codes[prev] < target
    while True:
        nxt = prev + step
        if nxt >= hi:
            end = hi
            break
        if _code_at(codes, nxt) >= target:  # type: ignore[operator]
            end = nxt
            break
        prev, step = nxt, step << 1
    a, b = prev + 1, end
    if b - a > _LINEAR:
        return a + int(K.lower_bound(slice_codes(codes, a, b), _probe(codes, target))[0])
    while a < b:
        m = (a + b) >> 1
        if _code_at(codes, m) < target:  # type: ignore[operator]
            a = m + 1
        else:
            b = m
    return a


def _row(batch: pa.RecordBatch, i: int) -> tuple:
    return tuple(c[i].as_py() for c in batch.columns)


def _key_range(codes: Codes, lo: Optional[Code], hi: Optional[Code]) -> tuple[int, int]:
    n = len(codes)
    a = 0 if lo is None else int(K.lower_bound(codes, _probe(codes, lo))[0])
    b = n if hi is None else int(K.lower_bound(codes, _probe(codes, hi))[0])
    return a, max(a, b)


# --- cursors over one batch -------------------------------------------------------------------

class _KeyValCursor:
    """Key and value navigation over an ordered layer of keys whose values are rows
    ``_off[k]:_off[k+1]`` of a value layer (shared by the indexed and the timed cursors)."""

    __slots__ = ("batch", "_kc", "_vc", "_off", "_nk", "_k", "_v", "_vend")

    def __init__(self, batch, key_offsets: np.ndarray):
        self.batch = batch
        self._kc, self._vc, self._off = batch.kcodes, batch.vcodes, key_offsets
        self._nk = batch.num_keys
        self.rewind_keys()

    def _enter_key(self) -> None:
        if self._k < self._nk:
            self._v = int(self._off[self._k])
            self._vend = int(self._off[self._k + 1])
        else:
            self._v = self._vend = 0

    # keys
    def key_valid(self) -> bool:
        return self._k < self._nk

    def key(self) -> tuple:
        return _row(self.batch.keys, self._k)

    def key_code(self) -> Code:
        return _code_at(self._kc, self._k)

    @property
    def key_index(self) -> int:
        return self._k

    def step_key(self) -> None:
        if self._k < self._nk:
            self._k += 1
            self._enter_key()

    def seek_key(self, key: KeyLike) -> None:
        self.seek_key_code(_as_code(self.batch.kcodec, key))

    def seek_key_code(self, code: Code) -> None:
        k = _gallop(self._kc, self._k, self._nk, code)
        if k != self._k:
            self._k = k
            self._enter_key()

    def rewind_keys(self) -> None:
        self._k = 0
        self._enter_key()

    # values
    def val_valid(self) -> bool:
        return self._v < self._vend

    def val(self) -> tuple:
        return _row(self.batch.vals, self._v)

    def val_code(self) -> Code:
        return _code_at(self._vc, self._v)

    def step_val(self) -> None:
        if self._v < self._vend:
            self._v += 1

    def seek_val(self, val: KeyLike) -> None:
        self.seek_val_code(_as_code(self.batch.vcodec, val))

    def seek_val_code(self, code: Code) -> None:
        self._v = _gallop(self._vc, self._v, self._vend, code)

    def rewind_vals(self) -> None:
        if self._k < self._nk:
            self._v = int(self._off[self._k])

    def val_range(self) -> tuple[int, int]:
        """Value rows ``[start, end)`` of the current key."""
        if self._k >= self._nk:
            return 0, 0
        return int(self._off[self._k]), int(self._off[self._k + 1])


class OrdIndexedZSetCursor(_KeyValCursor):
    """A cursor over one :class:`OrdIndexedZSet`."""

    __slots__ = ()

    def __init__(self, batch: OrdIndexedZSet):
        super().__init__(batch, batch.offsets)

    def weight(self) -> int:
        return int(self.batch.weights[self._v])

    # bulk
    def keys_between(self, lo: Optional[KeyLike] = None,
                     hi: Optional[KeyLike] = None) -> OrdIndexedZSet:
        """The keys in ``[lo, hi)`` (None: unbounded) with their values, as a zero-copy slice."""
        c = self.batch.kcodec
        a, b = _key_range(self._kc, None if lo is None else _as_code(c, lo),
                          None if hi is None else _as_code(c, hi))
        return self.batch.slice_keys(a, b)


class OrdZSetCursor:
    """A cursor over one :class:`OrdZSet`: keys are rows, each with the single value ``()``."""

    __slots__ = ("batch", "_kc", "_nk", "_k", "_vdone")

    def __init__(self, batch: OrdZSet):
        self.batch = batch
        self._kc = batch.codes
        self._nk = len(batch)
        self.rewind_keys()

    def key_valid(self) -> bool:
        return self._k < self._nk

    def key(self) -> tuple:
        return _row(self.batch.data, self._k)

    def key_code(self) -> Code:
        return _code_at(self._kc, self._k)

    @property
    def key_index(self) -> int:
        return self._k

    def step_key(self) -> None:
        if self._k < self._nk:
            self._k += 1
            self._vdone = False

    def seek_key(self, key: KeyLike) -> None:
        self.seek_key_code(_as_code(self.batch.codec, key))

    def seek_key_code(self, code: Code) -> None:
        k = _gallop(self._kc, self._k, self._nk, code)
        if k != self._k:
            self._k = k
            self._vdone = False

    def rewind_keys(self) -> None:
        self._k = 0
        self._vdone = False

    def val_valid(self) -> bool:
        return self._k < self._nk and not self._vdone

    def val(self) -> tuple:
        return ()

    def weight(self) -> int:
        return int(self.batch.weights[self._k])

    def step_val(self) -> None:
        self._vdone = True

    def seek_val(self, val: KeyLike = ()) -> None:
        """Values are the unit: every seek target is at or before it (a no-op)."""

    def rewind_vals(self) -> None:
        self._vdone = False

    def keys_between(self, lo: Optional[KeyLike] = None,
                     hi: Optional[KeyLike] = None) -> OrdZSet:
        c = self.batch.codec
        a, b = _key_range(self._kc, None if lo is None else _as_code(c, lo),
                          None if hi is None else _as_code(c, hi))
        return self.batch.slice(a, b)


def cursor_for(batch) -> Any:
    """The cursor of a batch of any kind (untimed or timed)."""
    if isinstance(batch, OrdIndexedZSet):
        return OrdIndexedZSetCursor(batch)
    if isinstance(batch, OrdZSet):
        return OrdZSetCursor(batch)
    from .timed import OrdKeyBatch, OrdValBatch
    if isinstance(batch, OrdKeyBatch):
        return OrdKeyBatchCursor(batch)
    if isinstance(batch, OrdValBatch):
        return OrdValBatchCursor(batch)
    make = getattr(batch, "cursor", None)  # other batches (layer files) bring their own
    if make is not None:
        return make()
    raise TypeError(f"no cursor for {type(batch).__name__}")


# --- the merging cursor -----------------------------------------------------------------------

_VECTOR = 256  # values of one key above which they are consolidated with K.merge_consolidate


class SpineCursor:
    """A merging cursor over several batches of one kind (a spine snapshot).

    Keys come out once each in code order; the values of the current key are consolidated over
    all batches holding it (weights summed, zero-weight values skipped); a key whose values all
    cancel is skipped. Seeking a key seeks every batch cursor (each gallops from where it is).
    """

    def __init__(self, batches: Sequence[Union[OrdZSet, OrdIndexedZSet]]):
        self.batches = tuple(b for b in batches if len(b))
        self._cursors = [cursor_for(b) for b in self.batches]
        self._indexed = bool(self.batches) and getattr(
            self.batches[0], "indexed", isinstance(self.batches[0], OrdIndexedZSet))
        self._codec: Optional[KeyCodec] = None
        if self.batches:
            b0 = self.batches[0]
            self._codec = b0.kcodec if self._indexed else b0.codec  # type: ignore[union-attr]
        self._heap: list[tuple[Code, int]] = []
        self._members: list[int] = []
        self._code: Optional[Code] = None
        # consolidated values of the current key (indexed, several batches)
        self._single: Optional[OrdIndexedZSetCursor] = None
        self._vcl: list = []
        self._vm: list[int] = []
        self._vr: list[int] = []
        self._vw: list[int] = []
        self._vi = 0
        self._zw = 0  # Z-set traces: the summed weight of the current row
        self.rewind_keys()

    # -- the key merge ---------------------------------------------------------------------
    def _rebuild(self) -> None:
        self._heap = [(c.key_code(), i) for i, c in enumerate(self._cursors) if c.key_valid()]
        heapq.heapify(self._heap)
        self._settle()

    def _settle(self) -> None:
        heap, curs = self._heap, self._cursors
        while heap:
            code = heap[0][0]
            members = []
            while heap and heap[0][0] == code:
                members.append(heapq.heappop(heap)[1])
            members.sort()
            if self._gather(members):
                self._members, self._code = members, code
                return
            for i in members:
                c = curs[i]
                c.step_key()
                if c.key_valid():
                    heapq.heappush(heap, (c.key_code(), i))
        self._members, self._code = [], None

    def _gather(self, members: list[int]) -> bool:
        """Consolidate the current key's values over ``members``; False if they all cancel."""
        curs = self._cursors
        if not self._indexed:
            w = sum(curs[i].weight() for i in members)
            self._zw, self._vi = w, 0
            return w != 0
        if len(members) == 1:  # one batch: already consolidated, walk it directly
            self._single = curs[members[0]]
            self._single.rewind_vals()
            return True
        self._single = None
        ranges = [(i, *curs[i].val_range()) for i in members]
        total = sum(r1 - r0 for _, r0, r1 in ranges)
        vcl: list = []
        vm: list[int] = []
        vr: list[int] = []
        vw: list[int] = []
        if total > _VECTOR:
            runs, starts, acc = [], [], 0
            for i, r0, r1 in ranges:
                b = curs[i].batch
                runs.append((slice_codes(b.vcodes, r0, r1), None, b.weights[r0:r1]))
                starts.append(acc)
                acc += r1 - r0
            gidx, w = K.merge_consolidate(runs)
            st = np.asarray(starts, np.int64)
            which = np.searchsorted(st, gidx, side="right") - 1
            for g, m, ww in zip(gidx.tolist(), which.tolist(), w.tolist()):
                i, r0, _ = ranges[m]
                r = r0 + g - starts[m]
                vm.append(i)
                vr.append(r)
                vw.append(ww)
                vcl.append(_code_at(curs[i].batch.vcodes, r))
        else:
            items = []
            for i, r0, r1 in ranges:
                b = curs[i].batch
                vc, ws = b.vcodes, b.weights
                for r in range(r0, r1):
                    items.append((_code_at(vc, r), i, r, int(ws[r])))
            items.sort(key=lambda t: t[0])
            for code, i, r, w in items:
                if vcl and vcl[-1] == code:
                    vw[-1] += w
                else:
                    vcl.append(code)
                    vm.append(i)
                    vr.append(r)
                    vw.append(w)
            if 0 in vw:
                keep = [j for j, w in enumerate(vw) if w != 0]
                vcl = [vcl[j] for j in keep]
                vm = [vm[j] for j in keep]
                vr = [vr[j] for j in keep]
                vw = [vw[j] for j in keep]
        self._vcl, self._vm, self._vr, self._vw, self._vi = vcl, vm, vr, vw, 0
        return bool(vw)

    # -- keys ------------------------------------------------------------------------------
    def key_valid(self) -> bool:
        return self._code is not None

    def key(self) -> tuple:
        return self._cursors[self._members[0]].key()

    def key_code(self) -> Code:
        if self._code is None:
            raise IndexError("cursor is past the last key")
        return self._code

    def step_key(self) -> None:
        if self._code is None:
            return
        for i in self._members:
            c = self._cursors[i]
            c.step_key()
            if c.key_valid():
                heapq.heappush(self._heap, (c.key_code(), i))
        self._settle()

    def seek_key(self, key: KeyLike) -> None:
        if self._codec is None:
            return
        self.seek_key_code(_as_code(self._codec, key))

    def seek_key_code(self, code: Code) -> None:
        if self._code is None or self._code >= code:  # type: ignore[operator]
            return
        for c in self._cursors:
            c.seek_key_code(code)
        self._rebuild()

    def rewind_keys(self) -> None:
        for c in self._cursors:
            c.rewind_keys()
        self._rebuild()

    # -- values ----------------------------------------------------------------------------
    def val_valid(self) -> bool:
        if self._code is None:
            return False
        if not self._indexed:
            return self._vi == 0
        if self._single is not None:
            return self._single.val_valid()
        return self._vi < len(self._vw)

    def val(self) -> tuple:
        if not self._indexed:
            return ()
        if self._single is not None:
            return self._single.val()
        return _row(self._cursors[self._vm[self._vi]].batch.vals, self._vr[self._vi])

    def val_code(self) -> Code:
        if self._single is not None:
            return self._single.val_code()
        return self._vcl[self._vi]

    def weight(self) -> int:
        if not self._indexed:
            return self._zw
        if self._single is not None:
            return self._single.weight()
        return self._vw[self._vi]

    def step_val(self) -> None:
        if self._single is not None:
            self._single.step_val()
        else:
            self._vi += 1

    def seek_val(self, val: KeyLike) -> None:
        if not self._indexed or self._code is None:
            return
        code = _as_code(self.batches[0].vcodec, val)  # type: ignore[union-attr]
        if self._single is not None:
            self._single.seek_val_code(code)
        else:
            self._vi = bisect.bisect_left(self._vcl, code, self._vi)

    def rewind_vals(self) -> None:
        if self._single is not None:
            self._single.rewind_vals()
        else:
            self._vi = 0

    # -- bulk ------------------------------------------------------------------------------
    def keys_between(self, lo: Optional[KeyLike] = None, hi: Optional[KeyLike] = None):
        """The consolidated rows of the keys in ``[lo, hi)`` as one batch (None if none)."""
        parts = [p for p in (c.keys_between(lo, hi) for c in self._cursors) if len(p)]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        from .spine import merge_batches
        m = merge_batches(parts)
        return m if len(m) else None


# --- cursors over timed batches ---------------------------------------------------------------

class OrdKeyBatchCursor:
    """A cursor over an :class:`~dbsp.trace.timed.OrdKeyBatch`: each key has the single value
    ``()``; :meth:`weight` sums its times, :meth:`times` lists them."""

    def __init__(self, batch):
        self.batch = batch
        self._kc, self._nk = batch.kcodes, batch.num_keys
        self.rewind_keys()

    def key_valid(self) -> bool:
        return self._k < self._nk

    def key(self) -> tuple:
        return _row(self.batch.keys, self._k)

    def key_code(self) -> Code:
        return _code_at(self._kc, self._k)

    def step_key(self) -> None:
        if self._k < self._nk:
            self._k += 1
            self._vdone = False

    def seek_key(self, key: KeyLike) -> None:
        self.seek_key_code(_as_code(self.batch.kcodec, key))

    def seek_key_code(self, code: Code) -> None:
        k = _gallop(self._kc, self._k, self._nk, code)
        if k != self._k:
            self._k, self._vdone = k, False

    def rewind_keys(self) -> None:
        self._k, self._vdone = 0, False

    def val_valid(self) -> bool:
        return self._k < self._nk and not self._vdone

    def val(self) -> tuple:
        return ()

    def step_val(self) -> None:
        self._vdone = True

    def seek_val(self, val: KeyLike = ()) -> None:
        pass

    def rewind_vals(self) -> None:
        self._vdone = False

    def times(self) -> list[tuple[int, int]]:
        o = self.batch.offsets
        a, b = int(o[self._k]), int(o[self._k + 1])
        return list(zip(self.batch.times[a:b].tolist(), self.batch.weights[a:b].tolist()))

    def weight(self) -> int:
        o = self.batch.offsets
        return int(self.batch.weights[int(o[self._k]):int(o[self._k + 1])].sum())


class OrdValBatchCursor(_KeyValCursor):
    """A cursor over an :class:`~dbsp.trace.timed.OrdValBatch`: :meth:`weight` sums the current
    value's times, :meth:`times` lists them."""

    __slots__ = ("_voff",)

    def __init__(self, batch):
        self._voff = batch.val_offsets
        super().__init__(batch, batch.key_offsets)

    def times(self) -> list[tuple[int, int]]:
        a, b = int(self._voff[self._v]), int(self._voff[self._v + 1])
        return list(zip(self.batch.times[a:b].tolist(), self.batch.weights[a:b].tolist()))

    def weight(self) -> int:
        a, b = int(self._voff[self._v]), int(self._voff[self._v + 1])
        return int(self.batch.weights[a:b].sum())

"""The merging cursor over the batches of a spine snapshot.

:class:`SpineCursor` is a k-way merge over key codes (a heap) of the cursors of several batches
of one kind (:func:`dbsp.trace.cursor.cursor_for`): for the current key, the values of every
batch holding it are consolidated (weights summed by value code, zero sums skipped), and keys
whose values all cancel are skipped. It speaks the cursor vocabulary of
:mod:`dbsp.trace.cursor`.
"""
from __future__ import annotations

import bisect
import heapq
from typing import Any, Optional, Sequence

import numpy as np

from ..algebra import kernels as K
from ..algebra.codes import Code, Codes, KeyCodec
from .batch import merge_batches
from .cursor import KeyLike, OrdIndexedZSetCursor, as_code, cursor_for, row_of

__all__ = ["SpineCursor"]

_VECTOR = 256  # values of one key above which they are consolidated with K.merge_consolidate


class SpineCursor:
    """A merging cursor over several batches of one kind (a spine snapshot).

    Keys come out once each in code order; the values of the current key are consolidated over
    all batches holding it (weights summed, zero-weight values skipped); a key whose values all
    cancel is skipped. Seeking a key seeks every batch cursor (each gallops from where it is).
    """

    def __init__(self, batches: Sequence[Any]):
        self.batches = tuple(b for b in batches if len(b))
        self._cursors = [cursor_for(b) for b in self.batches]
        self._indexed = bool(self.batches) and bool(self.batches[0].indexed)
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
                runs.append((Codes.slice(b.vcodes, r0, r1), None, b.weights[r0:r1]))
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
                vcl.append(Codes.at(curs[i].batch.vcodes, r))
        else:
            items = []
            for i, r0, r1 in ranges:
                b = curs[i].batch
                vc, ws = b.vcodes, b.weights
                for r in range(r0, r1):
                    items.append((Codes.at(vc, r), i, r, int(ws[r])))
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
        self.seek_key_code(as_code(self._codec, key))

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
        return row_of(self._cursors[self._vm[self._vi]].batch.vals, self._vr[self._vi])

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
        code = as_code(self.batches[0].vcodec, val)  # type: ignore[union-attr]
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
        m = merge_batches(parts)
        return m if len(m) else None

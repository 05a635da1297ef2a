"""upsert: insert-or-replace by key on an input stream.

An input created with ``key=[...]`` (:meth:`dbsp.Circuit.add_input`), or given a key by its first
``upsert(data, key=[...])`` call, remembers its current rows by key: a
:class:`~dbsp.trace.spine.Spine` of :class:`OrdIndexedZSet` (``key -> other columns``) that every
push (insert, delete, push with weights, upsert) updates on the driver.

``upsert(data)`` turns rows into the Z-set change that makes each key hold exactly its new row::

    Δ = Σ_{k in keys(data)} ( {new_k} - current(k) )

where ``new_k`` is the *last* row of ``data`` with key ``k`` and ``current(k)`` all rows the input
holds for ``k`` (one spine lookup for all keys; an unchanged row cancels out). Everything is
validated and computed before anything is applied: a refused upsert changes neither the pending
data nor the key state.

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> t = c.add_input("prices", [("item", pa.string()), ("price", pa.int64())], key=["item"])
>>> out = t.output()
>>> _ = t.upsert([("apple", 3), ("pear", 4), ("apple", 5)]); c.step(); sorted(out.to_dict().items())
[(('apple', 5), 1), (('pear', 4), 1)]
>>> _ = t.upsert([("pear", 6)]); c.step(); sorted(out.to_dict().items())
[(('pear', 4), -1), (('pear', 6), 1)]
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from ..algebra import kernels as K
from ..algebra.codes import KeyCodec
from ..algebra.schema import WEIGHT, InputError, conform, take
from ..circuit.operator import Stateful
from ..trace.batch import OrdIndexedZSet
from ..trace.spine import Spine


class KeyState(Stateful):
    """The current rows of a keyed input, indexed by key."""

    state_attrs = ('trace',)

    def __init__(self, input_name: str, schema: pa.Schema, key: Sequence[str]):
        key = [key] if isinstance(key, str) else list(key)
        if not key:
            raise ValueError(f"input '{input_name}': an upsert key needs at least one column")
        for k in key:
            if k not in schema.names:
                raise KeyError(f"input '{input_name}': no column '{k}' for the key (columns: "
                               f"{schema.names})")
        if len(set(key)) != len(key):
            raise ValueError(f"input '{input_name}': duplicate key columns {key}")
        self.key = key
        self.vals = [n for n in schema.names if n not in key]
        self.schema = schema
        self.kcodec = KeyCodec([schema.field(k) for k in key])
        self.vcodec = KeyCodec([schema.field(v) for v in self.vals])
        self.trace = Spine(name=f"upsert:{input_name}")

    def indexed(self, batch: pa.RecordBatch, w: np.ndarray,
                kcodes=None) -> OrdIndexedZSet:
        return OrdIndexedZSet.from_parts(batch.select(self.key), batch.select(self.vals), w,
                                         self.kcodec, self.vcodec, kcodes=kcodes)

    def record(self, ix: OrdIndexedZSet) -> None:
        if len(ix):
            self.trace.insert(ix)

    def rows(self) -> int:
        return len(self.trace)


def set_key(inp, key: Sequence[str]) -> KeyState:
    """Make ``inp`` remember its rows by ``key`` (before any data was pushed into it)."""
    key = [key] if isinstance(key, str) else list(key)
    if inp._key is not None:
        if inp._key.key != key:
            raise ValueError(f"input '{inp.name}' is keyed by {inp._key.key}, not {key}")
        return inp._key
    if inp._rows_pushed:
        raise ValueError(f"input '{inp.name}' received rows before it had a key, so it cannot "
                         f"know its current rows: create it with add_input(..., key={key})")
    inp._key = KeyState(inp.name, inp.schema, key)
    return inp._key


def upsert_push(inp, data: Any, key: Optional[Sequence[str]] = None) -> int:
    """Insert rows of ``data``, replacing the current rows of their keys (the last row of a key
    in ``data`` wins). Returns the number of keys upserted."""
    state = inp._key
    if key is not None:
        state = set_key(inp, key)
    elif state is None:
        raise ValueError(f"input '{inp.name}' has no key: create it with add_input(..., key=[...]) "
                         f"or pass upsert(data, key=[...])")
    if isinstance(data, (pa.Table, pa.RecordBatch)) and WEIGHT in data.schema.names:
        raise InputError(inp.name, "upsert takes rows without weights", WEIGHT)
    batch, _ = conform(inp.name, inp.schema, data, None)
    n = batch.num_rows
    if n == 0:
        return 0
    kcodes = state.kcodec.encode(batch.select(state.key).columns, n)
    rev = np.arange(n - 1, -1, -1, dtype=np.int64)
    perm, _ = K.sort_consolidate(K.take(kcodes, rev), None, np.ones(n, np.int64))
    last = rev[perm]  # the last row of each key, in key order
    new = take(batch, last)
    old = state.trace.lookup(K.take(kcodes, last))
    if old is None or len(old) == 0:
        delta, w = new, np.ones(len(last), np.int64)
    else:
        old_rows = old.flatten().data.select(inp.schema.names)
        old_rows = pa.RecordBatch.from_arrays(old_rows.columns, schema=inp.schema)
        delta = pa.concat_batches([old_rows, new])
        w = np.concatenate([-old.weights, np.ones(len(last), np.int64)])
    inp.circuit.check_open("push into")
    inp._accept(delta, w, held=True)  # conformed above; the old rows come from the key state
    return len(last)


__all__ = ["upsert_push", "set_key", "KeyState"]

"""Sinks of the fluent API: :class:`Collector` (the future of ``collect()``) and ``for_each``.

Both sit on the circuit's output handles (:mod:`dbsp.operators.output`): after every step the
handle holds that step's change, gathered from all workers. A :class:`Collector` reads it (and the
integrated view) on demand as Arrow or pandas; a ``for_each`` callback gets it pushed by the
context after each step.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa

from ..algebra.schema import WEIGHT


class Collector:
    """What a stream produced: the last step's change and everything so far.

    Tables carry a ``__weight`` column (+n: inserted n times, -n: retracted). :meth:`rows`
    expands the view into a sorted list of row tuples (each repeated by its weight), handy in
    tests and notebooks.
    """

    def __init__(self, handle):
        self.handle = handle

    def __repr__(self) -> str:
        return f"<Collector {self.handle.name} {self.schema.names}>"

    @property
    def schema(self) -> pa.Schema:
        return self.handle.schema

    # the last step's change
    def delta(self) -> pa.Table:
        """The consolidated change of the last step (with ``__weight``)."""
        return self.handle.to_arrow()

    def delta_pandas(self):
        return self.handle.to_pandas()

    def delta_dict(self) -> dict[tuple, int]:
        return self.handle.to_dict()

    # everything so far
    def view(self) -> pa.Table:
        """The integrated view: every row with its current total weight."""
        return self.handle.view_arrow()

    def view_pandas(self):
        return self.handle.view_pandas()

    def view_dict(self) -> dict[tuple, int]:
        return self.handle.view_dict()

    def to_arrow(self) -> pa.Table:
        """The view as a plain table without weights, each row repeated by its weight (rows of
        negative weight, which a well-formed query never leaves behind, are omitted)."""
        t = self.view()
        w = t.column(WEIGHT).to_numpy()
        idx = np.repeat(np.arange(len(w)), np.maximum(w, 0))
        return t.drop_columns([WEIGHT]).take(pa.array(idx, pa.int64()))

    def to_pandas(self):
        return self.to_arrow().to_pandas()

    # Polars and dicts of columns (through Arrow: zero-copy where the layouts agree)
    def delta_polars(self):
        """The last step's change as a Polars DataFrame (with ``__weight``)."""
        return _polars(self.delta())

    def view_polars(self):
        """The integrated view as a Polars DataFrame (with ``__weight``)."""
        return _polars(self.view())

    def to_polars(self):
        """Like :meth:`to_arrow` (rows repeated by weight, no weights), as Polars."""
        return _polars(self.to_arrow())

    def delta_columns(self, numpy: bool = False) -> dict:
        """The last step's change as ``{column: array}`` (``__weight`` included); Arrow arrays,
        or numpy arrays with ``numpy=True`` (object arrays for columns numpy cannot hold)."""
        return _columns(self.delta(), numpy)

    def view_columns(self, numpy: bool = False) -> dict:
        """The integrated view as ``{column: array}`` (see :meth:`delta_columns`)."""
        return _columns(self.view(), numpy)

    def rows(self) -> list[tuple]:
        """The view as a sorted list of row tuples (with repetitions); None sorts first."""
        out = []
        for r, w in self.view_dict().items():
            out.extend([r] * max(w, 0))
        return sorted(out, key=_sort_key)

    def __len__(self) -> int:
        return sum(max(w, 0) for w in self.view_dict().values())


def _polars(t: pa.Table):
    try:
        import polars as pl
    except ImportError:
        raise ImportError("Polars output needs the polars package (pip install 'dbsp[pandas]')") \
            from None
    return pl.from_arrow(t)


def _columns(t: pa.Table, numpy: bool) -> dict:
    out = {}
    for name in t.column_names:
        c = t.column(name)
        c = c.combine_chunks() if c.num_chunks != 1 else c.chunk(0)
        out[name] = c.to_numpy(zero_copy_only=False) if numpy else c
    return out


def _sort_key(row: tuple) -> tuple:
    return tuple((v is not None, v) for v in row)


class ForEach:
    """Calls ``fn(delta table)`` after every step (see :meth:`DataStream.for_each`)."""

    def __init__(self, handle, fn: Callable[[pa.Table], Any], skip_empty: bool,
                 consolidate: bool = True):
        self.handle, self.fn, self.skip_empty = handle, fn, skip_empty
        self.consolidate = consolidate

    def fire(self) -> None:
        d = self.handle.delta() if self.consolidate else self.handle.delta_loose()
        if self.skip_empty and len(d) == 0:
            return
        self.fn(d.to_arrow())


__all__ = ["Collector", "ForEach"]

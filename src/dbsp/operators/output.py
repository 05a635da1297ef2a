"""Output handles: a step's delta and the integrated view, as Arrow / pandas / dicts.

Each worker's output operator keeps its part of the delta; after the step the handle gathers
the parts of all workers, consolidates them into one :class:`OrdZSet` (rows from different
workers may coincide when the stream was not sharded) and, when asked for, adds it to the
integrated view (a spine).
"""
from __future__ import annotations

from typing import Optional

import pyarrow as pa

from ..circuit.operator import Operator
from ..circuit.types import IndexedType
from ..trace.batch import OrdIndexedZSet, OrdZSet, ZSet
from ..trace.spine import Spine


class OutputOperator(Operator):
    name = "output"

    def __init__(self, ctx):
        super().__init__(ctx)
        self.last = None

    def eval(self, value):
        self.last = value.flatten() if isinstance(value, OrdIndexedZSet) else value
        return None


class OutputHandle:
    """The delta of the last step (:meth:`delta`) and, with ``view=True``, the integrated view."""

    def __init__(self, node: int, schema: pa.Schema, name: str, keep_view: bool):
        self.node = node
        self.schema = schema
        self.name = name
        self._delta: OrdZSet = OrdZSet.empty(schema)
        self._view: Optional[Spine] = Spine(name=f"view:{name}") if keep_view else None
        self._view_cache: Optional[OrdZSet] = None

    def _gather(self, replicas) -> None:
        parts = []
        for r in replicas:
            op = r.ops[self.node]
            if op.last is not None and len(op.last):
                parts.append(op.last)
            op.last = None
        if not parts:
            self._delta = OrdZSet.empty(self.schema)
        else:
            cons = [p.consolidate() for p in parts]
            cons = [c for c in cons if len(c)]
            self._delta = OrdZSet.merge(cons) if cons else OrdZSet.empty(self.schema)
        if self._view is not None and len(self._delta):
            self._view.insert(self._delta)
            self._view_cache = None

    # -- delta ----------------------------------------------------------------------------
    def delta(self) -> OrdZSet:
        """The consolidated change of the last step."""
        return self._delta

    def to_arrow(self) -> pa.Table:
        """The last step's delta as a table with a ``__weight`` column."""
        return self._delta.to_arrow()

    def to_pandas(self):
        return self._delta.to_pandas()

    def to_dict(self) -> dict[tuple, int]:
        return self._delta.to_dict()

    # -- integrated view ------------------------------------------------------------------
    def view(self) -> OrdZSet:
        """Everything output so far, consolidated (the materialised view)."""
        if self._view is None:
            raise RuntimeError(f"output '{self.name}' keeps no view (created with view=False)")
        if self._view_cache is None:
            v = self._view.consolidated()
            self._view_cache = v if v is not None else OrdZSet.empty(self.schema)
        return self._view_cache  # type: ignore[return-value]

    def view_arrow(self) -> pa.Table:
        return self.view().to_arrow()

    def view_pandas(self):
        return self.view().to_pandas()

    def view_dict(self) -> dict[tuple, int]:
        return self.view().to_dict()


def output(stream, name: Optional[str], view: bool) -> OutputHandle:
    circuit = stream.circuit
    schema = stream.type.flat_schema if isinstance(stream.type, IndexedType) else stream.schema
    name = name or f"output{len(circuit.outputs)}"
    s = circuit.add_node(f"output:{name}", OutputOperator, [stream], stream.type, kind="output")
    h = OutputHandle(s.node, schema, name, view)
    circuit.outputs.append(h)
    return h


__all__ = ["OutputHandle", "OutputOperator", "output"]
_ = ZSet

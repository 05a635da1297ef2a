"""recursive: the least fixed point ``x = fn(x, *inputs)``, computed by a nested circuit each step.

Maths
-----
For a query ``fn`` built from the stream operators, DBSP computes the fixed point with a nested
circuit running in *inner time* (DBSP, Sec. 5–6): the body's operators are the incremental ones,
its input is the impulse ``δ0(i)`` (the value at inner step 0, nothing after) and its output is fed
back through ``z^-1``::

    o = fn^Δ(z^-1(o), δ0(i))         x = Σ_n o_n     (stop when o_n = 0 on every worker)

Because ``fn^Δ`` sees the change ``o_{n-1}`` of ``x``, the inner loop is exactly *semi-naive*
evaluation: step ``n`` only derives what is new since step ``n-1``.

Between outer steps (outer time) the body runs in one of two ways, fixed when it is built:

* **nested incremental** (the default whenever the body allows it): the DBSP paper's nested
  incremental circuit. Every stream of the body carries changes indexed by ``(outer step, inner
  iteration)``; the stateful operators (join, semijoin, antijoin, left join, distinct) are
  replaced by their two-dimensional incremental forms (:mod:`dbsp.operators.nested`, where the
  maths is; aggregates too, read per touched group), whose traces keep every change with its inner iteration, the outer steps summed
  (:class:`~dbsp.trace.timed.TimedTrace`). At each outer step the input *deltas* enter at inner
  time 0 and the loop derives the change of every iteration of the previous fixed point: an
  inserted edge adds its paths, a deleted edge retracts the paths derived through it (at the
  iteration where each was derived) and nothing else, cycles of facts that support each other
  included. The output is ``Σ_n o_n``, the change of ``x*``. The loop ends when the fed-back
  change is empty and no operator still holds old changes at later iterations for the rows this
  step touched (:meth:`~dbsp.operators.nested.NestedOperator.pending`), on every worker.
  Linear operators (map, filter, flat_map, plus, minus, neg, index_by, flatten, exchange) need
  no change.
* **fallback** for bodies with an operator that has no nested form (topk, delay, integrate,
  differentiate, a recursion nested in the body, a linear aggregate that pre-aggregates before
  its exchange with W > 1: :func:`not_nestable` names them), or ``incremental=False``, chosen
  each step and agreed by all workers:

  - *seeded*: when every input delta only inserts (all weights positive) and the body is
    monotone (no ``neg`` / ``minus`` / antijoin / left join / aggregate / topk), the inner
    operators keep their state from the previous fixed point ``x*`` and the body is fed the
    input deltas: the iteration continues from ``x*`` (a pre-fixed point below the new least
    fixed point), deriving only the consequences of the new rows;
  - *recompute*: otherwise every inner operator is reset (``clock_start``) and the fixed point is
    computed again from the integrated inputs; the output is ``x*_t - x*_{t-1}``. Cost:
    proportional to the whole fixed point, whatever the change.

  ``monotone=True/False`` overrides the detection of monotone bodies (it matters only here).

With W workers the inner circuit runs on every worker (its exchanges use the same transport),
the body's result is sharded by row (or key) hash, and an inner step is the last only when it
produced nothing on *all* workers (``all_gather``).

>>> import pyarrow as pa, dbsp
>>> c = dbsp.Circuit()
>>> E = pa.schema([pa.field("src", pa.int64(), False), pa.field("dst", pa.int64(), False)])
>>> edges = c.add_input("edges", E)
>>> def closure(paths, edges):   # paths ∪ paths∘edges, as a set
...     step = paths.index_by(["dst"]).join(edges.index_by(["src"]),
...         lambda k, l, r: {"src": l["src"], "dst": r["dst"]}, E)
...     return edges.plus(step).distinct()
>>> tc = c.recursive(closure, edges).output()
>>> _ = edges.insert([(1, 2), (2, 3)]); c.step(); sorted(tc.view_dict())
[(1, 2), (1, 3), (2, 3)]
>>> _ = edges.insert([(3, 4)]); c.step(); sorted(tc.to_dict())       # only the new paths
[(1, 4), (2, 4), (3, 4)]
>>> _ = edges.delete([(2, 3)]); c.step(); sorted(tc.to_dict().items())  # only the lost ones
[((1, 3), -1), ((1, 4), -1), ((2, 3), -1), ((2, 4), -1)]
>>> _recursive_op = next(op for op in c._replicas[0].ops if op.name == "recursive")
>>> _recursive_op.nested, _recursive_op.recomputes
(True, 0)
"""
from __future__ import annotations

from typing import Any, Callable, Optional


from ..algebra.schema import as_schema
from ..circuit.graph import Graph
from ..circuit.scheduler import Scheduler
from ..circuit.operator import Operator
from ..circuit.types import IndexedType, ZSetType
from ..trace.batch import OrdIndexedZSet, OrdZSet
from ..trace.spine import Spine
from ._values import empty_of
from .delay import feedback
from .exchange import sharded
from .nested import NestedOperator, nest, nestable
from .stream import make_stream

NON_MONOTONE = ("neg", "minus", "differentiate", "aggregate", "topk", "delay", "recursive",
                "pad_nulls")


class ChildCircuit(Graph):
    """The body of a recursion: built like any circuit, run by :class:`RecursiveOperator` on
    every worker of the parent (sharing its worker context and transport)."""

    def __init__(self, parent: Graph):
        super().__init__(make_stream, name=f"{parent.name}/recursive", workers=parent.workers)
        self.parent = parent

    def add_input(self, name: str, schema: Any, **kw):
        raise TypeError("a recursive body has no inputs of its own: pass outer streams to "
                        "recursive(fn, *streams) and use the streams fn receives")

    def step(self) -> None:
        raise TypeError("a recursive body is stepped by its parent circuit")

    def recursive(self, fn: Callable, *inputs: Any, **kw: Any):
        """A fixed point nested in this body (see :func:`recursive`)."""
        return recursive(self, fn, *inputs, **kw)


class ImportOperator(Operator):
    """An outer value entering the body: set by the parent before an inner step, else empty."""

    name = "import"

    def __init__(self, ctx, type_):
        super().__init__(ctx)
        self.type = type_
        self.value = None

    def eval(self):
        v, self.value = self.value, None
        return v if v is not None else empty_of(self.type)


def _consolidated(type_, value):
    if value is None:
        return empty_of(type_)
    return value.consolidate() if isinstance(type_, ZSetType) else value


def _sum(type_, parts: list):
    parts = [p for p in parts if p is not None and len(p)]
    if not parts:
        return empty_of(type_)
    merged = (OrdIndexedZSet.merge(parts) if isinstance(type_, IndexedType)
              else OrdZSet.merge([p.consolidate() for p in parts]))
    return merged if len(merged) else empty_of(type_)


class RecursiveOperator(Operator):
    """Runs the body's replica (on this worker) to a fixed point at every outer step."""

    state_attrs = ('child', 'inputs', 'result', 'iterations', 'recomputes')

    name = "recursive"

    def __init__(self, ctx, nodes, import_ids: list[int], in_types: list, fb_id: int, x_type,
                 monotone: bool, max_iterations: int, nested: bool = False):
        super().__init__(ctx)
        self.child = Scheduler(nodes, ctx)
        #: nested incremental mode: the body's state is timed and kept across outer steps
        self.nested = nested
        self._timed = [op for op in self.child.ops if isinstance(op, NestedOperator)]
        self.import_ids, self.in_types, self.fb_id = import_ids, in_types, fb_id
        self.x_type, self.monotone, self.max_iterations = x_type, monotone, max_iterations
        self.inputs = [Spine(name="recursive.input") for _ in import_ids]
        self.result = Spine(name="recursive.result")
        self.iterations = 0  # inner steps run (for tests and profiles)
        self.recomputes = 0

    def _agree(self, value) -> list:
        if self.ctx.workers == 1:
            return [value]
        return self.ctx.transport.all_gather(self.ctx.worker, value)

    def eval(self, *deltas):
        ds = [_consolidated(t, d) for t, d in zip(self.in_types, deltas)]
        changed = any(len(d) for d in ds)
        if self.nested:
            if not any(self._agree(changed)):
                return empty_of(self.x_type)
            return self._nested_step(ds)
        inserts_only = all(len(d) == 0 or bool((d.weights > 0).all()) for d in ds)
        for sp, d in zip(self.inputs, ds):
            if len(d):
                sp.insert(d)
        votes = self._agree((changed, inserts_only))
        if not any(v[0] for v in votes):
            return empty_of(self.x_type)
        seeded = self.monotone and all(v[1] for v in votes)
        if seeded:
            feed = ds
        else:
            self.recomputes += 1
            for op in self.child.ops:
                op.clock_start()
            feed = []
            for t, sp in zip(self.in_types, self.inputs):
                v = sp.consolidated()
                feed.append(v if v is not None else empty_of(t))
        parts = self._iterate(feed)
        if seeded:
            delta = _sum(self.x_type, parts)
            if len(delta):
                self.result.insert(delta)
            return delta
        new = _sum(self.x_type, parts)
        prev = self.result.consolidated()
        delta = new if prev is None else _sum(self.x_type, [new, prev.neg()])
        self.result.clear()
        if len(new):
            self.result.insert(new)
        return delta

    def _nested_step(self, ds: list):
        """One outer step of the nested incremental circuit: the input deltas enter at inner
        time 0; the timed operators continue from their traces (see :mod:`.nested`)."""
        ops = self.child.ops
        ops[self.fb_id].clock_start()  # z^-1 in inner time: nothing fed back at iteration 0
        for op in self._timed:
            op.begin()
        parts = self._iterate(ds)
        for op in self._timed:
            op.end()
        return _sum(self.x_type, parts)

    def _iterate(self, feed: list) -> list:
        parts = []
        n = 0
        ops = self.child.ops
        timed = self._timed if self.nested else ()
        while True:
            if n == 0:
                for i, v in zip(self.import_ids, feed):
                    ops[i].value = v
            for op in timed:
                op.time = n
            self.child.step()
            o = ops[self.fb_id].value  # this inner step's change of x (consolidated, sharded)
            busy = o is not None and len(o) > 0
            if busy:
                parts.append(o)
            elif timed:
                busy = any(op.pending(n) for op in timed)
            n += 1
            self.iterations += 1
            if not any(self._agree(busy)):
                return parts
            if n >= self.max_iterations:
                raise RuntimeError(f"recursive: no fixed point after {n} inner steps (is the "
                                   f"body missing a distinct()?)")

    def savepoint(self):
        return self.child.savepoint(), self.iterations, self.recomputes

    def restore(self, saved) -> None:
        inner, self.iterations, self.recomputes = saved
        self.child.restore(inner)

    def clock_start(self) -> None:
        for op in self.child.ops:
            op.clock_start()
        for sp in self.inputs:
            sp.clear()
        self.result.clear()

    def state_rows(self) -> int:
        return (self.child.state_rows() + sum(len(s) for s in self.inputs) + len(self.result))


def _x_type(schema, streams):
    if schema is None:
        if not streams:
            raise TypeError("recursive: give schema= (the type of x) when there are no inputs")
        return streams[0].type
    if isinstance(schema, (ZSetType, IndexedType)):
        return schema
    return ZSetType(as_schema(schema))


def is_monotone(circuit: Graph) -> bool:
    """Whether every operator of a body is monotone (no operator that can turn an insertion
    into a retraction)."""
    return not any(n.name.startswith(NON_MONOTONE) for n in circuit.nodes)


def not_nestable(circuit: Graph) -> list[str]:
    """The operators of a body that have no nested incremental form (empty: the body runs as a
    nested incremental circuit)."""
    return sorted({n.name for n in circuit.nodes if not nestable(n, circuit.nodes)})


def recursive(circuit: Graph, fn: Callable, *streams, schema: Any = None,
              monotone: Optional[bool] = None, incremental: Optional[bool] = None,
              max_iterations: int = 100_000):
    """The stream of least fixed points ``x = fn(x, *streams)`` (see the module doc).

    ``fn(x, *inputs)`` receives streams of a nested circuit (``x`` first, of type ``schema``,
    default: the type of the first input) and returns a stream of the same type, built with the
    ordinary stream operators. Returns the stream of changes of the fixed point.

    ``incremental``: None (default) runs the body as a nested incremental circuit when every
    operator in it has a nested form, else falls back to seeded / recompute; True insists on
    the nested circuit (an error names the operators that prevent it); False always uses the
    fallback (``monotone`` then chooses between seeding and recomputing).
    """
    for s in streams:
        if s.circuit is not circuit:
            raise ValueError(f"recursive: stream {s} belongs to another circuit")
    child = ChildCircuit(circuit)
    x_type = _x_type(schema, streams)
    imports = []
    for i, s in enumerate(streams):
        t = s.type
        imports.append(child.add_node(f"import[{i}]", lambda ctx, t=t: ImportOperator(ctx, t), [],
                                      t, kind="input"))
    fb = feedback(child, x_type)
    y = fn(fb.stream, *imports)
    if getattr(y, "circuit", None) is not child:
        raise TypeError("recursive: fn must return a stream built from the streams it was given, "
                        f"got {y!r}")
    if y.type != x_type:
        raise TypeError(f"recursive: fn returned {y.type.describe()} but x is "
                        f"{x_type.describe()} ({y.type} vs {x_type}); pass schema= for x")
    if child.outputs:
        raise TypeError("recursive: the body cannot have outputs; output the result instead")
    fb.connect(sharded(y))
    mono = is_monotone(child) if monotone is None else bool(monotone)
    blocking = not_nestable(child)
    if incremental and blocking:
        raise TypeError(f"recursive(incremental=True): the body's operators {blocking} have no "
                        f"nested incremental form (supported: join, semijoin, antijoin, "
                        f"left_join, distinct, aggregate and the linear operators)")
    nested = not blocking if incremental is None else bool(incremental)
    if nested:
        for n in child.nodes:
            n.factory = nest(n, child.nodes)
    nodes = child.nodes
    import_ids = [s.node for s in imports]
    in_types = [s.type for s in streams]
    fb_id = fb.stream.node
    return circuit.add_node(
        "recursive",
        lambda ctx: RecursiveOperator(ctx, nodes, import_ids, in_types, fb_id, x_type, mono,
                                      max_iterations, nested),
        list(streams), x_type)


__all__ = ["recursive", "RecursiveOperator", "ChildCircuit", "is_monotone", "not_nestable"]

"""The scheduler (dbsp.circuit.scheduler): one worker's operators and the order of a step.

Its promises, tested on a graph of recording operators (no real operator involved, as the
circuit layer knows none): strict operators produce their output before anything else runs and
consume their input after everything ran; the others run once each, in construction order, on
their inputs' values of this step; an error names the operator and the worker, once; outputs are
handed over once; values are released at the end of a step.
"""
from __future__ import annotations

import pytest

from dbsp.circuit.graph import Graph
from dbsp.circuit.operator import Operator, WorkerContext
from dbsp.circuit.scheduler import Scheduler


class Rec(Operator):
    def __init__(self, ctx, log, name, fn=None):
        super().__init__(ctx)
        self.log, self.name, self.fn = log, name, fn

    def eval(self, *inputs):
        self.log.append((self.name, inputs))
        return self.fn(*inputs) if self.fn else self.name


class Delay(Operator):
    strict = True

    def __init__(self, ctx, log):
        super().__init__(ctx)
        self.log, self.state = log, 0

    def output(self):
        self.log.append(("z.output", self.state))
        return self.state

    def consume(self, value):
        self.log.append(("z.consume", value))
        self.state = value


class Source(Operator):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.pending = None

    def eval(self):
        v, self.pending = self.pending, None
        return v


class Sink(Operator):
    def __init__(self, ctx):
        super().__init__(ctx)
        self.last = None

    def eval(self, v):
        self.last = v
        return v


class Handle:
    def __init__(self, g, node, type_):
        self.circuit, self.node, self.type = g, node, type_


def _graph():
    return Graph(lambda g, node, t: Handle(g, node, t), name="t")


def test_strict_first_then_construction_order_then_consume():
    log: list = []
    g = _graph()
    src = g.add_node("src", lambda ctx: Source(ctx), [], None, kind="input")
    z = g.add_node("z", lambda ctx: Delay(ctx, log), [], None, strict=True)
    s = g.add_node("sum", lambda ctx: Rec(ctx, log, "sum", lambda a, b: (a or 0) + b), [src, z],
                   None)
    g.nodes[z.node].inputs = [s.node]  # the feedback edge, defined after its consumer
    g.add_node("out", lambda ctx: Sink(ctx), [s], None, kind="output")
    sch = Scheduler(g.nodes, WorkerContext())
    for x in (5, 7, 0):
        sch.feed({src.node: x})
        sch.step()
    assert [e for e in log if e[0] != "sum"] == [
        ("z.output", 0), ("z.consume", 5), ("z.output", 5), ("z.consume", 12),
        ("z.output", 12), ("z.consume", 12)]
    assert [e[1] for e in log if e[0] == "sum"] == [(5, 0), (7, 5), (0, 12)]


def test_outputs_are_handed_over_once_and_values_released():
    g = _graph()
    src = g.add_node("src", lambda ctx: Source(ctx), [], None, kind="input")
    out = g.add_node("out", lambda ctx: Sink(ctx), [src], None, kind="output")
    sch = Scheduler(g.nodes, WorkerContext())
    sch.feed({src.node: "rows"})
    sch.step()
    assert all(v is None for v in sch.values)  # this step's batches are not kept
    assert sch.take_outputs() == {out.node: "rows"}
    assert sch.take_outputs() == {out.node: None}


def test_an_error_names_the_operator_and_worker_once():
    def boom(_):
        raise ZeroDivisionError("bad row")

    g = _graph()
    src = g.add_node("src", lambda ctx: Source(ctx), [], None, kind="input")
    g.add_node("divide", lambda ctx: Rec(ctx, [], "divide", boom), [src], None)
    sch = Scheduler(g.nodes, WorkerContext(worker=3, workers=4))
    sch.feed({src.node: 1})
    with pytest.raises(ZeroDivisionError) as ei:
        sch.step()
    assert ei.value.__notes__ == ["in operator #1 'divide' on worker 3"]


def test_local_exchanges_are_marked_and_profile_counts_time():
    g = _graph()
    src = g.add_node("src", lambda ctx: Source(ctx), [], None, kind="input")
    ex = g.add_node("exchange", lambda ctx: Rec(ctx, [], "exchange", lambda v: v), [src], None)
    sch = Scheduler(g.nodes, WorkerContext(), local_exchanges=frozenset({ex.node}))
    assert sch.ops[ex.node].local is True
    sch.feed({src.node: 1})
    sch.step()
    prof = sch.profile()
    assert prof.shape == (2,) and (prof >= 0).all()
    assert sch.state_rows() == 0 and "profile" in Scheduler.CALLS


def test_a_running_graph_is_frozen_and_streams_stay_in_their_graph():
    g, h = _graph(), _graph()
    a = g.add_node("a", lambda ctx: Source(ctx), [], None)
    with pytest.raises(ValueError, match="another circuit"):
        h.add_node("b", lambda ctx: Sink(ctx), [a], None)

    class Running(Graph):
        running = True

    r = Running(lambda g, n, t: Handle(g, n, t), name="r")
    with pytest.raises(RuntimeError, match="running"):
        r.add_node("x", lambda ctx: Source(ctx), [], None)
    with pytest.raises(ValueError, match="workers"):
        Graph(lambda g, n, t: None, workers=0)


class Linear(Rec):
    """Declares that empty inputs give an empty value and change nothing."""

    passes_empty = True


def _idle_graph(fn):
    from dbsp.circuit.types import ZSetType
    log: list = []
    g = _graph()
    src = g.add_node("src", lambda ctx: Source(ctx), [], ZSetType(None), kind="input")
    lin = g.add_node("lin", lambda ctx: Linear(ctx, log, "lin", fn), [src], ZSetType(None))
    g.add_node("out", lambda ctx: Sink(ctx), [lin], ZSetType(None), kind="output")
    return g, src, lin, log


def test_an_operator_passing_empty_inputs_is_called_once_while_idle():
    g, src, lin, log = _idle_graph(lambda v: v[:1])
    sch = Scheduler(g.nodes, WorkerContext())
    for x in ([], [], [1, 2], [], []):
        sch.feed({src.node: x})
        sch.step()
        assert sch.take_outputs()[2] == x[:1]
    # called on the first empty step (its value cached), on the non-empty one, not again
    assert [e[1] for e in log] == [([],), ([1, 2],)]


def test_an_operator_passing_empty_inputs_must_return_an_empty_value():
    g, src, lin, log = _idle_graph(lambda v: ["made up"])
    sch = Scheduler(g.nodes, WorkerContext())
    sch.feed({src.node: []})
    with pytest.raises(RuntimeError, match="passes_empty"):
        sch.step()


class Doubler(Operator):
    """Fuses a ``Rec`` upstream operator: applies its function itself, then doubles."""

    def __init__(self, ctx, log):
        super().__init__(ctx)
        self.log, self.up = log, None

    def fuse_input(self, upstream):
        if isinstance(upstream, Rec):
            self.up = upstream
            return True
        return False

    def eval(self, v):
        self.log.append(("double", v))
        return 2 * (self.up.fn(v) if self.up is not None else v)


def _chain(log, extra_reader: bool):
    g = _graph()
    src = g.add_node("src", lambda ctx: Source(ctx), [], None, kind="input")
    inc = g.add_node("inc", lambda ctx: Rec(ctx, log, "inc", lambda v: v + 1), [src], None)
    dbl = g.add_node("double", lambda ctx: Doubler(ctx, log), [inc], None)
    g.add_node("out", lambda ctx: Sink(ctx), [dbl], None, kind="output")
    if extra_reader:
        g.add_node("out2", lambda ctx: Sink(ctx), [inc], None, kind="output")
    return g, src, dbl


def test_an_operator_absorbs_the_upstream_operator_feeding_only_it():
    log: list = []
    g, src, dbl = _chain(log, extra_reader=False)
    sch = Scheduler(g.nodes, WorkerContext())
    sch.feed({src.node: 5})
    sch.step()
    assert log == [("double", 5)]      # inc not evaluated: double got its input and applied it
    assert sch.take_outputs()[3] == 12


def test_an_upstream_operator_read_elsewhere_is_not_fused():
    log: list = []
    g, src, dbl = _chain(log, extra_reader=True)
    sch = Scheduler(g.nodes, WorkerContext())
    sch.feed({src.node: 5})
    sch.step()
    assert log == [("inc", (5,)), ("double", 6)]
    assert sch.take_outputs() == {3: 12, 4: 6}

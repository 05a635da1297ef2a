"""The scheduler (dbsp.circuit.scheduler): one worker's operators and the order of a step.

Its promises, tested on a graph of recording operators (no real operator involved, as the
circuit layer knows none): strict operators produce their output before anything else runs and
consume their input after everything ran; the others run once each, in construction order, on
their inputs' values of this step; an error names the operator and the worker, once; outputs are
handed over once; values are released at the end of a step. Every test runs on the native step
loop (:class:`dbsp._native.step.StepPlan`) and on its Python twin (``Scheduler._step_ref``), and
a hypothesis test holds both to a naive model on random graphs.
"""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from dbsp.circuit import scheduler as scheduler_mod
from dbsp.circuit.graph import Graph
from dbsp.circuit.operator import Operator, WorkerContext
from dbsp.circuit.scheduler import Scheduler
from dbsp.circuit.types import ZSetType


@pytest.fixture(autouse=True, params=["native", "ref"])
def loop(request, monkeypatch):
    """Every test on both step loops."""
    monkeypatch.setattr(Scheduler, "native", request.param == "native")
    return request.param


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


def test_the_plan_times_by_the_chosen_clock(monkeypatch):
    g, src, lin, log = _idle_graph(lambda v: [sum(range(20_000))] * len(v))
    for clock in ("wall", "thread"):
        monkeypatch.setattr(scheduler_mod, "CLOCK", clock)
        sch = Scheduler(g.nodes, WorkerContext())
        sch.feed({src.node: [1]})
        sch.step()
        assert sch.profile()[lin.node] > 0
    monkeypatch.setattr(scheduler_mod, "CLOCK", "sundial")
    sch = Scheduler(g.nodes, WorkerContext())
    if Scheduler.native:
        with pytest.raises(ValueError, match="clock"):
            sch.step()


def test_the_native_plan_refuses_a_bad_plan():
    from dbsp._native.step import StepPlan
    import numpy as np
    t = np.zeros(2)
    with pytest.raises(ValueError, match="not a node"):
        StepPlan([], [(0, print, (5,))], [None, None], ["a", "b"], t)
    with pytest.raises(ValueError, match="timing"):
        StepPlan([], [], [None, None], ["a", "b"], np.zeros(3))
    with pytest.raises(ValueError, match="names"):
        StepPlan([], [], [None, None], ["a"], t)
    plan = StepPlan([], [], [None, None], ["a", "b"], t)
    with pytest.raises(ValueError, match="values"):
        plan.run([None])


# -- random graphs against a naive model --------------------------------------------------

class Fn(Operator):
    """A pure operator on tuples: ``fn(*inputs)``; empty inputs give an empty tuple."""

    passes_empty = True

    def __init__(self, ctx, fn, calls):
        super().__init__(ctx)
        self.fn, self.calls = fn, calls

    def eval(self, *inputs):
        self.calls.append(inputs)
        return self.fn(*inputs)


class TupleDelay(Operator):
    strict = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.state = ()

    def output(self):
        return self.state

    def consume(self, value):
        self.state = value


def _mix(node, keep):
    def f(*inputs):
        rows = [(x * 3 + node) % 11 for v in inputs for x in v]
        return tuple(x for x in rows if x % keep)[:6]
    return f


@st.composite
def graphs(draw):
    """A random graph: inputs, pure operators of 1-3 earlier inputs (some declaring
    passes_empty), strict delays fed back from a later node, outputs; and its steps' inputs."""
    n_in = draw(st.integers(1, 2))
    spec = [("input", ())] * n_in
    n_delay = draw(st.integers(0, 2))
    spec += [("delay", ())] * n_delay
    for _ in range(draw(st.integers(1, 7))):
        k = draw(st.integers(1, 3))
        ins = tuple(draw(st.lists(st.integers(0, len(spec) - 1), min_size=k, max_size=k)))
        spec.append(("op", (ins, draw(st.booleans()), draw(st.integers(2, 5)))))
    feed = [draw(st.integers(n_in + n_delay, len(spec) - 1)) for _ in range(n_delay)]
    outs = draw(st.lists(st.integers(0, len(spec) - 1), min_size=1, max_size=3, unique=True))
    rows = st.lists(st.integers(0, 9), max_size=3).map(tuple)
    steps = draw(st.lists(st.lists(rows, min_size=n_in, max_size=n_in), min_size=1,
                          max_size=5))
    return spec, feed, outs, steps


def _build(spec, feed, outs, calls):
    g = _graph()
    T = ZSetType(None)
    hs = []
    for i, (kind, arg) in enumerate(spec):
        if kind == "input":
            hs.append(g.add_node(f"in{i}", lambda ctx: Source(ctx), [], T, kind="input"))
        elif kind == "delay":
            hs.append(g.add_node(f"z{i}", lambda ctx: TupleDelay(ctx), [], T, strict=True))
        else:
            ins, passes, keep = arg
            op_cls = Fn if passes else type("Always", (Fn,), {"passes_empty": False})
            hs.append(g.add_node(f"op{i}", lambda ctx, c=op_cls, f=_mix(i, keep):
                                 c(ctx, f, calls), [hs[j] for j in ins], T))
    delays = [i for i, (k, _) in enumerate(spec) if k == "delay"]
    for z, j in zip(delays, feed):
        g.nodes[z].inputs = [j]
    out_nodes = [g.add_node(f"out{j}", lambda ctx: Sink(ctx), [hs[j]], T, kind="output").node
                 for j in outs]
    return g, out_nodes


def _naive(spec, feed, outs, steps):
    """Every node's value recomputed each step in construction order, delays by hand."""
    delays = [i for i, (k, _) in enumerate(spec) if k == "delay"]
    state = {z: () for z in delays}
    got = []
    for inputs in steps:
        vals: list = []
        it = iter(inputs)
        for i, (kind, arg) in enumerate(spec):
            if kind == "input":
                vals.append(next(it))
            elif kind == "delay":
                vals.append(state[i])
            else:
                vals.append(_mix(i, arg[2])(*[vals[j] for j in arg[0]]))
        for z, j in zip(delays, feed):
            state[z] = vals[j]
        got.append([vals[j] for j in outs])
    return got


@settings(max_examples=150, deadline=None)
@given(g_spec=graphs())
def test_random_graphs_match_a_naive_model_on_both_loops(g_spec, loop):
    if loop == "ref":  # runs both loops itself
        return
    spec, feed, outs, steps = g_spec
    want = _naive(spec, feed, outs, steps)
    runs = {}
    for native in (True, False):
        Scheduler.native = native
        calls: list = []
        g, out_nodes = _build(spec, feed, outs, calls)
        sch = Scheduler(g.nodes, WorkerContext())
        got = []
        for inputs in steps:
            sch.feed({i: v for i, v in enumerate(inputs)})
            sch.step()
            assert all(v is None for v in sch.values)
            o = sch.take_outputs()
            got.append([o[n] for n in out_nodes])
        assert got == want
        runs[native] = calls
    assert runs[True] == runs[False]  # the same evaluations, idle skips included

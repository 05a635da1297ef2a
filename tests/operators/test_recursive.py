"""recursive: least fixed points (transitive closure with inserts and deletes, bag-semantics path
counts, reachability with an antijoin, mutual recursion) against naive reference fixed points
recomputed from scratch at every step, with 1 and 2 workers; the nested incremental circuit
(the default) and the seeded / recompute fallback."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.testing import reference as ref
from dbsp.testing.harness import check_steps

E = pa.schema([pa.field("src", pa.int64(), nullable=False),
               pa.field("dst", pa.int64(), nullable=False)])


def _extend(paths, edges):
    """paths ∘ edges: (a, b) and (b, c) give (a, c)."""
    return paths.index_by(["dst"]).join(
        edges.index_by(["src"]), lambda k, l, r: {"src": l["src"], "dst": r["dst"]}, E)


def closure(paths, edges):
    return edges.plus(_extend(paths, edges)).distinct()


def _ref_compose(x, e):
    return ref.map_rows(ref.join(x, e, [1], [0]), lambda r: (r[1], r[2]))


def _recursive_op(c):
    return next(op for op in c._replicas[0].ops if op.name == "recursive")


def test_transitive_closure_inserts_and_deletes(workers):
    steps = [
        {"e": {(1, 2): 1, (2, 3): 1}},
        {"e": {(3, 1): 1}},                  # a cycle: every pair of 1, 2, 3
        {"e": {(3, 4): 1, (4, 4): 1}},       # a self loop
        {"e": {(3, 1): -1}},                 # retraction: the cycle's paths must go
        {"e": {(1, 2): 1}},                  # a duplicate edge (weight 2): set semantics
        {"e": {(1, 2): -2, (2, 3): -1, (3, 4): -1, (4, 4): -1}},  # everything goes
    ]
    c = check_steps(workers, {"e": E}, lambda e: e.circuit.recursive(closure, e),
                    ref.transitive_closure, steps)
    assert c.steps == len(steps)


def test_nested_keeps_its_state_through_deletes():
    """The default: a nested incremental circuit; a deleted edge never resets the body."""
    with dbsp.Circuit() as c:
        e = c.add_input("e", E)
        tc = c.recursive(closure, e).output()
        e.insert([(i, i + 1) for i in range(6)] + [(10, 11), (11, 10)])
        c.step()
        op = _recursive_op(c)
        assert op.nested and op.recomputes == 0
        e.delete([(3, 4)])
        c.step()
        assert tc.to_dict() == {(a, b): -1 for a in range(4) for b in range(4, 7)}
        e.delete([(11, 10)])             # a two-node cycle loses its support
        c.step()
        assert tc.to_dict() == {(11, 10): -1, (10, 10): -1, (11, 11): -1}
        e.insert([(3, 4), (11, 10)])
        c.step()
        assert tc.view_dict() == ref.transitive_closure(
            {(i, i + 1): 1 for i in range(6)} | {(10, 11): 1, (11, 10): 1})
        assert op.recomputes == 0 and op.state_rows() > 0
        c.step()  # no input: nothing runs
        assert tc.to_dict() == {}


def test_incremental_true_needs_nestable_operators():
    """Top-k has no nested form: ``incremental=True`` is refused, the default falls back to
    seeded / recompute (and is still right)."""
    def body(x, e):
        top = x.index_by(["src"]).topk(1, ["dst"], descending=True)
        return e.plus(top).distinct()

    c = dbsp.Circuit()
    e = c.add_input("e", E)
    with pytest.raises(TypeError, match=r"incremental=True.*topk"):
        c.recursive(body, e, incremental=True)
    with dbsp.Circuit() as c:
        e = c.add_input("e", E)
        out = c.recursive(body, e).output()
        e.insert([(1, 2), (1, 3)])
        c.step()
        assert not _recursive_op(c).nested
        assert out.view_dict() == {(1, 2): 1, (1, 3): 1}


def test_seeded_for_inserts_recomputed_for_deletes():
    """The fallback (``incremental=False``): seeded for inserts, recomputed otherwise."""
    with dbsp.Circuit() as c:
        e = c.add_input("e", E)
        tc = c.recursive(closure, e, incremental=False).output()
        op = None
        e.insert([(i, i + 1) for i in range(6)])
        c.step()
        op = _recursive_op(c)
        assert op.recomputes == 0 and op.monotone and not op.nested
        e.insert([(6, 7)])
        c.step()
        assert op.recomputes == 0  # seeded from the previous fixed point
        assert tc.to_dict() == {(i, 7): 1 for i in range(7)}
        e.delete([(3, 4)])
        c.step()
        assert op.recomputes == 1
        assert tc.view_dict() == ref.transitive_closure(
            {(i, i + 1): 1 for i in range(7) if i != 3})
        c.step()  # no input: nothing runs
        assert tc.to_dict() == {} and op.recomputes == 1


def test_path_counts_bag_semantics_on_a_dag(workers):
    """Without distinct the fixed point counts paths (finite on a DAG), and is unique, so the
    seeded mode also handles retractions... which still recompute (set semantics is not known)."""
    def body(x, e):
        return e.plus(_extend(x, e))

    def reference(e):
        return ref.fixpoint(lambda x: ref.add(e, _ref_compose(x, e)))

    steps = [{"e": {(1, 2): 1, (2, 3): 1, (1, 3): 1}}, {"e": {(3, 4): 2}},
             {"e": {(2, 3): -1}}, {"e": {(0, 1): 1}}]
    check_steps(workers, {"e": E}, lambda e: e.circuit.recursive(body, e), reference, steps)


def test_non_monotone_body_always_recomputes(workers):
    """Nodes reachable from the start set without passing through a blocked node (antijoin in the
    body: not monotone in ``blocked``)."""
    N = pa.schema([pa.field("n", pa.int64(), nullable=False)])

    def body(x, start, edges, blocked):
        nxt = x.index_by(["n"]).join(edges.index_by(["src"]),
                                     lambda k, l, r: {"n": r["dst"]}, N)
        cand = start.plus(nxt).index_by(["n"])
        return cand.antijoin(blocked.index_by(["n"])).distinct()

    def reference(start, edges, blocked):
        bl = {r[0] for r, w in blocked.items() if w > 0}

        def f(x):
            nxt = ref.map_rows(ref.join(x, edges, [0], [0]), lambda r: (r[1],))
            return ref.distinct({r: w for r, w in ref.add(start, nxt).items() if r[0] not in bl})
        return ref.fixpoint(f)

    steps = [
        {"s": {(1,): 1}, "e": {(1, 2): 1, (2, 3): 1, (3, 4): 1}},
        {"b": {(3,): 1}},                     # an insertion that removes results
        {"e": {(2, 4): 1}},
        {"b": {(3,): -1, (4,): 1}},
    ]
    check_steps(workers, {"s": N, "e": E, "b": N},
                lambda s, e, b: s.circuit.recursive(body, s, e, b, schema=N), reference, steps)


def test_recursive_errors():
    c = dbsp.Circuit()
    e = c.add_input("e", E)
    with pytest.raises(TypeError, match="fn returned"):
        c.recursive(lambda x, e: e.map(lambda b: {"src": b["src"]}), e)
    with pytest.raises(TypeError, match="built from the streams"):
        c.recursive(lambda x, e_: e, e)
    with pytest.raises(TypeError, match="no inputs of its own"):
        c.recursive(lambda x, e_: x.circuit.add_input("z", E), e)
    with pytest.raises(TypeError, match="cannot have outputs"):
        c.recursive(lambda x, e_: (x.output(), x)[1], e)


def test_runaway_recursion_is_stopped():
    with dbsp.Circuit() as c:
        e = c.add_input("e", E)
        c.recursive(lambda x, e: e.plus(_extend(x, e)), e, max_iterations=50).output()
        e.insert([(1, 1)])  # a cycle without distinct: counts grow for ever
        with pytest.raises(RuntimeError, match="no fixed point after 50"):
            c.step()


@st.composite
def graph_steps(draw):
    nodes = st.integers(0, 5)
    edge = st.tuples(nodes, nodes)
    state: dict = {}
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        d: dict = {}
        for r in draw(st.lists(edge, max_size=4)):
            d[r] = d.get(r, 0) + 1
        present = sorted(r for r, w in state.items() if w > 0)
        if present:
            for r in draw(st.lists(st.sampled_from(present), max_size=3, unique=True)):
                d[r] = d.get(r, 0) - 1
        d = {r: w for r, w in d.items() if w}
        for r, w in d.items():
            state[r] = state.get(r, 0) + w
        steps.append({"e": d})
    return steps


@settings(max_examples=50)
@given(steps=graph_steps())
@example(steps=[{"e": {(0, 1): 1, (1, 0): 1}}, {"e": {(1, 0): -1}}])
def test_transitive_closure_random(workers, steps):
    check_steps(workers, {"e": E}, lambda e: e.circuit.recursive(closure, e),
                ref.transitive_closure, steps)


def test_closure_example_matches_naive_closure_on_a_bigger_graph():
    import random
    rnd = random.Random(7)
    with dbsp.Circuit(workers=2) as c:
        e = c.add_input("e", E)
        tc = c.recursive(closure, e).output()
        edges: dict = {}
        for step in range(6):
            new = {(rnd.randrange(30), rnd.randrange(30)) for _ in range(15)} - set(edges)
            gone = rnd.sample(sorted(edges), min(len(edges), 4)) if step % 2 else []
            for r in new:
                edges[r] = 1
            for r in gone:
                del edges[r]
            if new:
                e.insert(sorted(new))
            if gone:
                e.delete(gone)
            c.step()
            assert tc.view_dict() == ref.transitive_closure(edges)


def test_nested_recursion(workers):
    """A recursion inside a recursion's body: the outer fixed point of distinct(TC(edges ∪ x))
    is the transitive closure (the inner circuit is rebuilt at every outer inner-step)."""
    def outer(x, e):
        return x.circuit.recursive(closure, e.plus(x).distinct())

    steps = [{"e": {(1, 2): 1, (2, 3): 1}}, {"e": {(3, 1): 1}}, {"e": {(2, 3): -1}}]
    check_steps(workers, {"e": E}, lambda e: e.circuit.recursive(outer, e),
                ref.transitive_closure, steps)


# -- random graphs: reachability with an antijoin (stratified negation), mutual recursion -------

N = pa.schema([pa.field("n", pa.int64(), nullable=False)])
P = pa.schema([pa.field("src", pa.int64(), nullable=False),
               pa.field("dst", pa.int64(), nullable=False),
               pa.field("odd", pa.bool_(), nullable=False)])


def reach_body(x, roots, edges, blocked):
    """Nodes reachable from a root through nodes that are not blocked."""
    nxt = x.index_by(["n"]).join(edges.index_by(["src"]), lambda k, l, r: {"n": r["dst"]}, N)
    return roots.plus(nxt).index_by(["n"]).antijoin(blocked.index_by(["n"])).distinct()


def reach_reference(roots, edges, blocked):
    bl = {r[0] for r, w in blocked.items() if w > 0}

    def f(x):
        nxt = ref.map_rows(ref.join(x, edges, [0], [0]), lambda r: (r[1],))
        return ref.distinct({r: w for r, w in ref.add(roots, nxt).items() if r[0] not in bl})
    return ref.fixpoint(f)


def parity_body(x, edges):
    """Mutual recursion in one relation: ``odd(a, c) <- edge(a, c) | even(a, b), edge(b, c)``
    and ``even(a, c) <- odd(a, b), edge(b, c)``, the flag ``odd`` telling them apart."""
    step = x.index_by(["dst"]).join(
        edges.index_by(["src"]),
        lambda k, l, r: {"src": l["src"], "dst": r["dst"], "odd": pc.invert(l["odd"])}, P)
    base = edges.map(lambda b: {"src": b["src"], "dst": b["dst"],
                                "odd": pa.array([True] * b.num_rows, pa.bool_())}, P)
    return base.plus(step).distinct()


def parity_reference(edges):
    e = {r for r, w in edges.items() if w > 0}

    def f(x):
        out = {(a, b, True): 1 for a, b in e}
        for (a, b, odd) in x:
            for (s, d) in e:
                if s == b:
                    out[(a, d, not odd)] = 1
        return out
    return ref.fixpoint(f)


@st.composite
def _deltas(draw, row, n_steps):
    state: dict = {}
    steps = []
    for _ in range(n_steps):
        d: dict = {}
        for r in draw(st.lists(row, max_size=4)):
            d[r] = d.get(r, 0) + 1
        present = sorted(r for r, w in state.items() if w > 0)
        if present:
            for r in draw(st.lists(st.sampled_from(present), max_size=3, unique=True)):
                d[r] = d.get(r, 0) - 1
        d = {r: w for r, w in d.items() if w}
        for r, w in d.items():
            state[r] = state.get(r, 0) + w
        steps.append(d)
    return steps


@st.composite
def reach_steps(draw):
    nodes = st.integers(0, 6)
    n = draw(st.integers(1, 5))
    es = draw(_deltas(st.tuples(nodes, nodes), n))
    rs = draw(_deltas(st.tuples(st.integers(0, 2)), n))
    bs = draw(_deltas(st.tuples(nodes), n))
    return [{"r": r, "e": e, "b": b} for r, e, b in zip(rs, es, bs)]


@settings(max_examples=40)
@given(steps=reach_steps())
@example(steps=[{"r": {(0,): 1}, "e": {(0, 1): 1, (1, 2): 1, (2, 1): 1}, "b": {}},
                {"r": {}, "e": {}, "b": {(1,): 1}},
                {"r": {}, "e": {(0, 2): 1}, "b": {(1,): -1}}])
def test_reachability_with_blocked_nodes_random(workers, steps):
    c = check_steps(workers, {"r": N, "e": E, "b": N},
                    lambda r, e, b: r.circuit.recursive(reach_body, r, e, b, schema=N,
                                                        incremental=True),
                    reach_reference, steps)
    assert c.steps == len(steps)


@settings(max_examples=30)
@given(steps=graph_steps())
@example(steps=[{"e": {(0, 1): 1, (1, 0): 1}}, {"e": {(0, 0): 1}}, {"e": {(1, 0): -1}}])
def test_mutual_recursion_parity_random(workers, steps):
    check_steps(workers, {"e": E},
                lambda e: e.circuit.recursive(parity_body, e, schema=P, incremental=True),
                parity_reference, steps)


@settings(max_examples=30)
@given(steps=graph_steps())
def test_path_counts_random_dags(workers, steps):
    """Bag semantics (no distinct: each path counted) on DAGs, nested: joins and plus only."""
    steps = [{"e": {(a, b): w for (a, b), w in s["e"].items() if a < b}} for s in steps]

    def body(x, e):
        return e.plus(_extend(x, e))

    def reference(e):
        return ref.fixpoint(lambda x: ref.add(e, _ref_compose(x, e)))

    check_steps(workers, {"e": E},
                lambda e: e.circuit.recursive(body, e, incremental=True), reference, steps)


def test_closure_nested_matches_recompute_on_a_bigger_graph():
    """A 300-edge graph with cycles, 20 steps of 10 deletes or inserts: the nested circuit equals
    the recomputing fallback and the naive closure at every step."""
    import random
    rnd = random.Random(11)
    with dbsp.Circuit(workers=2) as c:
        e = c.add_input("e", E)
        nested = c.recursive(closure, e, incremental=True).output()
        full = c.recursive(closure, e, incremental=False, monotone=False).output()
        edges = {(rnd.randrange(120), rnd.randrange(120)) for _ in range(300)}
        e.insert(sorted(edges))
        c.step()
        for step in range(20):
            if step % 2:
                gone = rnd.sample(sorted(edges), 10)
                edges -= set(gone)
                e.delete(gone)
            else:
                new = set()
                while len(new) < 10:
                    r = (rnd.randrange(120), rnd.randrange(120))
                    if r not in edges:
                        new.add(r)
                edges |= new
                e.insert(sorted(new))
            c.step()
            want = ref.transitive_closure({r: 1 for r in edges})
            assert nested.to_dict() == full.to_dict()
            assert nested.view_dict() == want


def _closure_steps():
    return [
        {"e": {(1, 2): 1, (2, 3): 1, (3, 1): 1, (3, 4): 1}},
        {"e": {(3, 1): -1, (4, 5): 1}},
        {"e": {(5, 3): 1, (2, 3): -1}},
        {"e": {(1, 3): 1, (3, 4): -1}},
        {"e": {(4, 5): -1, (5, 3): -1, (1, 2): -1}},
    ]


def test_nested_state_in_layer_files(tmp_path):
    """The timed traces are spines: with a tiny memory budget they live in layer files."""
    from dbsp.storage.config import StorageConfig
    cfg = StorageConfig(str(tmp_path), memory_budget_bytes=16 << 10, block_size=4096,
                        min_file_rows=3, min_spill_bytes=0, merge_chunk_rows=2,
                        cache_bytes=1 << 20, min_free_bytes=0)
    check_steps(1, {"e": E}, lambda e: e.circuit.recursive(closure, e, incremental=True),
                ref.transitive_closure, _closure_steps(), storage=cfg)


def test_nested_state_checkpoint_and_restore(tmp_path):
    """A checkpoint taken between outer steps holds the timed traces: a restored circuit
    continues with deletes exactly like one that never stopped."""
    from dbsp.checkpoint import CheckpointStore
    steps = _closure_steps()

    def build(d):
        c = dbsp.Circuit(storage=d)
        e = c.add_input("e", E)
        return c, e, c.recursive(closure, e, incremental=True).output()

    def push(e, delta):
        ins = [r for r, w in delta.items() if w > 0]
        dels = [r for r, w in delta.items() if w < 0]
        if ins:
            e.insert(ins)
        if dels:
            e.delete(dels)

    d = str(tmp_path)
    c, e, out = build(d)
    store = CheckpointStore(d, c.fingerprint())
    edges: dict = {}
    for t, s in enumerate(steps):
        if t == 2:
            store.checkpoint(c, c.steps)
            c.close()
            c, e, out = build(d)
            store = CheckpointStore(d, c.fingerprint())
            assert store.restore(c).step == 2
            assert _recursive_op(c).state_rows() > 0
        push(e, s["e"])
        c.step()
        prev = ref.transitive_closure(edges)
        edges = ref.add(edges, s["e"])
        assert out.to_dict() == ref.sub(ref.transitive_closure(edges), prev), f"step {t}"
    c.close()


# -- an aggregate in the body: shortest distances from the roots (min over paths) --------------

W3 = pa.schema([pa.field("src", pa.int64(), nullable=False),
                pa.field("dst", pa.int64(), nullable=False),
                pa.field("w", pa.int64(), nullable=False)])
D = pa.schema([pa.field("n", pa.int64(), nullable=False), pa.field("d", pa.int64(), nullable=False)])


def distances_body(x, roots, edges):
    """``x(n, d)`` = the least distance of ``n`` from a root with at most ``i`` hops at
    iteration ``i`` (Bellman-Ford): ``min`` over the roots (distance 0) and ``x ⋈ edges``."""
    start = roots.map(lambda b: {"n": b["n"], "d": pa.array([0] * b.num_rows, pa.int64())}, D)
    step = x.index_by(["n"]).join(edges.index_by(["src"]),
                                  lambda k, l, r: {"n": r["dst"], "d": pc.add(l["d"], r["w"])}, D)
    best = start.plus(step).index_by(["n"]).aggregate({"d": ("min", "d")})
    return best.map(lambda b: {"n": b["n"], "d": pc.fill_null(b["d"], 0)}, D)


def distances_reference(roots, edges):
    rs = {r[0] for r, w in roots.items() if w > 0}
    es = [r for r, w in edges.items() for _ in range(w) if w > 0]

    def f(x):
        best: dict = {n: 0 for n in rs}
        for (n, d), w in x.items():
            for (s, t, c) in es:
                if s == n:
                    best[t] = min(best.get(t, d + c), d + c)
        return {(n, d): 1 for n, d in best.items()}
    return ref.fixpoint(f)


@st.composite
def distance_steps(draw):
    n = draw(st.integers(1, 5))
    es = draw(_deltas(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(1, 3)), n))
    rs = draw(_deltas(st.tuples(st.integers(0, 1)), n))
    return [{"r": r, "e": e} for r, e in zip(rs, es)]


@settings(max_examples=30)
@given(steps=distance_steps())
@example(steps=[{"r": {(0,): 1}, "e": {(0, 1, 1): 1, (1, 2, 1): 1, (0, 2, 3): 1, (2, 0, 1): 1}},
                {"r": {}, "e": {(1, 2, 1): -1}},
                {"r": {(0,): -1, (1,): 1}, "e": {(0, 1, 1): -1}}])
def test_shortest_distances_with_an_aggregate_random(workers, steps):
    check_steps(workers, {"r": N, "e": W3},
                lambda r, e: r.circuit.recursive(distances_body, r, e, schema=D,
                                                 incremental=True),
                distances_reference, steps)


def closure_squared(paths, edges):
    """Non-linear recursion: ``paths ∪ paths∘paths`` (both sides of the join change at every
    inner iteration, so every product of the nested join is exercised)."""
    sq = paths.index_by(["dst"]).join(
        paths.index_by(["src"]), lambda k, l, r: {"src": l["src"], "dst": r["dst"]}, E)
    return edges.plus(sq).distinct()


@settings(max_examples=40)
@given(steps=graph_steps())
@example(steps=[{"e": {(0, 1): 1, (1, 2): 1, (2, 3): 1, (3, 4): 1}}, {"e": {(2, 3): -1}},
                {"e": {(2, 3): 1, (4, 0): 1}}, {"e": {(1, 2): -1}}])
def test_closure_by_squaring_random(workers, steps):
    check_steps(workers, {"e": E},
                lambda e: e.circuit.recursive(closure_squared, e, incremental=True),
                ref.transitive_closure, steps)

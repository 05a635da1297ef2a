# Compare: pytest bench/operators/bench_recursive.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Transitive closure with retractions: a step that deletes or inserts 10 edges of a 100K-edge
graph, the nested incremental circuit (:mod:`dbsp.operators.nested`) beside a full
recomputation of the fixed point (``recursive(..., incremental=False, monotone=False)``: the
body reset and iterated from the integrated edges, what every retraction cost before).

The graphs: 100,000 random edges between consecutive layers of a layered DAG, the shape of a
bill of materials or a build dependency graph, where paths are short and a node reaches a
bounded set, so the closure fits memory. Two shapes: ``shallow`` (4 layers of 8,000 nodes,
out-degree ~4, depth 3, ~0.9M closure pairs: many derivations per path, the join does most of
the work) and ``deep`` (10 layers of 10,000 nodes, out-degree ~1.1, depth 9, ~0.7M pairs: few
derivations, 10 inner iterations per step, where the fixed cost of an inner iteration shows).
(A uniform random graph of this size has a giant strongly connected component whose closure is
~10^10 pairs: it fits no memory, whatever the engine.)

Timed: the nested circuit's ``step()`` (pytest-benchmark); the recomputing circuit gets the
same delta and is timed in the same round (interleaved; ``extra_info``: ``recompute_s``
median and ``speedup`` = recompute median / nested median). Every step's change of the closure
must be equal in both circuits, and at the end the closure from 50 sampled sources is checked
against a breadth-first search in Python.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import pyarrow as pa
import pytest

import dbsp

E = pa.schema([pa.field("src", pa.int64(), False), pa.field("dst", pa.int64(), False)])
N_EDGES, CHANGE, ROUNDS = 100_000, 10, 8
SHAPES = {"shallow": (4, 8_000), "deep": (10, 10_000)}


def closure(paths, edges):
    step = paths.index_by(["dst"]).join(
        edges.index_by(["src"]), lambda k, l, r: {"src": l["src"], "dst": r["dst"]}, E)
    return edges.plus(step).distinct()


def _edge(rng, layers: int, width: int) -> tuple:
    g = int(rng.integers(0, layers - 1))
    return (g * width + int(rng.integers(0, width)),
            (g + 1) * width + int(rng.integers(0, width)))


def layered_graph(layers: int, width: int, seed: int = 1) -> np.ndarray:
    """``N_EDGES`` distinct random edges, each from a node of layer ``g`` to one of ``g+1``."""
    rng = np.random.default_rng(seed)
    gap = rng.integers(0, layers - 1, N_EDGES * 2)
    src = gap * width + rng.integers(0, width, len(gap))
    dst = (gap + 1) * width + rng.integers(0, width, len(gap))
    pairs = np.unique(np.stack([src, dst], 1), axis=0)
    return pairs[rng.permutation(len(pairs))[:N_EDGES]]


def changes(pairs: np.ndarray, rounds: int, layers: int, width: int, seed: int = 5) -> list:
    """Alternately delete and insert ``CHANGE`` edges: ``[(inserted, deleted), ...]``."""
    rng = np.random.default_rng(seed)
    present = {tuple(p) for p in pairs.tolist()}
    out = []
    for r in range(rounds):
        if r % 2 == 0:
            gone = sorted(present)
            gone = [gone[i] for i in rng.choice(len(gone), CHANGE, replace=False)]
            present -= set(gone)
            out.append(([], gone))
        else:
            new: set = set()
            while len(new) < CHANGE:
                x = _edge(rng, layers, width)
                if x not in present:
                    new.add(x)
            present |= new
            out.append((sorted(new), []))
    return out


def successors(edges: set) -> dict:
    succ = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    return succ


def reachable(succ: dict, src: int) -> set:
    seen: set = set()
    todo = list(succ[src])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(succ[n])
    return seen


@pytest.mark.parametrize("shape", list(SHAPES))
def test_closure_step(benchmark, shape):
    layers, width = SHAPES[shape]
    pairs = layered_graph(layers, width)
    batch = pa.record_batch([pa.array(pairs[:, 0]), pa.array(pairs[:, 1])], schema=E)
    with dbsp.Circuit() as c, dbsp.Circuit() as r:
        e, f = c.add_input("e", E), r.add_input("e", E)
        nested = c.recursive(closure, e, incremental=True).output()
        full = r.recursive(closure, f, incremental=False, monotone=False).output(view=False)
        e.push(batch)
        f.push(batch)
        c.step()
        r.step()
        edges = {tuple(p) for p in pairs.tolist()}
        it = iter(changes(pairs, ROUNDS + 1, layers, width))
        recompute: list = []
        pending: list = []

        def push():
            if pending:  # the previous round's answers: equal changes in both circuits
                assert nested.to_dict() == pending.pop()
            ins, dels = next(it)
            for inp in (e, f):
                if ins:
                    inp.insert(ins)
                if dels:
                    inp.delete(dels)
            edges.difference_update(dels)
            edges.update(ins)
            t0 = time.perf_counter()
            r.step()  # the full recomputation, interleaved with the nested step
            recompute.append(time.perf_counter() - t0)
            pending.append(full.to_dict())
            return (), {}

        benchmark.group = "recursive-closure-step"
        benchmark.pedantic(c.step, setup=push, rounds=ROUNDS, iterations=1, warmup_rounds=1)
        assert nested.to_dict() == pending.pop()
        view = nested.view_dict()
        rng = np.random.default_rng(9)
        succ = successors(edges)
        for s in rng.choice(layers * width, 50, replace=False).tolist():
            want = reachable(succ, s)
            assert {b for (a, b) in view if a == s} == want, f"closure from {s}"
        med = float(np.median(recompute[1:]))
        benchmark.extra_info.update(
            shape=shape, layers=layers, width=width, closure_rows=len(view), recompute_s=med,
            speedup=med / benchmark.stats.stats.median)

"""The circuit and its runtime: stepping order, cycles through z^-1, W workers in lockstep,
failure handling (an error in one worker fails the step on every worker without hanging)."""
from __future__ import annotations

import threading
import time

import greenlet
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import dbsp
from dbsp.circuit.types import ZSetType
from dbsp.operators.delay import feedback

SCHEMA = pa.schema([pa.field("x", pa.int64(), nullable=False)])


def test_input_split_across_workers_and_gathered(workers):
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", SCHEMA)
        out = t.output()
        t.insert([(i,) for i in range(101)])
        c.step()
        assert out.to_dict() == {(i,): 1 for i in range(101)}
        c.step()  # no input: empty delta, same view
        assert out.to_dict() == {}
        assert out.view_dict() == {(i,): 1 for i in range(101)}


def test_each_worker_gets_a_slice(workers):
    seen: list[int] = []
    lock = threading.Lock()

    def record(b: pa.RecordBatch):
        with lock:
            seen.append(b.num_rows)
        return b

    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", SCHEMA)
        t.map(record, SCHEMA).output()
        t.insert([(i,) for i in range(10)])
        c.step()
    assert sorted(seen) == ([10] if workers == 1 else [5, 5])


def test_feedback_counter_cycle():
    """x[t] = input[t] + z^-1(x)[t]: a running sum built from a cycle through a delay."""
    with dbsp.Circuit() as c:
        t = c.add_input("t", SCHEMA)
        fb = feedback(c, ZSetType(SCHEMA))
        x = t.plus(fb.stream)
        fb.connect(x)
        out = x.output(view=False)
        for step in range(1, 4):
            t.insert([(7,)])
            c.step()
            assert out.to_dict() == {(7,): step}


def test_delay_shifts_by_one_step():
    with dbsp.Circuit() as c:
        t = c.add_input("t", SCHEMA)
        d = t.delay().output(view=False)
        t.insert([(1,)])
        c.step()
        assert d.to_dict() == {}
        t.insert([(2,)])
        c.step()
        assert d.to_dict() == {(1,): 1}
        c.step()
        assert d.to_dict() == {(2,): 1}


def test_integrate_differentiate_roundtrip(workers):
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", SCHEMA)
        i = t.integrate().output(view=False)
        di = t.integrate().differentiate().output(view=False)
        t.insert([(1,), (2,)])
        c.step()
        t.delete([(1,)])
        c.step()
        assert i.to_dict() == {(2,): 1}
        assert di.to_dict() == {(1,): -1}


def test_error_in_one_worker_fails_the_step_without_hanging_then_recovers():
    def boom(b: pa.RecordBatch):
        if b.num_rows and pc.max(b["x"]).as_py() >= 100:
            raise ValueError("bad value in user function")
        return b

    with dbsp.Circuit(workers=2) as c:
        t = c.add_input("t", SCHEMA)
        m = t.map(boom, SCHEMA)
        out = m.index_by(["x"]).shard().flatten().output()  # an exchange after the failing op
        t.insert([(1,), (200,)])  # worker 0 gets 1, worker 1 gets 200
        with pytest.raises(ValueError, match="bad value") as ei:
            c.step()
        assert any("map" in n for n in getattr(ei.value, "__notes__", []))
        assert ei.value.row == {"x": 200} and ei.value.operator == "map"
        t.insert([(1,), (2,)])  # the step was rolled back: the circuit goes on
        c.step()
        assert out.view_dict() == {(1,): 1, (2,): 1}


def test_adding_operators_after_start_is_refused():
    with dbsp.Circuit() as c:
        t = c.add_input("t", SCHEMA)
        c.step()
        with pytest.raises(RuntimeError, match="running"):
            t.neg()


def test_shard_puts_each_key_on_one_worker():
    per_worker: dict[int, set] = {}
    lock = threading.Lock()

    with dbsp.Circuit(workers=2) as c:
        t = c.add_input("t", SCHEMA)
        s = t.index_by(["x"]).shard()
        out = s.flatten().output()

        # observe which worker holds which key after the exchange
        def spy(b: pa.RecordBatch):
            with lock:
                # (a small step runs every worker in this thread, each a greenlet)
                per_worker.setdefault((threading.get_ident(), id(greenlet.getcurrent())),
                                      set()).update(b["x"].to_pylist())
            return b

        s.flatten().map(spy, SCHEMA).output(view=False)
        t.insert([(i % 50,) for i in range(1000)])
        c.step()
        assert out.to_dict() == {(i,): 20 for i in range(50)}
    sets = list(per_worker.values())
    assert len(sets) == 2 and not (sets[0] & sets[1])
    assert sets[0] | sets[1] == set(range(50))


def test_weights_preserved_through_workers(workers):
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", SCHEMA)
        out = t.output()
        t.push(pa.table({"x": [1, 2, 3]}), weights=np.array([5, -2, 0]))
        c.step()
        assert out.to_dict() == {(1,): 5, (2,): -2}


def test_a_small_steps_exchange_is_not_timed_with_the_other_workers_turn():
    """A small step runs both workers in one thread, taking turns at the exchange: worker 0
    waits there while worker 1 runs its operators before it. That wait is not the exchange's
    time (the profile would blame the exchange for the work upstream of it)."""
    def slow(b: pa.RecordBatch):
        time.sleep(0.05)
        return b

    with dbsp.Circuit(workers=2, runtime="threads") as c:
        t = c.add_input("t", SCHEMA)
        t.map(slow, SCHEMA).index_by(["x"]).shard().flatten().output(view=False)
        t.insert([(i,) for i in range(100)])
        c.step()
        prof = {r["name"]: r["seconds"] for r in c.profile()}
    shard = [v for k, v in prof.items() if k.startswith("exchange") or k.startswith("shard")]
    mapped = [v for k, v in prof.items() if k.startswith("map")]
    assert mapped and sum(mapped) >= 0.09, prof  # both workers' sleeps
    assert shard and max(shard) < 0.025, prof  # (not the 0.05 s of the other turn)

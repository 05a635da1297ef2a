"""Every operator that builds state declares it (Stateful.state_attrs), so checkpoints save it:
a guard against an operator added (or given a new trace) without it."""
from __future__ import annotations

import importlib
import inspect
import pkgutil

import dbsp.operators
from dbsp.circuit.operator import Stateful

STATE_MAKERS = ("Spine(", "VersionedRows(", "_ValueCounts(", "Scheduler(", "self.step = 0")


def _classes():
    for m in pkgutil.iter_modules(dbsp.operators.__path__):
        mod = importlib.import_module(f"dbsp.operators.{m.name}")
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, Stateful) and cls.__module__ == mod.__name__:
                yield cls


def test_operators_that_build_state_declare_it():
    missing = []
    for cls in _classes():
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        src = inspect.getsource(init)
        if any(m in src for m in STATE_MAKERS) and not cls.state_attrs:
            missing.append(cls.__qualname__)
    assert not missing, f"operators with state but no state_attrs: {missing}"


def test_declared_attributes_exist():
    import pyarrow as pa

    from dbsp.operators.aggregate import VersionedRows
    vr = VersionedRows("t", pa.schema([("x", pa.int64())]))
    assert set(vr.checkpoint_state()) == {"trace", "_next"}

"""Fault tolerance for a circuit built one level down (:class:`dbsp.Circuit`): the same as
``StreamContext(storage=..., checkpoint_every=...)``.

>>> import tempfile, pyarrow as pa, dbsp
>>> d = tempfile.mkdtemp()
>>> c = dbsp.Circuit(storage=d)
>>> t = c.add_input("t", pa.schema([("x", pa.int64())]))
>>> out = t.integrate().output(name="total")
>>> run = dbsp.durable(c, checkpoint_every=2)   # resumes if d holds checkpoints
>>> _ = t.insert([(1,), (2,)]); _ = run.step()
>>> run.checkpoint().step
1
>>> run.report()["last_checkpoint"]["step"]
1
>>> run.close()
"""
from __future__ import annotations

import os
from typing import Any, Optional

from ..checkpoint import CheckpointStore
from ..ft import DurableCircuit

__all__ = ["durable"]


def durable(circuit: Any, *, checkpoint_every: Optional[int] = None,
            checkpoint_seconds: Optional[float] = None, keep_checkpoints: int = 2,
            check_output: bool = False) -> DurableCircuit:
    """Make ``circuit`` (with ``storage=``) exactly-once: a :class:`~dbsp.ft.DurableCircuit`
    over a :class:`~dbsp.checkpoint.CheckpointStore` in the circuit's storage directory, its
    logs in ``<storage>/ft``. Build the whole graph first; the first ``step`` (or ``open``)
    resumes from the latest checkpoint and replays the logged input after it."""
    if circuit.storage is None:
        raise ValueError(f"circuit '{circuit.name}' has no storage: build it with "
                         f"Circuit(storage=<directory or StorageConfig>)")
    root = circuit.storage.dir
    return DurableCircuit(
        circuit, lambda c: CheckpointStore(root, c.fingerprint(), keep=keep_checkpoints),
        os.path.join(root, "ft"), checkpoint_every=checkpoint_every,
        checkpoint_seconds=checkpoint_seconds, check_output=check_output)

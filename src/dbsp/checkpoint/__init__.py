"""Checkpoints: the storage directory's catalog, and saving / restoring a circuit's state.

This layer sits above the runtime (it drives a :class:`~dbsp.runtime.circuit.Circuit` between
steps) and below the API. :mod:`.state` turns one worker's operator state into a state file
(spines as lists of immutable batch files, the rest pickled); :mod:`.store` is the catalog and the
commit / gc / resume protocol of seed 002. Operators only expose their state
(:class:`dbsp.circuit.operator.Stateful`); they do not know this layer.
"""
from .state import CheckpointCorrupt, CheckpointError
from .store import (CheckpointInfo, CheckpointStore, CheckpointVersionError, CircuitMismatch,
                    PendingCheckpoint)

__all__ = ["CheckpointStore", "CheckpointInfo", "PendingCheckpoint", "CheckpointError",
           "CheckpointCorrupt", "CircuitMismatch", "CheckpointVersionError"]

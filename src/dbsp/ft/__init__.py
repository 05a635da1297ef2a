"""Fault tolerance: the durable input log, the output log and exactly-once stepping.

This layer sits above the runtime, beside :mod:`dbsp.checkpoint` (which it uses only through the
small :class:`~dbsp.ft.durable.StateStore` protocol). :mod:`.logs` holds the input log (the
division of input into steps, durable before any output of a step) and the output log (000's
``write(step, output)`` rules); :mod:`.durable` the loop that ties them to a circuit and a
checkpoint store: recovery = open the last checkpoint + replay the logged input after it;
:mod:`.coordinator` the Run / Pause / Stop state machine and the restart of a dead worker.
"""
from .coordinator import CancelToken, Coordinator, State
from .durable import DurableCircuit, RecoveryError, StateStore
from .logs import InputLog, LogCorrupt, OutputGap, OutputLog, OutputMismatch, Rereadable, Slices, \
    Span, content_crc, read_outputs

__all__ = ["Coordinator", "State", "CancelToken", "DurableCircuit", "StateStore", "RecoveryError", "InputLog", "OutputLog",
           "LogCorrupt", "OutputGap", "OutputMismatch", "read_outputs", "Rereadable", "Span",
           "Slices", "content_crc"]

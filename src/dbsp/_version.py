"""The package's version, and the versions of the formats two processes of one job must agree
on, in a module of its own so that every layer can name them (a worker reports them when it
registers, checkpoints record them).

The package version says which code runs; it may differ between the members of a generation
(a rolling upgrade runs old and new side by side). What must match is the formats they exchange,
each numbered on its own, as ``(version written, oldest version read)``:

* ``wire``: the protocol between driver and workers and between workers over the mesh (the
  request / reply messages of :mod:`dbsp.runtime.process`, the exchange's frames);
* ``checkpoint``: the checkpoint catalog and state files (:mod:`dbsp.checkpoint`);
* ``layer``: the layer files state is spilled to and checkpointed in (:mod:`dbsp.storage`,
  whose ``FORMAT_VERSION`` / ``MIN_READ_VERSION`` these are).

Two processes interoperate when, for every format, each one reads the version the other writes
(:func:`incompatibility`). Raise a format's written version when its bytes change; raise its
oldest-read version only when the code can no longer read the older bytes.
"""

from typing import Optional

__version__ = "0.1.0"

WIRE_PROTOCOL, WIRE_PROTOCOL_MIN = 1, 1
CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_MIN = 1, 1
LAYER_FORMAT, LAYER_FORMAT_MIN = 1, 1

#: what a process that reports no formats speaks (packages from before they were reported)
LEGACY_FORMATS = {"wire": [1, 1], "checkpoint": [1, 1], "layer": [1, 1]}


def formats() -> dict:
    """``{format: [version written, oldest version read]}`` of this package."""
    return {"wire": [WIRE_PROTOCOL, WIRE_PROTOCOL_MIN],
            "checkpoint": [CHECKPOINT_FORMAT, CHECKPOINT_FORMAT_MIN],
            "layer": [LAYER_FORMAT, LAYER_FORMAT_MIN]}


def readable(fmt: list, version: int) -> bool:
    """Whether a process with format ``fmt`` (``[written, oldest read]``) reads ``version``."""
    return fmt[1] <= version <= fmt[0]


def incompatibility(mine: dict, theirs: Optional[dict]) -> Optional[str]:
    """Why processes with formats ``mine`` and ``theirs`` cannot work together (None: they
    can): for every format each must read the version the other writes."""
    theirs = LEGACY_FORMATS if theirs is None else theirs
    for name in sorted(set(mine) | set(theirs)):
        if name not in mine or name not in theirs:
            return f"the {name} format is known to one of them only"
        a, b = list(mine[name]), list(theirs[name])
        if not (readable(a, b[0]) and readable(b, a[0])):
            return (f"{name} format: one writes version {a[0]} and reads {a[1]}..{a[0]}, the "
                    f"other writes {b[0]} and reads {b[1]}..{b[0]}")
    return None

"""What a durable pipeline's output log says, for the fault-tolerance tests: a view integrated
from the log alone, the way a consumer that deduplicates by step would see it."""
from __future__ import annotations

import os

import pyarrow as pa

from dbsp.ft import read_outputs


def logged_view(directory: str, name: str = "raw", cols: tuple = ("k", "v")) -> dict:
    """``{row: weight}`` of output ``name`` summed over every record of ``directory``'s output log
    (rows of weight 0 left out)."""
    got: dict = {}
    for _, tables in read_outputs(os.path.join(directory, "ft", "output")):
        for r in tables.get(name, pa.table({})).to_pylist():
            k = tuple(r[c] for c in cols)
            got[k] = got.get(k, 0) + r["__weight"]
    return {k: w for k, w in got.items() if w}

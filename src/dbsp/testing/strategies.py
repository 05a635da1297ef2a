"""Hypothesis strategies for schemas, rows and sequences of Z-set deltas.

Values come from small domains so that random rows collide (joins match, groups get several rows,
retractions hit existing rows). Floats are dyadic (exact in binary), so sums and averages computed
in a different order are still equal. Strings include the empty string, non-ASCII and an embedded
NUL (which the key encoding escapes).

* :func:`schemas` – Arrow schemas of a few columns of the supported types, nullable or not;
* :func:`rows` – one row tuple of a schema;
* :func:`zsets` – one Z-set delta (``dict[row, weight]``, weights of both signs);
* :func:`deltas` – a list of per-step deltas; with ``valid=True`` the integrated Z-set never has a
  negative weight (retractions only remove rows that are there), which is what SQL-like operators
  (aggregates, top-k, upserts) assume.
"""
from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

INTS = st.integers(-3, 3)
BIG_INTS = st.integers(-(2 ** 40), 2 ** 40)
STRINGS = st.sampled_from(["", "a", "b", "ab", "é", "a\x00", "zz"])
FLOATS = st.sampled_from([-1.5, -0.5, 0.0, 0.25, 2.0, 3.75])
DECIMALS = st.sampled_from([Decimal("-1.25"), Decimal("0.00"), Decimal("2.50"), Decimal("7.05")])
DATES = st.sampled_from([datetime.date(2024, 1, d) for d in (1, 2, 3)])

TYPES: dict = {
    "int64": (pa.int64(), INTS),
    "int32": (pa.int32(), INTS),
    "uint8": (pa.uint8(), st.integers(0, 3)),
    "string": (pa.string(), STRINGS),
    "float64": (pa.float64(), FLOATS),
    "bool": (pa.bool_(), st.booleans()),
    "date32": (pa.date32(), DATES),
    "decimal": (pa.decimal128(9, 2), DECIMALS),
}
NUMERIC = ("int64", "int32", "uint8", "float64", "decimal")
KEYABLE = tuple(TYPES)


def value_strategy(field: pa.Field, null_ratio: float = 0.2):
    """Values of one field (with ``None`` sometimes when it is nullable)."""
    for t, s in TYPES.values():
        if t == field.type:
            break
    else:
        raise TypeError(f"no strategy for {field.type}")
    if field.nullable:
        return st.one_of(st.none(), s) if null_ratio > 0 else s
    return s


@st.composite
def fields(draw, name: str, types: Sequence[str] = KEYABLE, nullable: Optional[bool] = None):
    t = draw(st.sampled_from(list(types)))
    n = draw(st.booleans()) if nullable is None else nullable
    return pa.field(name, TYPES[t][0], nullable=n)


@st.composite
def schemas(draw, min_cols: int = 1, max_cols: int = 4, types: Sequence[str] = KEYABLE,
            nullable: Optional[bool] = None, prefix: str = "c"):
    """A schema of ``min_cols..max_cols`` columns named ``{prefix}0, {prefix}1, ...``."""
    n = draw(st.integers(min_cols, max_cols))
    return pa.schema([draw(fields(f"{prefix}{i}", types, nullable)) for i in range(n)])


def rows(schema: pa.Schema):
    """One row (a tuple) of ``schema``."""
    return st.tuples(*[value_strategy(f) for f in schema])


def zsets(schema: pa.Schema, max_rows: int = 6, weights=st.sampled_from([-2, -1, 1, 2, 3])):
    """A Z-set delta over ``schema``: ``dict[row, weight]`` with non-zero weights."""
    return st.dictionaries(rows(schema), weights, max_size=max_rows)


@st.composite
def deltas(draw, schema: pa.Schema, steps: int = 4, max_rows: int = 5, valid: bool = False):
    """``steps`` deltas over ``schema``. ``valid``: the running sum never goes negative (deletes
    only remove rows present, inserts have weight 1 or 2)."""
    n = draw(st.integers(1, steps))
    if not valid:
        return [draw(zsets(schema, max_rows)) for _ in range(n)]
    state: dict = {}
    out = []
    for _ in range(n):
        d: dict = {}
        ins = draw(st.dictionaries(rows(schema), st.integers(1, 2), max_size=max_rows))
        for r, w in ins.items():
            d[r] = d.get(r, 0) + w
        present = sorted((r for r, w in state.items() if w > 0), key=repr)
        if present:
            gone = draw(st.lists(st.sampled_from(present), max_size=max_rows, unique=True))
            for r in gone:
                d[r] = d.get(r, 0) - draw(st.integers(1, state[r]))
        d = {r: w for r, w in d.items() if w}
        for r, w in d.items():
            state[r] = state.get(r, 0) + w
        out.append(d)
    return out


__all__ = ["schemas", "fields", "rows", "zsets", "deltas", "value_strategy", "TYPES", "NUMERIC",
           "KEYABLE", "INTS", "BIG_INTS", "STRINGS", "FLOATS", "DECIMALS", "DATES"]


# -- fixed-width Arrow columns (the native take / gather kernels' inputs) ----------------------

FIXED_WIDTH_TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64(), pa.float16(),
    pa.float32(), pa.float64(), pa.timestamp("us", tz="Europe/Paris"), pa.date32(),
    pa.date64(), pa.time32("ms"), pa.time64("ns"), pa.duration("s")]


def fixed_width_column(t: pa.DataType, n: int, rng) -> pa.Array:
    """``n`` values of the fixed-width type ``t`` (small integers, or thirds for floats),
    drawn from the numpy generator ``rng``."""
    raw = rng.integers(0, 100, n)
    if pa.types.is_floating(t):
        return pa.array(raw.astype(np.float64) / 3).cast(t)
    if pa.types.is_temporal(t):
        return pa.array(raw.astype(np.int64 if t.bit_width == 64 else np.int32)).cast(t)
    return pa.array(raw).cast(t)


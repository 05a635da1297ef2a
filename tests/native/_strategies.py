"""Hypothesis strategies for the native-kernel tests: code arrays and key columns.

* :func:`u64_codes` – uint64 code arrays, from a few distinct values (many duplicates) to the
  full 64-bit range;
* :func:`var_rows` / :func:`var_codes` – raw byte strings (empty ones, embedded NULs, shared
  prefixes longer than 8 bytes) as :class:`VarCodes`;
* :func:`key_table` – a few key columns of every type the codec supports (ints of every width,
  floats with -0.0/NaN/inf, bools, decimals, dates, timestamps, strings and binary, large and
  not), nullable or not, with their Python rows.
"""
from __future__ import annotations

import datetime
import math
from decimal import Decimal

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dbsp.algebra.codes import VarCodes

HIGHS = [1, 3, 50, 1000, 2 ** 20, 2 ** 62, 2 ** 64 - 1]


@st.composite
def u64_codes(draw, min_size=0, max_size=200, high=None):
    hi = draw(st.sampled_from(HIGHS)) if high is None else high
    return draw(hnp.arrays(np.uint64, st.integers(min_size, max_size),
                           elements=st.integers(0, hi)))


_BYTE = st.sampled_from([0, 0, 1, 2, 0x61, 0x62, 0xFF])
# long shared prefixes so that ties survive the 8-byte radix prefix
_PREFIX = st.sampled_from([b"", b"", b"abcdefgh", b"abcdefghijklmnop", b"\x00" * 9])


@st.composite
def var_rows(draw, min_size=0, max_size=60):
    n = draw(st.integers(min_size, max_size))
    return [draw(_PREFIX) + bytes(draw(st.lists(_BYTE, max_size=12))) for _ in range(n)]


@st.composite
def var_codes(draw, min_size=0, max_size=60):
    return VarCodes.from_list(draw(var_rows(min_size, max_size)))


def codes_of(kind: str, rows: list[int]):
    """The same logical keys as u64 codes or as var codes (big-endian 8 bytes, same order)."""
    a = np.asarray(rows, dtype=np.uint64)
    if kind == "u64":
        return a
    return VarCodes.from_list([int(x).to_bytes(8, "big") for x in rows])


# --- key columns --------------------------------------------------------------------------------

_TEXT = st.text(alphabet=st.sampled_from(["\x00", "a", "b", "é", "\u20ac", "z"]), max_size=10)
_BIN = st.binary(max_size=10) | st.sampled_from([b"", b"\x00", b"\x00\x00", b"\x00\xff", b"\xff"])
_FLOAT = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), 1.5, -1.5])

COLUMN_TYPES = {
    "int8": (pa.int8(), st.integers(-128, 127)),
    "int16": (pa.int16(), st.integers(-2 ** 15, 2 ** 15 - 1)),
    "int32": (pa.int32(), st.integers(-2 ** 31, 2 ** 31 - 1)),
    "int64": (pa.int64(), st.integers(-2 ** 63, 2 ** 63 - 1) | st.integers(-3, 3)),
    "uint8": (pa.uint8(), st.integers(0, 255)),
    "uint16": (pa.uint16(), st.integers(0, 2 ** 16 - 1)),
    "uint32": (pa.uint32(), st.integers(0, 2 ** 32 - 1)),
    "uint64": (pa.uint64(), st.integers(0, 2 ** 64 - 1)),
    "bool": (pa.bool_(), st.booleans()),
    "float64": (pa.float64(), _FLOAT),
    "decimal": (pa.decimal128(12, 2),
                st.integers(-10 ** 12 + 1, 10 ** 12 - 1).map(lambda i: Decimal(i).scaleb(-2))),
    "decimal38": (pa.decimal128(38, 0),
                  (st.integers(-10 ** 38 + 1, 10 ** 38 - 1) | st.integers(-3, 3)).map(Decimal)),
    "date32": (pa.date32(), st.dates()),
    "date64": (pa.date64(), st.dates()),
    "timestamp": (pa.timestamp("us"), st.integers(-2 ** 62, 2 ** 62)),
    "timestamp_tz": (pa.timestamp("ns", tz="UTC"), st.integers(-2 ** 62, 2 ** 62)),
    "duration": (pa.duration("ms"), st.integers(-2 ** 62, 2 ** 62)),
    "time32": (pa.time32("s"), st.integers(0, 86399).map(
        lambda s: datetime.time(s // 3600, s // 60 % 60, s % 60))),
    "time64": (pa.time64("us"), st.integers(0, 86400 * 10 ** 6 - 1)),
    "string": (pa.string(), _TEXT),
    "large_string": (pa.large_string(), _TEXT),
    "binary": (pa.binary(), _BIN),
    "large_binary": (pa.large_binary(), _BIN),
}


@st.composite
def key_table(draw, max_cols=4, max_rows=40, types=None, allow_null_in_non_nullable=True):
    """(fields, columns, rows): a key of 1..max_cols columns and its rows as Python tuples.

    Values come from a small pool per column, so equal keys occur. Columns are sometimes sliced
    (non-zero Arrow offset) or chunked.
    """
    names = draw(st.lists(st.sampled_from(sorted(types or COLUMN_TYPES)), min_size=1,
                          max_size=max_cols))
    n = draw(st.integers(0, max_rows))
    fields, cols, per_col = [], [], []
    for j, name in enumerate(names):
        t, values = COLUMN_TYPES[name]
        nullable = draw(st.booleans())
        pool = draw(st.lists(values, min_size=1, max_size=6))
        with_nulls = nullable or (allow_null_in_non_nullable and draw(st.booleans()))
        choice = st.sampled_from(pool + [None]) if with_nulls else st.sampled_from(pool)
        vals = [draw(choice) for _ in range(n)]
        lead = draw(st.integers(0, 3))
        full = pa.array([pool[0]] * lead + vals, type=t)
        col = full.slice(lead)
        if draw(st.booleans()) and n > 1:
            cut = draw(st.integers(0, n))
            col = pa.chunked_array([col.slice(0, cut), col.slice(cut)], type=t)
        fields.append(pa.field(f"c{j}", t, nullable=nullable))
        cols.append(col)
        per_col.append(vals)
    rows = list(zip(*per_col)) if per_col else []
    return fields, cols, rows


def sort_key(row):
    """Python key order of the codec: per column nulls first, NaN after every number,
    -0.0 == 0.0."""
    out = []
    for v in row:
        if v is None:
            out.append((0,))
        elif isinstance(v, float):
            out.append((1, 1, 0.0) if math.isnan(v) else (1, 0, v))
        else:
            out.append((1, 0, v))
    return tuple(out)

"""Random tuples, nested-dict models and invariant checks shared by the trace tests.

Set ``DBSP_TRACE_EXAMPLES_SCALE`` to multiply the number of examples (a soak run).

Values come from small per-type domains (so keys collide and retractions cancel) covering every
key type the codes support, with nulls, NUL bytes inside strings, ``-0.0`` beside ``0.0``, and
multi-column keys. A model is a plain dict: ``{(key, val): weight}`` for indexed batches,
``{row: weight}`` for Z-sets, ``{(key, [val,] time): weight}`` for timed batches.
"""
from __future__ import annotations

import datetime as dt
import os
from decimal import Decimal

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from dbsp.trace.batch import OrdIndexedZSet, OrdZSet
from dbsp.trace.cursor import encode_tuple

DOMAINS: dict[str, tuple[pa.DataType, list]] = {
    "i64": (pa.int64(), [-3, -1, 0, 2, 7]),
    "i32": (pa.int32(), [-2, 0, 5]),
    "i8": (pa.int8(), [-128, 0, 127]),
    "u16": (pa.uint16(), [0, 1, 65535]),
    "f64": (pa.float64(), [-1.5, -0.0, 0.0, 2.25]),
    "bool": (pa.bool_(), [False, True]),
    "date": (pa.date32(), [dt.date(1969, 12, 31), dt.date(2024, 2, 29)]),
    "ts": (pa.timestamp("us"), [dt.datetime(2000, 1, 1), dt.datetime(2000, 1, 1, 0, 0, 1)]),
    "dec": (pa.decimal128(10, 2), [Decimal("-3.50"), Decimal("0.00"), Decimal("1.25")]),
    "str": (pa.string(), ["", "a", "a\x00", "ab", "b"]),
    "bin": (pa.binary(), [b"", b"\x00", b"\x00\xff", b"x"]),
    "lstr": (pa.large_string(), ["x", "xy", "y"]),
}
TYPE_NAMES = sorted(DOMAINS)

SCALE = float(os.environ.get("DBSP_TRACE_EXAMPLES_SCALE", "1"))
"""Multiplies every trace test's ``max_examples`` (e.g. 20 for a soak run)."""


def examples(n: int) -> int:
    return max(1, int(n * SCALE))
WEIGHTS = [-2, -1, 1, 2]


@st.composite
def schemas(draw, min_cols=1, max_cols=2, prefix="c"):
    n = draw(st.integers(min_cols, max_cols))
    names = draw(st.lists(st.sampled_from(TYPE_NAMES), min_size=n, max_size=n))
    nullable = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return pa.schema([pa.field(f"{prefix}{i}", DOMAINS[t][0], nullable=nl)
                      for i, (t, nl) in enumerate(zip(names, nullable))])


def values(schema: pa.Schema):
    """Strategy for one tuple of ``schema``."""
    parts = []
    for f in schema:
        dom = next(d for t, d in DOMAINS.values() if t == f.type)
        s = st.sampled_from(dom)
        parts.append(st.one_of(st.none(), s) if f.nullable else s)
    return st.tuples(*parts)


def rows(schema: pa.Schema, max_size: int = 12):
    return st.lists(st.tuples(values(schema), st.sampled_from(WEIGHTS)), max_size=max_size)


def indexed_rows(ks: pa.Schema, vs: pa.Schema, max_size: int = 12):
    return st.lists(st.tuples(values(ks), values(vs), st.sampled_from(WEIGHTS)),
                    max_size=max_size)


# --- building batches -------------------------------------------------------------------------

def record_batch(schema: pa.Schema, tuples: list) -> pa.RecordBatch:
    if len(schema) == 0:  # no columns, but still one row per tuple
        return pa.record_batch({"_": pa.nulls(len(tuples))}).select([])
    cols = [pa.array([t[i] for t in tuples], type=f.type) for i, f in enumerate(schema)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def zset(schema: pa.Schema, rws: list) -> OrdZSet:
    return OrdZSet.from_arrow(record_batch(schema, [r for r, _ in rws]),
                              np.asarray([w for _, w in rws], np.int64))


def indexed(ks: pa.Schema, vs: pa.Schema, rws: list) -> OrdIndexedZSet:
    return OrdIndexedZSet.from_parts(record_batch(ks, [k for k, _, _ in rws]),
                                     record_batch(vs, [v for _, v, _ in rws]),
                                     np.asarray([w for _, _, w in rws], np.int64))


# --- models -----------------------------------------------------------------------------------

def add_into(model: dict, items) -> dict:
    """``model += items`` (pairs ``(key, weight)``), dropping zeros; returns model."""
    for k, w in items:
        model[k] = model.get(k, 0) + w
        if model[k] == 0:
            del model[k]
    return model


def zset_model(rws) -> dict:
    return add_into({}, ((r, w) for r, w in rws))


def indexed_model(rws) -> dict:
    return add_into({}, (((k, v), w) for k, v, w in rws))


def state_of(batches) -> dict:
    """The sum of batches as a ``{row: weight}`` dict (``(key, val)`` rows for indexed)."""
    out: dict = {}
    for b in batches:
        if isinstance(b, OrdIndexedZSet):
            nk = len(b.key_schema)
            add_into(out, (((r[:nk], r[nk:]), w) for r, w in b.to_dict().items()))
        else:
            add_into(out, b.to_dict().items())
    return out


_CODES: dict = {}


def code(codec, t: tuple):
    """The code of tuple ``t`` (memoised: the tests ask for the same codes many times)."""
    k = (tuple(str(f.type) + str(f.nullable) for f in codec.fields), t)
    c = _CODES.get(k)
    if c is None:
        c = _CODES[k] = encode_tuple(codec, t)
    return c


# --- invariants -------------------------------------------------------------------------------

def _codes_list(codes) -> list:
    return codes.tolist() if isinstance(codes, np.ndarray) else codes.to_list()


def check_zset(b: OrdZSet) -> None:
    c = _codes_list(b.codes)
    assert len(c) == len(b) == b.data.num_rows
    assert all(x < y for x, y in zip(c, c[1:])), "codes not strictly ascending"
    assert not (b.weights == 0).any(), "zero weight"


def check_indexed(b: OrdIndexedZSet) -> None:
    kc, vc = _codes_list(b.kcodes), _codes_list(b.vcodes)
    off = b.offsets.tolist()
    assert len(kc) == b.num_keys and len(off) == b.num_keys + 1 and off[0] == 0
    assert off[-1] == len(b) == len(vc) == b.vals.num_rows
    assert all(x < y for x, y in zip(kc, kc[1:])), "keys not strictly ascending"
    for i in range(b.num_keys):
        assert off[i] < off[i + 1], "empty key"
        v = vc[off[i]:off[i + 1]]
        assert all(x < y for x, y in zip(v, v[1:])), "values not strictly ascending"
    assert not (b.weights == 0).any(), "zero weight"

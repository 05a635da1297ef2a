"""The type system (mirrors ``src/dbsp/algebra/dtypes.py``): kinds, widening, type names, casts.

``common_type`` is checked against a model of what it promises: the result holds every value of
every input type (ints widen to an int type that holds both ranges, a float anywhere gives
float64) and inputs of different kinds are refused.
"""
from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dbsp.algebra.dtypes import (KINDS, TypeMismatch, as_type, cast_value, common_type, is_binary,
                                 is_bool, is_float, is_int, is_null, is_numeric, is_string,
                                 is_temporal, kind_of)

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
        pa.uint64()]
FLOATS = [pa.float16(), pa.float32(), pa.float64()]

SAMPLES = {
    "null": [pa.null()],
    "numeric": INTS + FLOATS + [pa.decimal128(10, 2)],
    "string": [pa.string(), pa.large_string()],
    "binary": [pa.binary(), pa.large_binary()],
    "bool": [pa.bool_()],
    "duration": [pa.duration("ms"), pa.duration("ns")],
    "temporal": [pa.timestamp("us"), pa.timestamp("ms", tz="UTC"), pa.date32(), pa.date64(),
                 pa.time64("us")],
}


@pytest.mark.parametrize("kind, t", [(k, t) for k, ts in SAMPLES.items() for t in ts],
                         ids=lambda x: str(x))
def test_kind_of_every_sample(kind, t):
    assert kind_of(t) == kind
    assert kind in KINDS


def test_predicates_agree_with_kinds():
    for kind, ts in SAMPLES.items():
        for t in ts:
            assert is_null(t) == (kind == "null")
            assert is_numeric(t) == (kind == "numeric")
            assert is_string(t) == (kind == "string")
            assert is_binary(t) == (kind == "binary")
            assert is_bool(t) == (kind == "bool")
            assert is_temporal(t) == (kind in ("temporal", "duration"))
            assert is_int(t) == (t in INTS)
            assert is_float(t) == (t in FLOATS)


def test_other_types_are_a_kind_of_their_own():
    t = pa.list_(pa.int64())
    assert kind_of(t) == str(t) and kind_of(t) not in KINDS


def _range(t: pa.DataType) -> tuple[int, int]:
    info = np.iinfo(t.to_pandas_dtype())
    return int(info.min), int(info.max)


@given(st.lists(st.sampled_from(INTS), min_size=1, max_size=4))
def test_common_int_type_holds_every_input_range(types):
    t = common_type(types, "keys")
    assert is_int(t)
    lo, hi = _range(t)
    signed = any(str(x).startswith("int") for x in types)
    for x in types:
        xlo, xhi = _range(x)
        if x == pa.uint64() and signed:
            # no integer type holds both: Arrow picks int64, and a uint64 value above its
            # range fails the (safe) cast at run time instead of wrapping
            assert t == pa.int64()
            with pytest.raises(pa.ArrowInvalid):
                pa.array([xhi], x).cast(t)
            continue
        assert lo <= xlo and xhi <= hi
        # the values really convert: the extremes of every input cast into the common type
        assert pa.array([xlo, xhi], x).cast(t).to_pylist() == [xlo, xhi]


@given(st.lists(st.sampled_from(INTS + FLOATS), min_size=1, max_size=4))
def test_a_float_among_numbers_gives_float64(types):
    t = common_type(types, "sum")
    if all(x == types[0] for x in types):
        assert t == types[0]
    elif any(is_float(x) for x in types):
        assert t == pa.float64()


@given(st.lists(st.sampled_from([k for k in SAMPLES if k != "null"]), min_size=2, max_size=4),
       st.data())
def test_different_kinds_are_refused_naming_the_use(kinds, data):
    types = [data.draw(st.sampled_from(SAMPLES[k])) for k in kinds]
    if len(set(kinds)) > 1:
        with pytest.raises(TypeMismatch, match="^coalesce: incompatible types"):
            common_type(types, "coalesce")
    elif all(t == types[0] for t in types):
        assert common_type(types, "x") == types[0]


def test_nulls_are_ignored():
    assert common_type([pa.null(), pa.null()], "x") == pa.null()
    assert common_type([], "x") == pa.null()
    assert common_type([pa.null(), pa.string(), pa.null()], "x") == pa.string()
    assert common_type([pa.int8(), pa.null(), pa.int32()], "x") == pa.int32()


def test_same_kind_without_a_common_type_is_refused():
    with pytest.raises(TypeMismatch, match="when: incompatible types"):
        common_type([pa.timestamp("ms"), pa.time64("us")], "when")
    assert issubclass(TypeMismatch, TypeError)


@pytest.mark.parametrize("name, t", [
    ("int", pa.int64()), ("float", pa.float64()), ("str", pa.string()), ("bool", pa.bool_()),
    ("double", pa.float64()), ("utf8", pa.string()), ("int32", pa.int32()),
    ("uint8", pa.uint8()), ("string", pa.string()), ("date32", pa.date32()),
    ("timestamp[ms]", pa.timestamp("ms")), ("duration[ns]", pa.duration("ns")),
    ("decimal128(10,2)", pa.decimal128(10, 2)), ("decimal128(7)", pa.decimal128(7, 0)),
    (int, pa.int64()), (float, pa.float64()), (str, pa.string()), (bool, pa.bool_()),
    (pa.int16(), pa.int16()),
])
def test_as_type_reads_names_and_python_types(name, t):
    assert as_type(name) == t


@pytest.mark.parametrize("bad", ["int65", "timestamp[days]", "decimal128(x)", "", "list"])
def test_as_type_names_an_unknown_type_name(bad):
    with pytest.raises(TypeError, match=f"unknown type name {bad!r}".replace("(", r"\(")
                       .replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        as_type(bad)


@pytest.mark.parametrize("bad", [3, None, list, object()])
def test_as_type_refuses_what_is_not_a_type(bad):
    with pytest.raises(TypeError, match="not a type"):
        as_type(bad)


def test_cast_value_arrays_and_scalars():
    a = pa.array([1, None, 3], pa.int32())
    assert cast_value(a, pa.int32()) is a  # no copy when the type is already right
    assert cast_value(a, pa.int64()).equals(pa.array([1, None, 3], pa.int64()))
    s = cast_value(pa.scalar(2, pa.int8()), pa.float64())
    assert isinstance(s, pa.Scalar) and s.as_py() == 2.0 and s.type == pa.float64()
    d = cast_value(pa.array(["1.25"]), pa.decimal128(5, 2))
    assert d.to_pylist() == [decimal.Decimal("1.25")]
    with pytest.raises(pa.ArrowInvalid):  # safe: an overflow raises, never wraps
        cast_value(pa.array([300], pa.int64()), pa.int8())

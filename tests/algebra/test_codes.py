"""KeyCodec on the types it codes through another one (dbsp.algebra.codes.normalize): float32,
dictionaries, struct / list / map columns.

Against the reference model of the order (Python's, nulls first, NaN last, -0.0 == 0.0, lists
and structs lexicographic, a prefix before a longer list): sorting by code sorts the values,
equal codes iff equal values, the native encoder gives the reference encoder's bytes, and the
values come back unchanged through a pipeline that keys on them (1 and 2 workers).
"""
from __future__ import annotations

import math

import pyarrow as pa
import pytest
from dbsp._native import sort as native_sort
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.algebra.codes import Codes, KeyCodec, normalize
from dbsp.api import StreamContext, count

F32 = st.floats(width=32, allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, float("nan"), 1.5, -1.5])
SMALL_INT = st.integers(-3, 3) | st.integers(-2 ** 63, 2 ** 63 - 1)
TEXT = st.text(alphabet=st.sampled_from(["\x00", "a", "b", "é"]), max_size=4)

KINDS = {
    "float32": (pa.float32(), F32),
    "dict_string": (pa.dictionary(pa.int32(), pa.string()), TEXT),
    "dict_int": (pa.dictionary(pa.int8(), pa.int64()), SMALL_INT),
    "list_int": (pa.list_(pa.int64()), st.lists(st.none() | SMALL_INT, max_size=3)),
    "large_list_str": (pa.large_list(pa.string()), st.lists(st.none() | TEXT, max_size=3)),
    "struct": (pa.struct([("a", pa.int32()), ("b", pa.string())]),
               st.fixed_dictionaries({"a": st.none() | st.integers(-5, 5),
                                      "b": st.none() | TEXT})),
    "list_struct": (pa.list_(pa.struct([("x", pa.float32())])),
                    st.lists(st.fixed_dictionaries({"x": st.none() | F32}), max_size=2)),
    "map": (pa.map_(pa.string(), pa.int64()),
            st.lists(st.tuples(TEXT, st.none() | SMALL_INT), max_size=2)),
    "time64": (pa.time64("ns"), st.integers(0, 86400 * 10 ** 9 - 1)),
    "date64": (pa.date64(), st.integers(-10 ** 6, 10 ** 6).map(lambda d: d * 86_400_000)),
}


def vkey(v, t: pa.DataType):
    """The reference order of one value of type ``t``."""
    if v is None:
        return (0,)
    if pa.types.is_dictionary(t):
        return vkey(v, t.value_type)
    if pa.types.is_struct(t):
        return (1, tuple(vkey(v[t.field(i).name], t.field(i).type) for i in range(t.num_fields)))
    if pa.types.is_map(t):
        return (1, tuple((vkey(k, t.key_type), vkey(x, t.item_type)) for k, x in v))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return (1, tuple(vkey(x, t.value_type) for x in v))
    if isinstance(v, float):
        return (1, 1, 0.0) if math.isnan(v) else (1, 0, v + 0.0)
    return (1, 0, v)


@st.composite
def columns(draw, max_cols=3, max_rows=30):
    names = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=max_cols))
    n = draw(st.integers(0, max_rows))
    fields, cols, per_col = [], [], []
    for j, name in enumerate(names):
        t, values = KINDS[name]
        pool = draw(st.lists(values, min_size=1, max_size=5))
        nullable = draw(st.booleans())
        vals = [draw(st.sampled_from(pool + ([None] if nullable else []))) for _ in range(n)]
        lead = draw(st.integers(0, 2))
        arr = pa.array([pool[0]] * lead + vals, type=t).slice(lead)
        fields.append(pa.field(f"c{j}", t, nullable=nullable))
        cols.append(arr)
        per_col.append([vkey(v, t) for v in vals])
    return fields, cols, list(zip(*per_col)) if per_col else []


@given(columns())
@settings(max_examples=150)
def test_codes_order_like_values(table):
    fields, cols, keys = table
    codec = KeyCodec(fields)
    codes = codec.encode(cols, len(keys))
    order = native_sort.argsort(codes)
    assert [keys[i] for i in order] == sorted(keys)
    rows = Codes.to_list(codes)
    for i in range(len(keys)):
        for j in range(i + 1, min(len(keys), i + 6)):
            assert (rows[i] == rows[j]) == (keys[i] == keys[j])


@given(columns())
def test_native_and_reference_encoders_agree(table):
    fields, cols, keys = table
    codec = KeyCodec(fields)
    got = Codes.to_list(codec.encode(cols, len(keys)))
    ref = codec.encode_reference(cols).to_list()
    if codec.u64:
        ref = [int.from_bytes(r, "big") for r in ref]
    assert got == ref


def test_codes_do_not_depend_on_the_dictionary():
    t = pa.dictionary(pa.int32(), pa.string())
    a = pa.DictionaryArray.from_arrays(pa.array([0, 1]), pa.array(["x", "y"]))
    b = pa.DictionaryArray.from_arrays(pa.array([1, 0]), pa.array(["y", "x"]))
    codec = KeyCodec([pa.field("d", t)])
    assert Codes.to_list(codec.encode([a])) == Codes.to_list(codec.encode([b]))


def test_float32_shares_float64_codes():
    v = [1.5, -0.0, float("nan"), None, -3.25]
    c32 = KeyCodec([pa.field("f", pa.float32())]).encode([pa.array(v, pa.float32())])
    c64 = KeyCodec([pa.field("f", pa.float64())]).encode([pa.array(v, pa.float64())])
    assert Codes.to_list(c32) == Codes.to_list(c64)


def test_nested_column_normalizes_to_binary_with_its_nulls():
    arr = pa.array([[1], None, []], pa.list_(pa.int64())).slice(1)
    n = normalize(arr)
    assert pa.types.is_binary(n.type) and n.to_pylist()[0] is None and n.null_count == 1


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_new_key_types_group_and_round_trip(workers, kind):
    """Group by a column of each type: one group per distinct value, values unchanged."""
    t, values = KINDS[kind]
    sample = {
        "float32": [1.5, -0.0, 0.0, None, 2.5, 1.5],
        "dict_string": ["b", "a", None, "b", "a\x00"],
        "dict_int": [3, -1, 3, None],
        "list_int": [[1, 2], [1], [], None, [1, None], [1, 2]],
        "large_list_str": [["a"], ["a", None], None, ["a"]],
        "struct": [{"a": 1, "b": "x"}, {"a": None, "b": "x"}, None, {"a": 1, "b": "x"}],
        "list_struct": [[{"x": 1.5}], [{"x": None}], [], [{"x": 1.5}]],
        "map": [[("a", 1)], [("a", 1), ("b", None)], None, [("a", 1)]],
        "time64": [5000, 0, None, 5000],
        "date64": [86_400_000, 0, None, 0],
    }[kind]
    arr = pa.array(sample, type=t)
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(pa.table({"k": arr, "i": list(range(len(sample)))}))
        out = s.group_by("k").agg(n=count()).collect()
        ctx.execute()
        got = out.view().sort_by([("n", "ascending")])
        assert got.schema.field("k").type == t
    py = [vkey(v, t) for v in arr.to_pylist()]
    want = {}
    for k in py:
        want[k] = want.get(k, 0) + 1
    have = {}
    for v, n in zip(got.column("k").to_pylist(), got.column("n").to_pylist()):
        have[vkey(v, t)] = n
    assert have == want

"""Types users have (issue 11, items 4 and 12): exact numbers, time zones, Polars and dicts of
columns in and out, and every newer column type carried through map / filter / join / project /
output with 1 and 2 workers, against the same query computed in plain Python."""
from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import numpy as np
import pandas as pd
import polars as pl
import pyarrow as pa
import pytest

from dbsp.algebra.schema import InputError, py_values
from dbsp.api import StreamContext, col

PARIS = ZoneInfo("Europe/Paris")


@pytest.fixture(params=[1, 2], ids=["W1", "W2"])
def workers(request):
    return request.param


def kv(t=pa.int64()):
    return pa.schema([("k", pa.int64()), ("v", t)])


# --- item 4: a float goes into an int column only when it is a whole number ---------------------

@pytest.mark.parametrize("form", ["rows", "dict_rows", "pandas", "arrow", "numpy_columns",
                                  "polars"])
def test_non_whole_float_into_int_column_is_refused_everywhere(form):
    data = {
        "rows": [(1, 1.0), (2, 1.5)],
        "dict_rows": [{"k": 1, "v": 1.0}, {"k": 2, "v": 1.5}],
        "pandas": pd.DataFrame({"k": [1, 2], "v": [1.0, 1.5]}),
        "arrow": pa.table({"k": [1, 2], "v": [1.0, 1.5]}),
        "numpy_columns": {"k": np.array([1, 2]), "v": np.array([1.0, 1.5])},
        "polars": pl.DataFrame({"k": [1, 2], "v": [1.0, 1.5]}),
    }[form]
    with StreamContext() as ctx:
        s = ctx.stream(kv(), name="nums")
        out = s.collect()
        with pytest.raises(InputError) as e:
            s.insert(data)
        assert (e.value.input_name, e.value.column, e.value.row) == ("nums", "v", 1)
        assert "1.5" in str(e.value)
        ctx.step()
        assert out.rows() == []  # nothing of the refused push was applied


@pytest.mark.parametrize("form", ["rows", "pandas", "arrow", "numpy_columns", "polars"])
def test_whole_floats_into_int_column_are_accepted(form):
    data = {
        "rows": [(1, 1.0), (2, -3.0)],
        "pandas": pd.DataFrame({"k": [1, 2], "v": [1.0, -3.0]}),
        "arrow": pa.table({"k": [1, 2], "v": [1.0, -3.0]}),
        "numpy_columns": {"k": np.array([1, 2]), "v": np.array([1.0, -3.0])},
        "polars": pl.DataFrame({"k": [1, 2], "v": [1.0, -3.0]}),
    }[form]
    with StreamContext() as ctx:
        s = ctx.stream(kv())
        out = s.collect()
        s.insert(data)
        ctx.step()
        assert out.rows() == [(1, 1), (2, -3)]


def test_nan_into_int_column_is_refused():
    with StreamContext() as ctx:
        s = ctx.stream(kv())
        with pytest.raises(InputError, match="not a whole number"):
            s.insert([(1, float("nan"))])


# --- time zones: kept, or refused; never silently made naive UTC --------------------------------

def test_aware_timestamps_keep_their_zone(workers):
    t = pa.timestamp("us", tz="Europe/Paris")
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(pa.schema([("k", pa.int64()), ("ts", t)]))
        out = s.filter(col("ts") > dt.datetime(2024, 1, 1, tzinfo=PARIS)).collect()
        s.insert([(1, dt.datetime(2024, 1, 1, 12, tzinfo=PARIS)),
                  (2, dt.datetime(2023, 1, 1, 12, tzinfo=PARIS))])
        s.push(pd.DataFrame({"k": [3], "ts": [pd.Timestamp("2024-06-01 08:00", tz="UTC")]}))
        ctx.step()
        assert out.view().schema.field("ts").type == t
        assert out.rows() == [(1, dt.datetime(2024, 1, 1, 12, tzinfo=PARIS)),
                              (3, dt.datetime(2024, 6, 1, 10, tzinfo=PARIS))]


@pytest.mark.parametrize("col_tz,value", [
    (None, dt.datetime(2024, 1, 1, 12, tzinfo=PARIS)),
    (None, pd.DataFrame({"k": [1], "ts": [pd.Timestamp("2024-01-01 12:00", tz="Europe/Paris")]})),
    ("Europe/Paris", dt.datetime(2024, 1, 1, 12)),
    ("Europe/Paris", pd.DataFrame({"k": [1], "ts": [pd.Timestamp("2024-01-01 12:00")]})),
])
def test_zone_mismatch_is_refused(col_tz, value):
    with StreamContext() as ctx:
        s = ctx.stream(pa.schema([("k", pa.int64()), ("ts", pa.timestamp("us", tz=col_tz))]),
                       name="events")
        data = [(1, value)] if isinstance(value, dt.datetime) else value
        with pytest.raises(InputError, match="time zone") as e:
            s.insert(data)
        assert e.value.column == "ts"


# --- Polars and dicts of columns, in and out ----------------------------------------------------

def test_polars_and_column_dicts_in_and_out(workers):
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(pl.DataFrame({"k": [1, 2, 3], "name": ["a", "b", "c"]}), name="pl")
        d = ctx.stream({"k": np.array([2, 3, 4], dtype=np.int32),
                        "x": pa.array([0.5, 1.5, 2.5], pa.float32())}, name="cols")
        out = s.join(d, on="k").collect()
        ctx.execute()
        df = out.view_polars()
        assert isinstance(df, pl.DataFrame)
        assert sorted(df.select("k", "name", "x").rows()) == [(2, "b", 0.5), (3, "c", 1.5)]
        cols = out.view_columns(numpy=True)
        assert sorted(cols["k"].tolist()) == [2, 3] and cols["__weight"].tolist() == [1, 1]
        assert isinstance(out.view_columns()["name"], pa.Array)
        assert sorted(out.to_polars()["name"].to_list()) == ["b", "c"]
    with StreamContext(workers=workers) as ctx:
        p = ctx.stream(pa.schema([("k", pa.int64()), ("name", pa.string())]))
        o = p.collect()
        p.push(pl.DataFrame({"k": [1], "name": ["x"]}))
        p.push({"k": np.array([2]), "name": ["y"]}, weights=[2])
        ctx.step()
        assert o.view_dict() == {(1, "x"): 1, (2, "y"): 2}


def test_a_dict_of_scalars_is_explained():
    with StreamContext() as ctx:
        s = ctx.stream(kv(), name="nums")
        with pytest.raises(InputError, match="to push one row, pass a list"):
            s.insert({"k": 1, "v": 2})


def test_polars_frame_is_read_as_a_table():
    # the old code iterated the frame's Series: "a row must be a tuple or a dict, got Series"
    with StreamContext() as ctx:
        s = ctx.stream(kv())
        out = s.collect()
        s.insert(pl.DataFrame({"k": [1], "v": [2]}))
        ctx.step()
        assert out.rows() == [(1, 2)]


# --- every newer type carried through map / filter / join / project / output --------------------

PAYLOAD = {
    "f32": (pa.float32(), [1.5, None, -2.25, 3.0]),
    "d64": (pa.date64(), [dt.date(2024, 1, 2), dt.date(1999, 12, 31), None, dt.date(2024, 1, 2)]),
    "t64": (pa.time64("us"), [dt.time(1, 2, 3), None, dt.time(23, 59), dt.time(0)]),
    "dic": (pa.dictionary(pa.int32(), pa.string()), ["x", "y", None, "x"]),
    "lst": (pa.list_(pa.int64()), [[1, 2], [], None, [3]]),
    "stc": (pa.struct([("a", pa.int64()), ("b", pa.string())]),
            [{"a": 1, "b": "p"}, None, {"a": None, "b": "q"}, {"a": 2, "b": None}]),
    "map": (pa.map_(pa.string(), pa.int64()), [[("u", 1)], None, [], [("v", 2), ("w", None)]]),
    "tz": (pa.timestamp("ms", tz="America/New_York"),
           [dt.datetime(2024, 3, 1, 9, tzinfo=ZoneInfo("America/New_York")), None,
            dt.datetime(2020, 1, 1, tzinfo=ZoneInfo("America/New_York")), None]),
}


def payload_table(k_offset=0):
    cols = {"k": pa.array([1 + k_offset, 2 + k_offset, 3 + k_offset, 4 + k_offset])}
    for name, (t, vals) in PAYLOAD.items():
        cols[name] = pa.array(vals, type=t)
    return pa.table(cols)


@pytest.mark.parametrize("runtime", ["threads", "processes"])
def test_payload_types_through_map_filter_join_output(workers, runtime):
    if runtime == "processes" and workers == 1:
        pytest.skip("one worker runs in-process")
    left = payload_table()
    right = pa.table({"k": [1, 2, 4, 5], "tag": ["one", "two", "four", "five"]})
    with StreamContext(workers=workers, runtime=runtime) as ctx:
        a = ctx.stream(pa.schema(left.schema), name="a")
        b = ctx.stream(right.schema, name="b")
        q = (a.filter(col("k") != 3)
              .with_columns(k2=col("k") * 10)
              .join(b, on="k")
              .select("k", "k2", "tag", *PAYLOAD))
        out = q.collect()
        a.push(left)
        b.push(right)
        ctx.step()
        view = out.view()
        for name, (t, _) in PAYLOAD.items():
            assert view.schema.field(name).type == t, name
        # the same query in plain Python over the rows
        lrows = left.to_pylist()
        tags = dict(zip(right.column("k").to_pylist(), right.column("tag").to_pylist()))
        want = {}
        for r in lrows:
            if r["k"] != 3 and r["k"] in tags:
                row = (r["k"], r["k"] * 10, tags[r["k"]]) + tuple(r[n] for n in PAYLOAD)
                want[_freeze(row)] = 1
        got = {_freeze(tuple(r[c] for c in ["k", "k2", "tag", *PAYLOAD])): w
               for r, w in zip(view.drop_columns(["__weight"]).to_pylist(),
                               view.column("__weight").to_pylist())}
        assert got == want
        # retract a row: its change carries the payload back out
        a.push(left.slice(0, 1), weights=[-1])
        ctx.step()
        d = out.delta()
        assert d.num_rows == 1 and d.column("__weight").to_pylist() == [-1]
        assert d.column("lst").to_pylist() == [[1, 2]]
        assert d.column("stc").to_pylist() == [{"a": 1, "b": "p"}]
        assert d.column("tz").type.tz == "America/New_York"
        assert len(out.view()) == len(want) - 1


def _freeze(v):
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _freeze(x)) for k, x in v.items())
    return v


def test_payload_rows_consolidate_by_value(workers):
    """Equal nested payloads cancel and add up like any other value."""
    t = pa.schema([("k", pa.int64()), ("l", pa.list_(pa.string())),
                   ("s", pa.struct([("x", pa.float32())]))])
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(t)
        out = s.map(lambda b: b, schema=t).collect()
        s.insert([(1, ["a", None], {"x": 1.5}), (1, ["a", None], {"x": 1.5}),
                  (1, ["a"], {"x": 1.5})])
        ctx.step()
        assert out.view_dict() == {(1, ("a", None), (("x", 1.5),)): 2,
                                   (1, ("a",), (("x", 1.5),)): 1}
        s.delete([(1, ["a", None], {"x": 1.5})])
        ctx.step()
        assert out.delta_dict() == {(1, ("a", None), (("x", 1.5),)): -1}


def test_unsupported_type_is_named():
    with StreamContext() as ctx:
        with pytest.raises(TypeError, match="column 'u'.*not supported"):
            ctx.stream(pa.schema([("u", pa.dense_union([pa.field("i", pa.int64())]))]))


def test_py_values_freezes_nested_values():
    arr = pa.array([[{"a": 1}], None], pa.list_(pa.struct([("a", pa.int64())])))
    assert py_values(arr) == [((("a", 1),),), None]

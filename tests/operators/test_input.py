"""Bad input: every refused push names the input, the column and the row, applies nothing, and
the circuit keeps working afterwards (1 and 2 workers)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import dbsp

T = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
               pa.field("price", pa.decimal128(9, 2))])

BAD = [
    # (what is pushed, weights, message pattern)
    ([(1, "a", 1), ("two", "b", 2)], None, r"input 'orders', column 'id', row 1: value 'two'"),
    ([(1, "a", 1), (None, "b", 2)], None, r"input 'orders', column 'id', row 1: null"),
    ([(1, "a", 1), (2, "b")], None, r"input 'orders', row 1: row has 2 values"),
    ([(1, "a", 1), 7], None, r"input 'orders', row 1: a row must be a tuple"),
    ([{"id": 1, "name": "a", "price": 1, "colour": "red"}], None,
     r"input 'orders', column 'colour', row 0: unknown column"),
    (pa.table({"id": [1], "name": ["a"]}), None, r"input 'orders', column 'price': missing"),
    (pa.table({"id": [1], "name": ["a"], "price": [1], "x": [0]}), None,
     r"input 'orders', column 'x': unknown column"),
    (pa.table({"id": [1, None], "name": ["a", "b"], "price": [1, 2]}), None,
     r"input 'orders', column 'id', row 1: null"),
    (pa.table({"id": ["1", "x"], "name": ["a", "b"], "price": [1, 2]}), None,
     r"input 'orders', column 'id', row 1: value 'x'"),
    ([(1, "a", 1), (2, "b", 2)], np.array([1.5, 1.0]), r"column '__weight'.*integers"),
    ([(1, "a", 1), (2, "b", 2)], np.array([1]), r"column '__weight'.*1 weights for 2 rows"),
    (pa.table({"id": [1], "name": ["a"], "price": pa.array([1], pa.decimal128(9, 2)),
               "__weight": pa.array([None], pa.int64())}),
     None, r"column '__weight', row 0: null"),
    ([(1, "a", 1)], "heavy", r"input 'orders', column '__weight'.*integer"),
    ([(1, "a", 1)], 2.5, r"input 'orders', column '__weight'.*integer"),
    (pa.table({"id": [1], "name": ["a"], "price": pa.array([10**12], pa.int64())}), None,
     r"input 'orders', column 'price', row 0: value 1000000000000.*decimal128\(9, 2\)"),
    # record batches of exactly the input's schema (taken as they are, see conform): Arrow
    # does not enforce a field's nullability, so a null in 'id' is still found and named
    (pa.record_batch([pa.array([1, None, 3]), pa.array(["a", "b", "c"]),
                      pa.array([1, 2, 3], pa.decimal128(9, 2))], schema=T), None,
     r"input 'orders', column 'id', row 1: null"),
    (pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"]),
                      pa.array([1, 2], pa.decimal128(9, 2))], schema=T), np.array([1]),
     r"column '__weight'.*1 weights for 2 rows"),
    # a one-batch table of exactly the schema (a piece read from a file) takes the same path
    (pa.Table.from_batches([pa.record_batch([pa.array([1, None]), pa.array(["a", "b"]),
                                             pa.array([1, 2], pa.decimal128(9, 2))],
                                            schema=T)]), None,
     r"input 'orders', column 'id', row 1: null"),
    (pa.record_batch([pa.array([1, 2]), pa.array(["a", "b"]),
                      pa.array([1, 2], pa.decimal128(9, 2))], schema=T), np.array([1.5, 1.0]),
     r"column '__weight'.*integers"),
]


@pytest.mark.parametrize("data,weights,pattern", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_push_is_refused_and_applies_nothing(workers, data, weights, pattern):
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("orders", T)
        out = t.index_by(["id"]).aggregate({"n": ("count", None)}).output()
        t.insert([(7, "ok", 1)])
        with pytest.raises((dbsp.InputError, ValueError, TypeError), match=pattern) as ei:
            t.push(data, weights)
        if isinstance(ei.value, dbsp.InputError):
            assert ei.value.input_name == "orders"
        assert t.pending_rows == 1
        c.step()
        assert out.to_dict() == {(7, 1): 1}
        t.insert([(8, None, None)])
        c.step()
        assert out.view_dict() == {(7, 1): 1, (8, 1): 1}


def test_a_batch_of_the_input_schema_is_taken_as_it_is(workers):
    """A record batch of exactly the input's schema (metadata included), or a table of one
    such batch, is queued without a copy or a per-column check beyond the nulls of its
    not-null columns; one whose schema differs only in metadata, or a table of several
    batches, takes the general path: the rows are the same."""
    rows = pa.record_batch([pa.array([1, 2, 2]), pa.array(["a", None, "b"]),
                            pa.array([1, 2, 3], pa.decimal128(9, 2))], schema=T)
    tagged = rows.replace_schema_metadata({"origin": "test"})
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("orders", T)
        out = t.index_by(["id"]).aggregate({"n": ("count", None)}).output()
        assert t.push(rows, np.array([1, 1, -1])) == 3
        assert t._pending[-1][0] is rows
        assert t.push(tagged) == 3
        assert t._pending[-1][0] is not tagged and t._pending[-1][0].schema.metadata is None
        assert t.push(pa.Table.from_batches([rows])) == 3
        assert t._pending[-1][0] is not rows and t._pending[-1][0].equals(rows)
        two = pa.Table.from_batches([rows.slice(0, 1), rows.slice(1)])
        assert t.push(two, np.array([1, -1, 1])) == 3
        c.step()
        assert out.view_dict() == {(1, 4): 1, (2, 4): 1}


def test_input_error_fields():
    c = dbsp.Circuit()
    t = c.add_input("orders", T)
    with pytest.raises(dbsp.InputError) as ei:
        t.insert([(1, "a", 1), (2, 3, 4), (None, "c", 5)])
    e = ei.value
    assert (e.input_name, e.column, e.row) == ("orders", "name", 1)  # columns convert in order
    with pytest.raises(dbsp.InputError) as ei:
        t.delete([(1, "a", "not a number")])
    assert (ei.value.column, ei.value.row) == ("price", 0)


def test_integers_convert_to_a_narrow_decimal_when_they_fit():
    with dbsp.Circuit() as c:
        t = c.add_input("orders", T)
        out = t.output()
        t.push(pa.table({"id": [1], "name": ["a"], "price": pa.array([12], pa.int64())}))
        c.step()
        import decimal
        assert out.to_dict() == {(1, "a", decimal.Decimal("12.00")): 1}


# -- conform_rows: the good rows of a push, and each bad one with its position ------------------

from hypothesis import given as _given  # noqa: E402
from hypothesis import strategies as _st  # noqa: E402

from dbsp.operators.input import conform_rows  # noqa: E402

_CR_SCHEMA = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("s", pa.string())])
_CR_ROW = _st.one_of(
    _st.tuples(_st.integers(-5, 5), _st.one_of(_st.none(), _st.text(max_size=3))).map(
        lambda r: (r, True)),
    _st.tuples(_st.none(), _st.text(max_size=3)).map(lambda r: (r, False)),       # null key
    _st.tuples(_st.just("x"), _st.text(max_size=3)).map(lambda r: (r, False)),    # bad type
)


@_given(_st.lists(_CR_ROW, max_size=40), _st.booleans())
def test_conform_rows_keeps_the_good_rows_and_names_each_bad_one(rows, as_table):
    data = [r for r, _ in rows]
    if as_table:  # a table cannot hold a str in an int column: keep only null keys as bad
        rows = [(r, ok) for r, ok in rows if ok or r[0] is None]
        data = pa.table({"k": pa.array([r[0] for r, _ in rows], pa.int64()),
                         "s": pa.array([r[1] for r, _ in rows], pa.string())})
    weights = np.arange(1, len(rows) + 1, dtype=np.int64)
    batch, w, bad = conform_rows("t", _CR_SCHEMA, data, weights)
    good = [(i, r) for i, (r, ok) in enumerate(rows) if ok]
    assert list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist())) == \
        [r for _, r in good]
    assert w.tolist() == [i + 1 for i, _ in good]
    assert [b.index for b in bad] == [i for i, (_, ok) in enumerate(rows) if not ok]
    for b in bad:
        assert f"row {b.index}" in b.reason and b.weight == b.index + 1
        assert b.column == "k"

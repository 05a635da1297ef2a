"""upsert: replace-by-key on inputs, against a dict model of the current rows, 1 and 2 workers."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbsp
from dbsp.testing import reference as ref

T = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()),
               pa.field("n", pa.int64())])


def test_upsert_replaces_by_key(workers):
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", T, key=["id"])
        out = t.output()
        assert t.upsert([(1, "a", 1), (2, "b", 2), (1, "c", 3)]) == 2  # the last row of 1 wins
        c.step()
        assert out.to_dict() == {(1, "c", 3): 1, (2, "b", 2): 1}
        t.upsert([(2, "b", 2), (3, None, None)])   # an unchanged row cancels out
        t.upsert([(1, "d", 4)])                     # two upserts in one step
        c.step()
        assert out.to_dict() == {(3, None, None): 1, (1, "c", 3): -1, (1, "d", 4): 1}
        t.delete([(1, "d", 4)])                     # ordinary pushes keep the key state
        t.insert([(5, "e", 5), (5, "e", 5)])        # weight 2
        c.step()
        t.upsert([(5, "f", 6)])
        c.step()
        assert out.to_dict() == {(5, "e", 5): -2, (5, "f", 6): 1}
        assert out.view_dict() == {(2, "b", 2): 1, (3, None, None): 1, (5, "f", 6): 1}


def test_upsert_key_given_per_call_and_multi_column():
    with dbsp.Circuit() as c:
        t = c.add_input("t", T)
        out = t.output()
        t.upsert([(1, "a", 1)], key=["id", "name"])
        t.upsert([(1, "a", 2), (1, "b", 3)])   # the key is remembered
        c.step()
        assert out.to_dict() == {(1, "a", 2): 1, (1, "b", 3): 1}
        with pytest.raises(ValueError, match=r"keyed by \['id', 'name'\], not \['id'\]"):
            t.upsert([(1, "a", 1)], key=["id"])


def test_upsert_errors_apply_nothing():
    with dbsp.Circuit() as c:
        plain = c.add_input("plain", T)
        plain.insert([(1, "a", 1)])
        with pytest.raises(ValueError, match="received rows before it had a key"):
            plain.upsert([(1, "b", 1)], key=["id"])
        with pytest.raises(ValueError, match="has no key"):
            plain.upsert([(1, "b", 1)])
        with pytest.raises(KeyError, match="no column 'nope'"):
            c.add_input("bad", T, key=["nope"])
        assert "bad" not in c.inputs
        t = c.add_input("t", T, key="id")
        out = t.output()
        t.upsert([(1, "a", 1)])
        with pytest.raises(dbsp.InputError, match=r"input 't', column 'id', row 1: null"):
            t.upsert([(2, "b", 2), (None, "c", 3)])
        with pytest.raises(dbsp.InputError, match="without weights"):
            t.upsert(pa.table({"id": [1], "name": ["x"], "n": [1], "__weight": [2]}))
        assert t.pending_rows == 1
        c.step()
        assert out.to_dict() == {(1, "a", 1): 1}
        t.upsert([(1, "z", 9)])
        c.step()
        assert out.to_dict() == {(1, "a", 1): -1, (1, "z", 9): 1}


@settings(max_examples=40)
@given(batches=st.lists(st.lists(st.tuples(st.integers(0, 4), st.sampled_from(["a", "b", None]),
                                           st.integers(0, 2)), max_size=6), max_size=5),
       step_every=st.integers(1, 3))
def test_upsert_random_matches_a_dict_model(workers, batches, step_every):
    model: dict = {}
    with dbsp.Circuit(workers=workers) as c:
        t = c.add_input("t", T, key=["id"])
        out = t.output()
        for i, b in enumerate(batches):
            t.upsert(b)
            for r in b:
                model[r[0]] = r
            if i % step_every == 0:
                c.step()
                assert out.view_dict() == ref.zset((r, 1) for r in model.values())
        c.step()
        assert out.view_dict() == ref.zset((r, 1) for r in model.values())

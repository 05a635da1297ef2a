"""The relational pieces of issue 11 item 11 against the naive reference, with 1 and 2 workers:
HAVING (an aggregate in a filter after agg), the cross join (``on=[]``), concat of columns whose
types widen (int32 + int64). Per-column top-k directions are in tests/operators/test_topk.py."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import _api_ref as R
from _api_harness import check_steps, steps_of
from dbsp.api import StreamContext, avg, col, count, sum_

KV = pa.schema([("k", pa.int64()), ("v", pa.int64())])
ROW_KV = st.tuples(st.integers(0, 3), st.none() | st.integers(-5, 5))
ROW_X = st.tuples(st.sampled_from(["a", "b", "c"]))


# --- HAVING ---------------------------------------------------------------------------------------

def _ref_having(z: dict) -> dict:
    g = R.group_agg(z, lambda r: (r[0],), [("count_all", None), ("sum", 1)])
    return {r: w for r, w in g.items() if r[1] > 1 and r[2] is not None and r[2] >= 0}


@settings(max_examples=25)
@given(steps=steps_of(ROW_KV, max_rows=5))
def test_having_matches_reference(workers, steps):
    def build(ctx, s):
        return (s.group_by("k").agg(n=count(), t=sum_("v"))
                 .filter((count() > 1) & (sum_("v") >= 0))
                 .collect())
    check_steps(workers, {"s": KV}, build, [{"s": d} for d in steps], _ref_having)


def test_having_is_filter_on_the_output_column(workers):
    with StreamContext(workers=workers) as ctx:
        s = ctx.stream(KV)
        a = s.group_by("k").agg(n=count(), m=avg("v")).filter(count() > 1).collect()
        b = s.group_by("k").agg(n=count(), m=avg("v")).filter(col("n") > 1).collect()
        c = s.group_by("k").agg(n=count()).select("k", twice=count() * 2).collect()
        s.insert([(1, 1), (1, 3), (2, 5), (3, 4), (3, 4)])
        ctx.step()
        assert a.rows() == b.rows() == [(1, 2, 2.0), (3, 2, 4.0)]
        assert c.rows() == [(1, 4), (2, 2), (3, 4)]


def test_having_errors_say_how_to_write_it():
    with StreamContext() as ctx:
        s = ctx.stream(KV)
        with pytest.raises(TypeError, match=r"not computed by the agg\(...\) before it "
                                            r"\(n=count\(\)\); add it there"):
            s.group_by("k").agg(n=count()).filter(sum_("v") > 1)
        with pytest.raises(TypeError, match=r"SQL HAVING.*agg\(n=count\(\)\)\.filter\(col\('n'\)"):
            s.filter(count() > 1)
        with pytest.raises(TypeError, match="is an aggregate"):
            s.select(x=col("v") + count())


# --- cross join ---------------------------------------------------------------------------------

X = pa.schema([("x", pa.string())])


def _ref_cross(how):
    def ref(a: dict, b: dict) -> dict:
        out: dict = {}
        bpos = sum(w for w in b.values()) > 0  # the one (empty) key of the right is present
        for ra, wa in a.items():
            if how == "inner":
                for rb, wb in b.items():
                    out[ra + rb] = out.get(ra + rb, 0) + wa * wb
            elif how == "semi" and bpos:
                out[ra] = out.get(ra, 0) + wa
            elif how == "anti" and not bpos:
                out[ra] = out.get(ra, 0) + wa
        return R.zset(out)
    return ref


@settings(max_examples=15)
@given(how=st.sampled_from(["inner", "semi", "anti"]), asteps=steps_of(ROW_KV, max_rows=5),
       bsteps=steps_of(ROW_X, max_rows=5))
def test_cross_join_matches_reference(workers, how, asteps, bsteps):
    n = max(len(asteps), len(bsteps))
    steps = [{"a": asteps[i] if i < len(asteps) else {},
              "b": bsteps[i] if i < len(bsteps) else {}} for i in range(n)]

    def build(ctx, a, b):
        return a.join(b, on=[], how=how).collect()
    check_steps(workers, {"a": KV, "b": X}, build, steps, _ref_cross(how))


def test_cross_join_left_and_names(workers):
    with StreamContext(workers=workers) as ctx:
        a = ctx.stream(KV)
        b = ctx.stream(pa.schema([("k", pa.int64())]))
        out = a.join(b, on=[], how="left").collect()
        a.insert([(1, 10), (2, 20)])
        ctx.step()
        assert out.schema.names == ["k", "v", "k_right"]
        assert out.rows() == [(1, 10, None), (2, 20, None)]
        b.insert([(7,)])
        ctx.step()
        assert out.rows() == [(1, 10, 7), (2, 20, 7)]


def test_a_join_without_keys_says_how_to_cross_join():
    with StreamContext() as ctx:
        a, b = ctx.stream(KV), ctx.stream(X)
        with pytest.raises(ValueError, match=r"for a cross join \(every pair\) pass on=\[\]"):
            a.join(b)


# --- concat widens like join ---------------------------------------------------------------------

def test_concat_widens_int32_and_int64(workers):
    with StreamContext(workers=workers) as ctx:
        a = ctx.stream(pa.schema([pa.field("k", pa.int32(), nullable=False),
                                  ("v", pa.int8())]))
        b = ctx.stream(pa.schema([pa.field("k", pa.int64(), nullable=False),
                                  ("v", pa.float32())]))
        c = a.concat(b)
        assert c.schema == pa.schema([pa.field("k", pa.int64(), nullable=False),
                                      ("v", pa.float64())])
        out = c.group_by("k").agg(t=sum_("v")).collect()
        a.insert([(1, 2), (5, None)])
        b.insert([(2 ** 40, 1.5), (1, 0.25)])
        ctx.step()
        assert out.rows() == [(1, 2.25), (5, None), (2 ** 40, 1.5)]


def test_concat_of_other_kinds_is_refused_with_a_hint():
    with StreamContext() as ctx:
        a = ctx.stream(pa.schema([("x", pa.int64())]))
        b = ctx.stream(pa.schema([("x", pa.string())]))
        with pytest.raises(TypeError, match=r"cast with with_columns\(x=col\('x'\)\.cast"):
            a.concat(b)
        c = ctx.stream(pa.schema([("y", pa.int64())]))
        with pytest.raises(TypeError, match="column names differ"):
            a.concat(c)


# --- a global aggregate beside an input dealt by key --------------------------------------------

@pytest.mark.parametrize("runtime", ["threads", "processes"])
def test_a_global_aggregate_beside_an_input_dealt_by_key(runtime):
    # the top-k by g makes the driver deal the input by g; the global count then swaps its
    # partials between worker processes with an empty key (a batch of no column)
    ctx = StreamContext(workers=2, runtime=runtime)
    s = ctx.stream({"g": pa.int64(), "b": pa.int64()}, name="s")
    top = s.group_by("g").topk(1, by="b").collect()
    n = s.group_by().agg(n=count(), t=sum_("b")).collect()
    s.insert([(1, 1), (1, 2), (1, 0), (2, 5)])
    ctx.step()
    assert top.view_dict() == {(1, 0): 1, (2, 5): 1}
    assert n.view_dict() == {(4, 8): 1}
    s.delete([(1, 0)])
    ctx.step()
    assert top.view_dict() == {(1, 1): 1, (2, 5): 1}
    assert n.view_dict() == {(3, 8): 1}
    ctx.close()

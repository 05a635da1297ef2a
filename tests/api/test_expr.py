"""Column expressions: literal cases for every function, build-time type errors that name the
column and the expression, and random expression trees against Python evaluation (with nulls)."""
from __future__ import annotations

import datetime as dt
import math

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.api import ColumnNotFoundError, coalesce, col, concat_str, lit, udf, when

S = pa.schema([("a", pa.int64()), ("b", pa.int32()), ("f", pa.float64()), ("s", pa.string()),
               ("ts", pa.timestamp("ms")), ("ok", pa.bool_()), ("d", pa.date32())])
BATCH = pa.record_batch([
    pa.array([7, -7, None, 0, 3]),
    pa.array([2, 2, 5, -3, None], pa.int32()),
    pa.array([1.5, -0.5, None, 4.0, 2.0]),
    pa.array(["Hello", "wOrld", None, "", "abc"]),
    pa.array([1_000, 2_500, None, 999, 61_000], pa.timestamp("ms")),
    pa.array([True, None, False, True, False]),
    pa.array([0, 1, None, 365, 2], pa.date32()),
], schema=S)


def ev(e):
    c = e.compile(S)
    out = c(BATCH)
    assert out.type == c.type, "the inferred type is the type produced"
    return out.to_pylist()


@pytest.mark.parametrize("expr, expected", [
    (col("a") + col("b"), [9, -5, None, -3, None]),
    (col("a") - 1, [6, -8, None, -1, 2]),
    (2 * col("a"), [14, -14, None, 0, 6]),
    (col("a") / col("b"), [3.5, -3.5, None, -0.0, None]),
    (col("a") // col("b"), [3, -4, None, 0, None]),
    (col("a") % col("b"), [1, 1, None, 0, None]),
    (col("f") // 0.25, [6.0, -2.0, None, 16.0, 8.0]),
    (col("f") % 1.0, [0.5, 0.5, None, 0.0, 0.0]),
    (-col("a"), [-7, 7, None, 0, -3]),
    (col("a").abs(), [7, 7, None, 0, 3]),
    (col("f").round(), [2.0, -0.0, None, 4.0, 2.0]),
    (col("a") > col("b"), [True, False, None, True, None]),
    (col("a") == 7, [True, False, None, False, False]),
    (col("a") != 7, [False, True, None, True, True]),
    (col("s") <= "b", [True, False, None, True, True]),
    (col("a").between(0, 5), [False, False, None, True, True]),
    (col("a").is_in([7, 0]), [True, False, None, True, False]),
    (col("ok") & (col("a") > 0), [True, False, False, False, False]),
    (col("ok") | (col("a") > 0), [True, None, None, True, True]),
    (~col("ok"), [False, None, True, False, True]),
    (col("a").is_null(), [False, False, True, False, False]),
    (col("a").is_not_null(), [True, True, False, True, True]),
    (col("a").fill_null(-1), [7, -7, -1, 0, 3]),
    (col("a").fill_null(0.5), [7.0, -7.0, 0.5, 0.0, 3.0]),
    (coalesce(col("b"), col("a"), 99), [2, 2, 5, -3, 3]),
    (col("a").cast("float64"), [7.0, -7.0, None, 0.0, 3.0]),
    (col("a").cast(pa.string()), ["7", "-7", None, "0", "3"]),
    (col("s").str.lower(), ["hello", "world", None, "", "abc"]),
    (col("s").str.upper(), ["HELLO", "WORLD", None, "", "ABC"]),
    (col("s").str.len(), [5, 5, None, 0, 3]),
    (col("s").str.contains("l"), [True, True, None, False, False]),
    (col("s").str.contains("^[a-z]", regex=True), [False, True, None, False, True]),
    (col("s").str.starts_with("He"), [True, False, None, False, False]),
    (col("s").str.ends_with("c"), [False, False, None, False, True]),
    (col("s").str.substr(1, 2), ["el", "Or", None, "", "bc"]),
    (col("s").str.substr(2), ["llo", "rld", None, "", "c"]),
    (col("s").str.replace("l", "L"), ["HeLLo", "wOrLd", None, "", "abc"]),
    (col("s").str.extract(r"([a-z])(l+)", 2), ["ll", "l", None, None, None]),
    (col("s").str.extract(r"o(.)?$", 1), [None, None, None, None, None]),
    (col("s").str.extract("[A-Z]"), ["H", "O", None, None, None]),
    (col("s").str.split_part("l", 1), ["", "d", None, None, None]),
    (col("s").str.split_part("l", 0), ["He", "wOr", None, "", "abc"]),
    (col("s").str.count("l"), [2, 1, None, 0, 0]),
    (col("ts").dt.strftime("%Y-%m-%d %H:%M"), ["1970-01-01 00:00", "1970-01-01 00:00", None,
                                                "1970-01-01 00:00", "1970-01-01 00:01"]),
    (col("d").dt.strftime("%Y-%m-%d"), ["1970-01-01", "1970-01-02", None, "1971-01-01",
                                        "1970-01-03"]),
    (col("s").str.concat("!", sep="-"), ["Hello-!", "wOrld-!", None, "-!", "abc-!"]),
    (concat_str(col("s"), col("a").cast("string")), ["Hello7", "wOrld-7", None, "0", "abc3"]),
    (when(col("a") > 0, "pos").when(col("a") < 0, "neg").otherwise("zero"),
     ["pos", "neg", "zero", "zero", "pos"]),
    (when(col("ok"), col("a")), [7, None, None, 0, None]),
    (when(col("ok"), col("a")).otherwise(col("f")), [7.0, -0.5, None, 0.0, 2.0]),
    (col("ts").dt.epoch_ms(), [1000, 2500, None, 999, 61000]),
    (col("ts").dt.floor(dt.timedelta(seconds=1)).dt.epoch_ms(), [1000, 2000, None, 0, 61000]),
    (col("ts").dt.second(), [1, 2, None, 0, 1]),
    (col("ts").dt.minute(), [0, 0, None, 0, 1]),
    (col("ts").dt.year(), [1970, 1970, None, 1970, 1970]),
    (col("d").dt.epoch_ms(), [0, 86_400_000, None, 365 * 86_400_000, 2 * 86_400_000]),
    (col("ts") >= "1970-01-01 00:00:01", [True, True, None, False, True]),
    ((col("ts") + dt.timedelta(seconds=1)).dt.epoch_ms(), [2000, 3500, None, 1999, 62000]),
    (lit(3) + lit(4), [7] * 5),
    (lit(None, "int64") + 1, [None] * 5),
    (udf(lambda x: pa.compute.multiply(x, 10), col("a"), type_="int64"),
     [70, -70, None, 0, 30]),
])
def test_expression_values(expr, expected):
    got = ev(expr)
    for g, w in zip(got, expected):
        if isinstance(w, float) and g is not None:
            assert math.isclose(g, w) or (g == w), (expr, got, expected)
        else:
            assert g == w, (expr, got, expected)


def test_types_are_inferred_at_build_time():
    assert col("a").compile(S).type == pa.int64()
    assert (col("b") + 1).compile(S).type == pa.int64()
    assert (col("b") // col("b")).compile(S).type == pa.int32()
    assert (col("a") / 2).compile(S).type == pa.float64()
    assert (col("a") > 1).compile(S).type == pa.bool_()
    assert col("s").str.len().compile(S).type == pa.int64()
    assert col("ts").dt.floor(dt.timedelta(minutes=1)).compile(S).type == pa.timestamp("ms")
    assert when(col("ok"), 1).otherwise(2.5).compile(S).type == pa.float64()


def test_names():
    assert (col("price") * 0.908).output_name() == "price"
    assert (col("price") * 2).alias("p2").output_name() == "p2"
    assert repr(col("price") * 0.908) == '(col("price") * 0.908)'
    assert repr(col("s").str.lower()) == 'col("s").str.lower()'


@pytest.mark.parametrize("expr, needles", [
    (col("pricee") * 2, ["pricee", 'col("pricee") * 2', "columns"]),
    (col("s") > 3, ['col("s")', "string", "(col(\"s\") > 3)"]),
    (col("s") + 1, ['col("s")', "arithmetic", "string"]),
    (col("s") * col("a"), ['col("s")', "string"]),
    (col("a") & col("ok"), ['col("a")', "boolean"]),
    (~col("a"), ['col("a")', "boolean"]),
    (-col("s"), ['col("s")', "numeric"]),
    (col("a").str.lower(), ['col("a")', "string"]),
    (when(col("a"), 1), ['col("a")', "not boolean"]),
    (when(col("ok"), 1).otherwise("x"), ["int64", "string"]),
    (col("ts") > "not a date", ['"not a date"', "timestamp"]),
    (col("ok").cast(pa.date32()), ['col("ok")', "date32"]),
    (col("a") // col("f").cast("decimal128(10,2)"), ["decimal"]),
    (col("s").dt.epoch_ms(), ['col("s")', "timestamp"]),
    (col("a").is_in(["x"]), ['col("a")', "int64"]),
    (coalesce(col("a"), col("s")), ["coalesce", "string"]),
])
def test_build_time_errors_name_the_column_and_expression(expr, needles):
    with pytest.raises((TypeError, KeyError)) as ei:
        expr.compile(S)
    msg = str(ei.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert repr(expr) in msg  # the whole expression


def test_unknown_column_is_a_key_error():
    with pytest.raises(ColumnNotFoundError) as ei:
        (col("nope") + 1).compile(S)
    assert isinstance(ei.value, KeyError)
    assert "'nope'" in str(ei.value)


def test_truth_value_is_refused():
    with pytest.raises(TypeError, match="& | ~"):
        bool(col("a") > 1)
    with pytest.raises(TypeError):
        (col("a") > 1) and (col("b") > 1)


def test_overflow_is_checked():
    c = (col("a") * (2 * 10**18)).compile(S)
    with pytest.raises(pa.ArrowInvalid, match="overflow"):
        c(BATCH)


# --- random trees against Python ---------------------------------------------------------------

RS = pa.schema([("i", pa.int64()), ("j", pa.int64()), ("x", pa.float64()), ("y", pa.float64()),
                ("s", pa.string()), ("t", pa.string()), ("p", pa.bool_())])
SMALL_INT = st.integers(-20, 20)
SMALL_FLOAT = st.floats(-100, 100, allow_nan=False, allow_infinity=False).map(lambda v: round(v, 2))
TEXT = st.text(alphabet="abcAB ", max_size=5)


def _n(f):
    """Lift ``f`` to propagate None."""
    def g(*a):
        return None if any(v is None for v in a) else f(*a)
    return g


def _div(a, b):  # a zero divisor raises ZeroDivisionError, as in the engine (ANSI SQL)
    return None if a is None or b is None else a / b


def _floordiv(a, b):
    return None if a is None or b is None else a // b


def _mod(a, b):
    return None if a is None or b is None else a % b


def _and(a, b):
    if a is False or b is False:
        return False
    if a is None or b is None:
        return None
    return True


def _or(a, b):
    if a is True or b is True:
        return True
    if a is None or b is None:
        return None
    return False


def _when(c, v, o):
    return v if c is True else o


@st.composite
def ints(draw, depth=3):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        kind = draw(st.sampled_from(["i", "j", "lit"]))
        if kind == "lit":
            v = draw(SMALL_INT)
            return lit(v), lambda r, v=v: v
        return col(kind), lambda r, k=kind: r[k]
    op = draw(st.sampled_from(["+", "-", "*", "//", "%", "neg", "abs", "len", "when",
                               "coalesce", "fill"]))
    if op in ("+", "-", "*", "//", "%"):
        (a, fa), (b, fb) = draw(ints(depth - 1)), draw(ints(depth - 1))
        if op == "*":  # keep products small enough for int64
            (b, fb) = draw(ints(0))
        e = {"+": a + b, "-": a - b, "*": a * b, "//": a // b, "%": a % b}[op]
        f = {"+": _n(lambda x, y: x + y), "-": _n(lambda x, y: x - y),
             "*": _n(lambda x, y: x * y), "//": _floordiv, "%": _mod}[op]
        return e, lambda r, fa=fa, fb=fb, f=f: f(fa(r), fb(r))
    if op == "neg":
        a, fa = draw(ints(depth - 1))
        return -a, lambda r: _n(lambda x: -x)(fa(r))
    if op == "abs":
        a, fa = draw(ints(depth - 1))
        return a.abs(), lambda r: _n(abs)(fa(r))
    if op == "len":
        a, fa = draw(strs(depth - 1))
        return a.str.len(), lambda r: _n(len)(fa(r))
    if op == "when":
        (c, fc), (a, fa), (b, fb) = draw(bools(depth - 1)), draw(ints(depth - 1)), \
            draw(ints(depth - 1))
        return when(c, a).otherwise(b), lambda r: _when(fc(r), fa(r), fb(r))
    (a, fa), (b, fb) = draw(ints(depth - 1)), draw(ints(depth - 1))
    if op == "coalesce":
        return coalesce(a, b), lambda r: fa(r) if fa(r) is not None else fb(r)
    v = draw(SMALL_INT)
    return a.fill_null(v), lambda r: fa(r) if fa(r) is not None else v


@st.composite
def floats(draw, depth=3):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        kind = draw(st.sampled_from(["x", "y", "lit", "int"]))
        if kind == "lit":
            v = draw(SMALL_FLOAT)
            return lit(v), lambda r, v=v: v
        if kind == "int":
            a, fa = draw(ints(0))
            return a.cast("float64"), lambda r: _n(float)(fa(r))
        return col(kind), lambda r, k=kind: r[k]
    op = draw(st.sampled_from(["+", "-", "/", "//", "%", "round", "mix"]))
    (a, fa), (b, fb) = draw(floats(depth - 1)), draw(floats(depth - 1))
    if op == "round":
        return a.round(), lambda r: _n(lambda x: float(round(x)))(fa(r))
    if op == "mix":  # int / int -> float
        (a, fa), (b, fb) = draw(ints(depth - 1)), draw(ints(depth - 1))
        return a / b, lambda r: _div(fa(r), fb(r))
    e = {"+": a + b, "-": a - b, "/": a / b, "//": a // b, "%": a % b}[op]
    f = {"+": _n(lambda x, y: x + y), "-": _n(lambda x, y: x - y), "/": _div,
         "//": _floordiv, "%": _mod}[op]
    return e, lambda r: f(fa(r), fb(r))


@st.composite
def strs(draw, depth=2):
    if depth == 0 or draw(st.integers(0, 2)) == 0:
        kind = draw(st.sampled_from(["s", "t", "lit"]))
        if kind == "lit":
            v = draw(TEXT)
            return lit(v), lambda r, v=v: v
        return col(kind), lambda r, k=kind: r[k]
    op = draw(st.sampled_from(["lower", "upper", "substr", "concat", "when"]))
    a, fa = draw(strs(depth - 1))
    if op == "lower":
        return a.str.lower(), lambda r: _n(str.lower)(fa(r))
    if op == "upper":
        return a.str.upper(), lambda r: _n(str.upper)(fa(r))
    if op == "substr":
        i, n = draw(st.integers(0, 3)), draw(st.integers(0, 3))
        return a.str.substr(i, n), lambda r: _n(lambda s: s[i:i + n])(fa(r))
    b, fb = draw(strs(depth - 1))
    if op == "concat":
        return a.str.concat(b), lambda r: _n(lambda x, y: x + y)(fa(r), fb(r))
    c, fc = draw(bools(depth - 1))
    return when(c, a).otherwise(b), lambda r: _when(fc(r), fa(r), fb(r))


@st.composite
def bools(draw, depth=2):
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return col("p"), lambda r: r["p"]
    op = draw(st.sampled_from(["cmp_i", "cmp_f", "cmp_s", "&", "|", "~", "is_null", "is_in",
                               "contains"]))
    cmps = {"<": lambda x, y: x < y, "<=": lambda x, y: x <= y, ">": lambda x, y: x > y,
            ">=": lambda x, y: x >= y, "==": lambda x, y: x == y, "!=": lambda x, y: x != y}
    if op.startswith("cmp"):
        gen = {"cmp_i": ints, "cmp_f": floats, "cmp_s": strs}[op]
        (a, fa), (b, fb) = draw(gen(depth - 1)), draw(gen(depth - 1))
        c = draw(st.sampled_from(sorted(cmps)))
        e = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b, "==": a == b, "!=": a != b}[c]
        return e, lambda r: _n(cmps[c])(fa(r), fb(r))
    if op in ("&", "|"):
        (a, fa), (b, fb) = draw(bools(depth - 1)), draw(bools(depth - 1))
        return (a & b, lambda r: _and(fa(r), fb(r))) if op == "&" else \
            (a | b, lambda r: _or(fa(r), fb(r)))
    if op == "~":
        a, fa = draw(bools(depth - 1))
        return ~a, lambda r: _n(lambda x: not x)(fa(r))
    if op == "is_null":
        a, fa = draw(ints(depth - 1))
        return a.is_null(), lambda r: fa(r) is None
    if op == "is_in":
        a, fa = draw(ints(depth - 1))
        vs = draw(st.lists(SMALL_INT, max_size=3))
        return a.is_in(vs), lambda r: _n(lambda x: x in vs)(fa(r))
    a, fa = draw(strs(depth - 1))
    pat = draw(st.text(alphabet="ab", min_size=1, max_size=2))
    return a.str.contains(pat), lambda r: _n(lambda s: pat in s)(fa(r))


def _nullable(s):
    return st.one_of(st.none(), s)


ROWS = st.lists(st.fixed_dictionaries({
    "i": _nullable(SMALL_INT), "j": _nullable(SMALL_INT), "x": _nullable(SMALL_FLOAT),
    "y": _nullable(SMALL_FLOAT), "s": _nullable(TEXT), "t": _nullable(TEXT),
    "p": _nullable(st.booleans())}), min_size=0, max_size=12)


def _same(g, w) -> bool:
    if g is None or w is None:
        return g is w
    if isinstance(w, float) or isinstance(g, float):
        return math.isclose(g, w, rel_tol=1e-9, abs_tol=1e-9)
    return g == w


@settings(max_examples=150)
@given(ROWS, st.one_of(ints(), floats(), strs(), bools()))
def test_random_expressions_match_python(rows, tree):
    expr, fn = tree
    batch = pa.RecordBatch.from_pylist(rows, schema=RS) if rows else \
        pa.RecordBatch.from_pylist([], schema=RS)
    try:
        c = expr.compile(RS)
    except ValueError as e:  # a divisor that is a constant 0: refused when built
        assert "division by zero" in str(e)
        return
    want = []
    for r in rows:
        try:
            want.append(fn(r))
        except ZeroDivisionError:
            with pytest.raises(ZeroDivisionError):
                c(batch)
            return
    got = c(batch).to_pylist()
    assert len(got) == len(rows)
    for r, g, w in zip(rows, got, want):
        assert _same(g, w), f"{expr!r} on {r}: engine {g!r}, python {w!r}"


def test_string_functions_check_arguments_when_built():
    with pytest.raises(ValueError, match="group"):
        col("s").str.extract("a", -1)
    with pytest.raises(ValueError, match="sep"):
        col("s").str.split_part("", 1)
    with pytest.raises(ValueError, match="index"):
        col("s").str.split_part("/", -1)
    with pytest.raises(TypeError, match="string"):
        col("a").str.extract("a").compile(S)
    with pytest.raises(TypeError, match="timestamp"):
        col("s").dt.strftime("%Y").compile(S)

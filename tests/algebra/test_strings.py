"""``dbsp.algebra.strings``: the vectorised kernels against Python's ``re`` and ``str.split``."""
from __future__ import annotations

import re

import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra import strings as S
from dbsp.algebra.strings import name_groups, regex_extract, split_part

PATTERNS = [r"(&|^)channel_id=([^&]*)", r"a(b)?c", r"(x+)(y*)", r"[(]a(\()?", r"(?:ab)+(c)",
            r"(?P<first>a)(b)", r"\d+"]
TEXT = st.text(alphabet="abcxy&=_()1 ", max_size=12)


def _py_extract(s, pattern, group):
    if s is None:
        return None
    m = re.search(pattern, s)
    return None if m is None else m.group(group)


@given(values=st.lists(st.one_of(st.none(), TEXT), max_size=20),
       pi=st.integers(0, len(PATTERNS) - 1), group=st.integers(0, 2))
@example(values=["ac", "abc", None], pi=1, group=1)  # an optional group left out: None, not ""
def test_regex_extract_matches_python_re(values, pi, group):
    pattern = PATTERNS[pi]
    groups = re.compile(pattern).groups
    if group > groups:
        with pytest.raises(ValueError, match="no group"):
            regex_extract(pa.array(values, pa.string()), pattern, group)
        return
    got = regex_extract(pa.array(values, pa.string()), pattern, group).to_pylist()
    assert got == [_py_extract(s, pattern, group) for s in values]


def test_name_groups_numbers_groups_like_python():
    for p in PATTERNS:
        named, names = name_groups(p)
        assert len(names) == re.compile(p).groups, p
        assert re.compile(named.replace("(?P<", "(?P<")).groups == len(names)
    assert name_groups(r"(?P<first>a)(b)")[1] == ["first", "_g2"]


def test_regex_extract_reports_bad_input():
    with pytest.raises(ValueError, match="group"):
        regex_extract(pa.array(["a"]), "a", -1)
    with pytest.raises(ValueError, match="invalid pattern"):
        regex_extract(pa.array(["a"]), "(a", 0)


def _py_split(s, sep, i):
    if s is None:
        return None
    parts = s.split(sep)
    return parts[i] if i < len(parts) else None


@given(values=st.lists(st.one_of(st.none(), st.text(alphabet="ab/-", max_size=10)), max_size=20),
       sep=st.sampled_from(["/", "-", "ab"]), index=st.integers(0, 4))
@example(values=["", "/", "a//b"], sep="/", index=1)
def test_split_part_matches_str_split(values, sep, index):
    got = split_part(pa.array(values, pa.string()), sep, index).to_pylist()
    assert got == [_py_split(s, sep, index) for s in values]


@given(values=st.lists(st.one_of(st.none(), st.text(alphabet="aé/-", max_size=12)),
                       max_size=25),
       sep=st.sampled_from(["/", "aa", "é", "a/"]), index=st.integers(0, 5),
       cut=st.tuples(st.integers(0, 3), st.integers(0, 3)))
@example(values=["aaa", "aaaa", "aaaaa"], sep="aa", index=1, cut=(0, 0))
def test_split_part_native_kernel_matches_arrow_and_str_split(values, sep, index, cut):
    """The native kernel (leftmost non-overlapping matches, on the buffers of a possibly sliced
    array with nulls) agrees with Arrow's split and with Python's ``str.split``."""
    assert S._native_strings is not None, "dbsp._native.strings is not built"
    a = pa.array(values, pa.string())
    lo, hi = min(cut[0], len(values)), max(len(values) - cut[1], min(cut[0], len(values)))
    a, values = a.slice(lo, hi - lo), values[lo:hi]
    want = [_py_split(s, sep, index) for s in values]
    assert S._split_part_native(a, sep.encode(), index).to_pylist() == want
    assert S._split_part_arrow(a, sep, index).to_pylist() == want


def test_split_part_on_sliced_and_empty_arrays():
    a = pa.array(["x/y", "p/q/r", "m"])[1:]
    assert split_part(a, "/", 2).to_pylist() == ["r", None]
    assert split_part(pa.array([], pa.string()), "/", 0).to_pylist() == []
    assert split_part(pa.array([None, None], pa.string()), "/", 0).to_pylist() == [None, None]
    with pytest.raises(ValueError, match="sep"):
        split_part(a, "", 0)

"""String functions of column expressions: the ``.str`` namespace and :func:`concat_str`.

``col("name").str.lower()``, ``.str.substr(0, 3)``, ``.str.contains("x")``... Each is a
:class:`~dbsp.api.expr.tree.Func` node over Arrow's UTF-8 kernels, checked at build time (its
operand must be a string, or null) and null where its operand is null (SQL). Positions and lengths
count characters (code points), 0-based like Python slicing: ``substr(start, length)`` is
``s[start:start + length]``.

>>> import pyarrow as pa
>>> from dbsp.api.expr import col
>>> e = concat_str(col("first").str.upper(), col("last"), sep=" ")
>>> e.compile(pa.schema([("first", pa.string()), ("last", pa.string())]))(
...     pa.record_batch({"first": ["ada", None], "last": ["L", "x"]})).to_pylist()
['ADA L', None]
"""
from __future__ import annotations

from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from ...algebra.dtypes import cast_value, is_null, is_string
from ...algebra.strings import name_groups, regex_extract
from ...algebra.strings import split_part as split_part_kernel
from .tree import Expr, Func, _as_array, _wrap, extension, need

_STR = need(is_string, "a string")


@extension("str")
class StrNamespace:
    """String functions (``col("s").str.…``); each needs a string operand."""

    def __init__(self, e: Expr):
        self._e = e

    def _f(self, name, impl, params=(), check=_STR, extra=()):
        return Func(f"str.{name}", [self._e, *extra], check, impl, params)

    def lower(self) -> Expr:
        return self._f("lower", lambda a, n: pc.utf8_lower(cast_value(a[0], pa.string())))

    def upper(self) -> Expr:
        return self._f("upper", lambda a, n: pc.utf8_upper(cast_value(a[0], pa.string())))

    def len(self) -> Expr:
        """Length in characters (int64)."""
        return self._f("len", lambda a, n: cast_value(
            pc.utf8_length(cast_value(a[0], pa.string())), pa.int64()))

    def contains(self, pattern: str, regex: bool = False) -> Expr:
        """True where the string contains ``pattern`` (literal; a regex with ``regex=True``)."""
        f = pc.match_substring_regex if regex else pc.match_substring
        return self._f("contains", lambda a, n: f(cast_value(a[0], pa.string()), pattern),
                       (pattern,))

    def starts_with(self, prefix: str) -> Expr:
        return self._f("starts_with",
                       lambda a, n: pc.starts_with(cast_value(a[0], pa.string()), prefix),
                       (prefix,))

    def ends_with(self, suffix: str) -> Expr:
        return self._f("ends_with",
                       lambda a, n: pc.ends_with(cast_value(a[0], pa.string()), suffix),
                       (suffix,))

    def substr(self, start: int, length: Optional[int] = None) -> Expr:
        """Characters ``start .. start+length`` (0-based, like ``s[start:start+length]``)."""
        if start < 0 or (length is not None and length < 0):
            raise ValueError("substr(start, length) needs start >= 0 and length >= 0")
        stop = None if length is None else start + length
        params = (start,) if length is None else (start, length)
        return self._f("substr", lambda a, n: pc.utf8_slice_codeunits(
            cast_value(a[0], pa.string()), start, stop), params)

    def replace(self, pattern: str, replacement: str) -> Expr:
        """Replace every occurrence of the literal ``pattern``."""
        return self._f("replace", lambda a, n: pc.replace_substring(
            cast_value(a[0], pa.string()), pattern, replacement), (pattern, replacement))

    def strip(self) -> Expr:
        return self._f("strip", lambda a, n: pc.utf8_trim_whitespace(
            cast_value(a[0], pa.string())))

    def extract(self, pattern: str, group: int = 0) -> Expr:
        """Capture group ``group`` (1-based; 0: the whole match) of the first match of the regex
        ``pattern`` (RE2 syntax); null where it does not match
        (:func:`dbsp.algebra.strings.regex_extract`)."""
        name_groups(pattern)  # bad arguments fail when the query is built
        if not isinstance(group, int) or group < 0:
            raise ValueError(f"str.extract: group must be an int >= 0, got {group!r}")
        return self._f("extract", lambda a, n: regex_extract(
            _as_array(a[0], n), pattern, group), (pattern, group))

    def split_part(self, sep: str, index: int) -> Expr:
        """Part ``index`` (0-based) of the string split on the literal ``sep``; null where the
        string has fewer parts (:func:`dbsp.algebra.strings.split_part`)."""
        if not isinstance(sep, str) or not sep:
            raise ValueError(f"str.split_part: sep must be a non-empty string, got {sep!r}")
        if not isinstance(index, int) or index < 0:
            raise ValueError(f"str.split_part: index must be an int >= 0, got {index!r}")
        return self._f("split_part", lambda a, n: split_part_kernel(
            _as_array(a[0], n), sep, index), (sep, index))

    def count(self, pattern: str) -> Expr:
        """Non-overlapping occurrences of the literal ``pattern`` (int64)."""
        return self._f("count", lambda a, n: cast_value(pc.count_substring(
            cast_value(a[0], pa.string()), pattern), pa.int64()), (pattern,))

    def concat(self, *others: Any, sep: str = "") -> Expr:
        """``self ++ sep ++ other ++ ...``; null if any part is null (SQL ``||``)."""
        return concat_str(self._e, *others, sep=sep)


def concat_str(*parts: Any, sep: str = "") -> Expr:
    """Concatenate string expressions (null if any part is null)."""
    es = [_wrap(p) for p in parts]

    def check(ts):
        for t in ts:
            if not (is_string(t) or is_null(t)):
                return "needs strings (cast other types with .cast('string'))"
        return pa.string()

    def impl(a, n):
        vals = [cast_value(v, pa.string()) for v in a]
        if all(isinstance(v, pa.Scalar) for v in vals):
            if not all(v.is_valid for v in vals):
                return pa.scalar(None, pa.string())
            return pa.scalar(sep.join(v.as_py() for v in vals), pa.string())
        return pc.binary_join_element_wise(*vals, sep)
    f = Func("concat_str", es, check, impl, method=False)
    if sep:
        f.fname = f"concat_str[sep={sep!r}]"
    return f


__all__ = ["StrNamespace", "concat_str"]

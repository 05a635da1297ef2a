"""Vectorised string kernels that Arrow compute does not offer directly.

Each takes a whole ``pyarrow`` string array and returns one; no Python runs per row. The column
expression API (``col("url").str.extract(...)``, ``.str.split_part(...)``) calls them.

* :func:`regex_extract` ``(a, pattern, group)`` -- the text of capture group ``group`` (1-based;
  0 is the whole match) of the first match of ``pattern`` in each string; **null** where the
  pattern does not match or the group took no part in the match. The pattern is RE2 syntax
  (Arrow's regex engine). Arrow's kernel needs *named* groups; this one numbers groups as
  Python's ``re`` does (every capturing group, named or not, by its opening parenthesis) and
  names the unnamed ones itself.
* :func:`split_part` ``(a, sep, index)`` -- the ``index``-th (0-based) part of each string split
  on the literal ``sep``; **null** where the string has no such part (or is null).

>>> import pyarrow as pa
>>> regex_extract(pa.array(["a=1&b=2", "b=3", None]), r"(&|^)b=([^&]*)", 2).to_pylist()
['2', '3', None]
>>> split_part(pa.array(["x/y/z", "x", None]), "/", 1).to_pylist()
['y', None, None]
"""
from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

try:  # the native kernel; the Arrow-compute path below stays the reference
    from dbsp._native import strings as _native_strings
except ImportError:  # pragma: no cover - a build without the extension
    _native_strings = None

__all__ = ["regex_extract", "split_part", "name_groups"]

_NAMED = re.compile(r"\(\?P?<([A-Za-z_][A-Za-z0-9_]*)>")


def name_groups(pattern: str) -> tuple[str, list[str]]:
    """``pattern`` with every unnamed capturing group named, and the names of all capturing
    groups in order (group ``i`` is ``names[i - 1]``).

    Escapes (``\\(``) and character classes (``[(]``) are skipped; ``(?:...)``, look-arounds and
    flags are not capturing; ``(?P<n>...)`` / ``(?<n>...)`` are (and keep their name).
    """
    out: list[str] = []
    names: list[str] = []
    taken = set(_NAMED.findall(pattern))
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
            out.append(ch)
            i += 1
            continue
        if ch == "[":
            in_class = True
            out.append(ch)
            i += 1
            # a ']' right after '[' or '[^' is a literal member of the class
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            if i < n and pattern[i] == "]":
                out.append("]")
                i += 1
            continue
        if ch == "(":
            m = _NAMED.match(pattern, i)
            if m:
                names.append(m.group(1))
                out.append(m.group(0))
                i = m.end()
                continue
            if pattern.startswith("(?", i):  # non-capturing, look-around or flags
                out.append(ch)
                i += 1
                continue
            k = len(names) + 1
            name = f"_g{k}"
            while name in taken:
                name = "_" + name
            taken.add(name)
            names.append(name)
            out.append(f"(?P<{name}>")
            i += 1
            continue
        out.append(ch)
        i += 1
    return "".join(out), names


def regex_extract(a: pa.Array, pattern: str, group: int = 0) -> pa.Array:
    """Capture group ``group`` of the first match of ``pattern`` (null where none)."""
    if not isinstance(group, (int, np.integer)) or group < 0:
        raise ValueError(f"regex_extract: group must be an int >= 0, got {group!r}")
    named, names = name_groups(f"({pattern})")  # group 0: the whole match, as group 1 here
    if group >= len(names):
        raise ValueError(f"regex_extract: pattern {pattern!r} has {len(names) - 1} capture "
                         f"group(s), no group {group}")
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if pa.types.is_null(a.type):
        return pa.nulls(len(a), pa.string())
    s = a.cast(pa.string()) if not pa.types.is_string(a.type) else a
    try:
        st = pc.extract_regex(s, named)
    except pa.ArrowInvalid as e:
        raise ValueError(f"regex_extract: invalid pattern {pattern!r}: {e}") from None
    # a non-matching row is a null struct; its fields are then nulls too once flattened
    field = pc.struct_field(st, [group])
    matched = pc.is_valid(st)
    if st.null_count:
        field = pc.if_else(matched, field, pa.scalar(None, pa.string()))
    # a group that did not take part in the match comes back as "": Python's re says None.
    # Tell the two apart by re-matching only where the group is empty (rare in practice).
    empty = pc.and_(matched, pc.equal(field, ""))
    if group > 0 and pc.any(empty).as_py():
        rx = re.compile(pattern)
        idx = np.flatnonzero(empty.to_numpy(zero_copy_only=False))
        vals = s.take(pa.array(idx)).to_pylist()
        fixed = []
        for v in vals:
            m = rx.search(v)
            fixed.append(None if m is None else m.group(group))
        mask = np.zeros(len(s), dtype=bool)
        mask[idx] = True
        repl = pa.array(fixed, pa.string())
        field = pc.replace_with_mask(field, pa.array(mask), repl)
    return field


def split_part(a: pa.Array, sep: str, index: int) -> pa.Array:
    """Part ``index`` (0-based) of each string split on the literal ``sep`` (null where none)."""
    if not isinstance(sep, str) or not sep:
        raise ValueError(f"split_part: sep must be a non-empty string, got {sep!r}")
    if not isinstance(index, (int, np.integer)) or index < 0:
        raise ValueError(f"split_part: index must be an int >= 0, got {index!r}")
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if pa.types.is_null(a.type):
        return pa.nulls(len(a), pa.string())
    s = a.cast(pa.string()) if not pa.types.is_string(a.type) else a
    if _native_strings is not None and len(s):
        return _split_part_native(s, sep.encode(), index)
    return _split_part_arrow(s, sep, index)


def _split_part_arrow(s: pa.Array, sep: str, index: int) -> pa.Array:
    """:func:`split_part` with Arrow compute (the reference of the native kernel)."""
    parts = pc.split_pattern(s, sep, max_splits=index + 1)  # the rest stays in one piece
    lengths = pc.fill_null(pc.list_value_length(parts), 0).to_numpy(zero_copy_only=False)
    has = lengths > index
    # positions of the wanted parts in the flattened values (rows without one: position 0)
    offsets = parts.offsets.to_numpy()[:-1] - parts.offsets[0].as_py()
    pos = np.where(has, offsets + index, 0)
    flat = parts.flatten()
    if len(flat) == 0:
        return pa.nulls(len(s), pa.string())
    taken = flat.take(pa.array(pos))
    return pc.if_else(pa.array(has), taken, pa.scalar(None, pa.string()))


def _split_part_native(s: pa.Array, sep: bytes, index: int) -> pa.Array:
    """:func:`split_part` by the native kernel, straight on the array's buffers."""
    n = len(s)
    bufs = s.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int32)[s.offset:s.offset + n + 1]
    valid = s.is_valid().to_numpy(zero_copy_only=False).view(np.uint8) if s.null_count \
        else None
    offsets, data, has = _native_strings.split_part(off, bufs[2], valid, sep, index)
    has = has.view(bool)
    nulls = int(n - np.count_nonzero(has))
    validity = pa.array(has).buffers()[1] if nulls else None
    typ = pa.string() if offsets.dtype == np.int32 else pa.large_string()
    out = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                null_count=nulls)
    return out if typ == pa.string() else out.cast(pa.string())

"""Schemas and input validation: turning what a user pushes into a typed Arrow batch, or a clear error.

A stream's rows have an Arrow schema. Everything a user pushes (a pyarrow Table / RecordBatch, a
pandas or Polars DataFrame, a dict of columns - numpy arrays, Arrow arrays, lists -, Python tuples
or dicts) is converted to one ``pa.RecordBatch`` of exactly that schema, or refused with
:class:`InputError` naming the input, the column and the row. Conversion happens before anything
is applied, so a refused push changes nothing.

Values are never changed silently: a float goes into an integer column only when it is a whole
number (``1.0``, not ``1.5``), whatever the input's form; a timestamp with a time zone goes only
into a column with a time zone (the instant is kept, shown in the column's zone), and a timestamp
without one only into a column without one.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable, Optional, Sequence

import numpy as np
import pyarrow as pa

from . import kernels as K
from .identity import IdentityCache

WEIGHT = "__weight"
"""Name of the weight column in every Arrow table the engine returns or accepts."""

SUPPORTED = (
    "int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 float32 float64 bool date32 "
    "date64 time32 time64 timestamp (with or without a time zone) duration decimal128 string "
    "large_string binary large_binary, dictionary of any of these, and list / large_list / "
    "fixed_size_list / struct / map of supported types"
)


class InputError(ValueError):
    """Pushed data does not fit an input's schema. Nothing of that push was applied."""

    def __init__(self, input_name: str, message: str, column: Optional[str] = None,
                 row: Optional[int] = None):
        self.input_name = input_name
        self.column = column
        self.row = row
        self.reason = message
        where = f"input '{input_name}'"
        if column is not None:
            where += f", column '{column}'"
        if row is not None:
            where += f", row {row}"
        super().__init__(f"{where}: {message}")


def _flat_supported(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_timestamp(t)
            or pa.types.is_decimal128(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_duration(t))


def type_supported(t: pa.DataType) -> bool:
    """Whether columns of type ``t`` can be carried (and coded: see :mod:`dbsp.algebra.codes`)."""
    if _flat_supported(t):
        return True
    if pa.types.is_dictionary(t):
        return pa.types.is_integer(t.index_type) and _flat_supported(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return type_supported(t.value_type)
    if pa.types.is_map(t):
        return type_supported(t.key_type) and type_supported(t.item_type)
    if pa.types.is_struct(t):
        return all(type_supported(t.field(i).type) for i in range(t.num_fields))
    return False


def check_type_supported(field: pa.Field) -> None:
    if not type_supported(field.type):
        raise TypeError(f"column '{field.name}' has type {field.type}, which is not supported "
                        f"(supported: {SUPPORTED})")


def as_schema(schema: Any) -> pa.Schema:
    """Accept a ``pa.Schema``, a list of ``(name, type)`` pairs or of fields, or a dict."""
    if isinstance(schema, pa.Schema):
        s = schema
    elif isinstance(schema, dict):
        s = pa.schema(list(schema.items()))
    else:
        s = pa.schema(list(schema))
    names = s.names
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate column names in schema: {dup}")
    if WEIGHT in names:
        raise ValueError(f"'{WEIGHT}' is reserved for weights and cannot be a column name")
    for f in s:
        check_type_supported(f)
    return s


def _first_bad_row_cast(name: str, col: str, arr: pa.Array, t: pa.DataType) -> InputError:
    for i in range(len(arr)):
        try:
            _cast(arr.slice(i, 1), t)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            return InputError(name, f"value {arr[i].as_py()!r} of type {arr.type} cannot be "
                                    f"converted to {t} ({e})", col, i)
    return InputError(name, f"type {arr.type} cannot be converted to {t}", col)


def _cast(arr: pa.Array, t: pa.DataType) -> pa.Array:
    """Safe cast; integers reach a narrow decimal through decimal128(38, scale), so that a
    value that fits is accepted and one that does not is refused (Arrow refuses int64 ->
    decimal128(9, 2) outright, for lack of precision, whatever the values)."""
    if pa.types.is_decimal(t) and pa.types.is_integer(arr.type):
        return arr.cast(pa.decimal128(38, t.scale), safe=True).cast(t, safe=True)
    return arr.cast(t, safe=True)


def _tz_error(name: str, col: str, src: pa.DataType, dst: pa.DataType,
              row: Optional[int] = None) -> InputError:
    if dst.tz is None:
        msg = (f"timestamps with time zone {src.tz} cannot go into a column without a time zone "
               f"({dst}): declare the column as timestamp('{dst.unit}', tz=...) to keep the zone, "
               f"or make the values naive first")
    else:
        msg = (f"timestamps without a time zone cannot go into a column with time zone {dst.tz} "
               f"({dst}): localize them first (the zone they are in is unknown)")
    return InputError(name, msg, col, row)


def _null_error(name: str, col: str, arr: pa.Array) -> InputError:
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
    row = int(np.argmin(valid))
    return InputError(name, "null in a column that is not nullable", col, row)


def exact_batch(data: Any, schema: pa.Schema) -> Optional[pa.RecordBatch]:
    """``data`` as the one batch it is when it is a batch, or a table of one batch (a piece
    read from a file), of exactly ``schema``; else None. Such a batch is taken as it is, once
    its columns declared not null are checked (Arrow does not enforce a field's nullability)."""
    if type(data) is pa.Table and data.schema.equals(schema, check_metadata=True):
        parts = data.to_batches()
        return parts[0] if len(parts) == 1 else None
    if type(data) is pa.RecordBatch and data.schema.equals(schema, check_metadata=True):
        return data
    return None


def null_column(schema: pa.Schema, batch: pa.RecordBatch) -> Optional[int]:
    """The first column of ``batch`` that ``schema`` declares not null and that holds a null
    (None: none does)."""
    for i, f in enumerate(schema):
        if not f.nullable and batch.column(i).null_count:
            return i
    return None


def conform(name: str, schema: pa.Schema, data: Any,
            weights: Any = None) -> tuple[pa.RecordBatch, np.ndarray]:
    """Convert pushed ``data`` (+ optional ``weights``) to ``(RecordBatch of schema, int64 weights)``.

    ``data`` may be a ``pa.Table`` / ``pa.RecordBatch`` (a ``__weight`` column in it gives the
    weights), a pandas ``DataFrame``, or an iterable of tuples / dicts. Raises :class:`InputError`.
    """
    exact = exact_batch(data, schema)
    if exact is not None:
        # the common push: a batch of exactly this schema, taken as it is once its columns
        # declared not null hold no null (Arrow does not enforce a field's nullability)
        i = null_column(schema, exact)
        if i is not None:
            raise _null_error(name, schema[i].name, exact.column(i))
        return exact, _weights(name, exact.num_rows, exact, weights)
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        table = data
    elif _is_pandas(data):
        try:
            table = pa.Table.from_pandas(data, preserve_index=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            # a column pandas holds as objects of mixed types: convert row by row, which names
            # the column and the row at fault
            table = _rows_to_table(name, schema, data.to_dict("records"))
    elif is_polars(data):
        table = from_polars(data)
    elif isinstance(data, dict):
        table = columns_to_table(name, data)
    else:
        table = _rows_to_table(name, schema, data)
    names = table.schema.names
    unknown = [c for c in names if c not in schema.names and c != WEIGHT]
    if unknown:
        raise InputError(name, f"unknown column (the input has columns {schema.names})",
                         unknown[0])
    missing = [c for c in schema.names if c not in names]
    if missing:
        raise InputError(name, "missing column", missing[0])
    n = table.num_rows
    cols = []
    for f in schema:
        arr = table.column(f.name)
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
        if arr.type != f.type:
            if pa.types.is_timestamp(arr.type) and pa.types.is_timestamp(f.type) \
                    and (arr.type.tz is None) != (f.type.tz is None):
                raise _tz_error(name, f.name, arr.type, f.type)
            try:
                arr = _cast(arr, f.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                raise _first_bad_row_cast(name, f.name, arr, f.type) from None
        if not f.nullable and arr.null_count:
            raise _null_error(name, f.name, arr)
        cols.append(arr)
    batch = pa.RecordBatch.from_arrays(cols, schema=schema)
    w = _weights(name, n, table, weights)
    return batch, w


def _weights(name: str, n: int, table, weights) -> np.ndarray:
    if weights is not None and WEIGHT in table.schema.names:
        raise InputError(name, f"weights given twice (argument and '{WEIGHT}' column)")
    if weights is None and WEIGHT in table.schema.names:
        weights = table.column(WEIGHT)
        if isinstance(weights, pa.ChunkedArray):
            weights = weights.combine_chunks()
        if weights.null_count:
            raise _null_error(name, WEIGHT, weights)
        weights = weights.to_numpy(zero_copy_only=False)
    if weights is None:
        return np.ones(n, dtype=np.int64)
    if np.isscalar(weights):
        if isinstance(weights, (bool, np.bool_)) or not isinstance(weights, (int, np.integer)):
            raise InputError(name, f"the weight must be an integer, got {weights!r}", WEIGHT)
        if not _I64_MIN <= int(weights) <= _I64_MAX:
            raise InputError(name, f"the weight {int(weights)} is out of the int64 range", WEIGHT)
        return np.full(n, int(weights), dtype=np.int64)
    try:
        w = np.asarray(weights)
    except (TypeError, ValueError) as e:
        raise InputError(name, f"weights are not an integer array ({e})", WEIGHT) from None
    if w.shape != (n,):
        raise InputError(name, f"{len(w)} weights for {n} rows", WEIGHT)
    if w.dtype == object and n and all(isinstance(x, int) and not isinstance(x, bool) for x in w):
        big = [i for i, x in enumerate(w) if not _I64_MIN <= x <= _I64_MAX]
        raise InputError(name, f"the weight {w[big[0]]} is out of the int64 range", WEIGHT,
                         big[0])
    if not np.issubdtype(w.dtype, np.integer):
        raise InputError(name, f"weights must be integers, got {w.dtype}", WEIGHT)
    if w.dtype == np.uint64 and n and int(w.max()) > _I64_MAX:
        i = int(np.argmax(w > _I64_MAX))
        raise InputError(name, f"the weight {int(w[i])} is out of the int64 range", WEIGHT, i)
    return w.astype(np.int64, copy=False)


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _is_pandas(data: Any) -> bool:
    mod = type(data).__module__
    return mod.startswith("pandas") and type(data).__name__ == "DataFrame"


def is_polars(data: Any) -> bool:
    """Whether ``data`` is a Polars DataFrame (without importing Polars)."""
    mod = type(data).__module__
    return mod.startswith("polars") and type(data).__name__ == "DataFrame"


def from_polars(df: Any) -> pa.Table:
    """A Polars DataFrame as an Arrow table: zero-copy where Polars' layout is Arrow's; string
    and binary *views* (Polars' own layout) become large_string / large_binary."""
    t = df.to_arrow()
    fields = []
    for f in t.schema:
        if pa.types.is_string_view(f.type):
            f = f.with_type(pa.large_string())
        elif pa.types.is_binary_view(f.type):
            f = f.with_type(pa.large_binary())
        fields.append(f)
    target = pa.schema(fields)
    return t if target == t.schema else t.cast(target)


def is_columns(data: Any) -> bool:
    """Whether ``data`` is a dict of columns (every value an array, Series or list)."""
    return isinstance(data, dict) and bool(data) and all(
        isinstance(v, (pa.Array, pa.ChunkedArray, np.ndarray, list))
        or type(v).__module__.startswith(("pandas", "polars")) for v in data.values())


def columns_to_table(name: str, data: dict) -> pa.Table:
    """A dict of columns (numpy / Arrow arrays, pandas / Polars Series, lists) as a table."""
    cols = {}
    n = None
    for c, v in data.items():
        if not isinstance(c, str):
            raise InputError(name, f"a dict of columns needs column names as keys, got {c!r}")
        if type(v).__module__.startswith("polars"):
            v = v.to_arrow()
        if isinstance(v, (pa.Array, pa.ChunkedArray)):
            arr = v
        elif isinstance(v, (np.ndarray, list, tuple)) or type(v).__module__.startswith("pandas"):
            try:
                arr = pa.array(v, from_pandas=type(v).__module__.startswith("pandas"))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise InputError(name, f"cannot read the column ({e})", c) from None
        else:
            raise InputError(name, f"a dict is read as columns (name -> array); the value is "
                                   f"a {type(v).__name__}, not an array (to push one row, pass "
                                   f"a list holding the dict)", c)
        if n is not None and len(arr) != n:
            raise InputError(name, f"column has {len(arr)} values, the columns before it "
                                   f"{n}", c)
        n = len(arr)
        cols[c] = arr
    return pa.table(cols)


def _exact_ints(name: str, col: str, vals: list) -> None:
    """Refuse a float that is not a whole number going into an integer column (Arrow would
    truncate it)."""
    for i, v in enumerate(vals):
        if isinstance(v, (float, np.floating)) and not float(v).is_integer():
            raise InputError(name, f"value {v!r} is not a whole number and the column is "
                                   f"an integer column", col, i)


def _same_tz_kind(name: str, col: str, t: pa.DataType, vals: list) -> None:
    """Refuse aware datetimes going into a naive column and naive ones into an aware column
    (Arrow would convert the first to UTC and read the second as UTC, silently)."""
    aware_col = t.tz is not None
    for i, v in enumerate(vals):
        if isinstance(v, _dt.datetime) and (v.tzinfo is not None) != aware_col:
            src = pa.timestamp(t.unit, tz=str(v.tzinfo)) if v.tzinfo is not None \
                else pa.timestamp(t.unit)
            raise _tz_error(name, col, src, t, i)


def row_list(name: str, rows: Any) -> list:
    """``rows`` (an iterable of rows) as a list, or an InputError naming the input and what
    it accepts."""
    try:
        return list(rows)
    except TypeError:
        raise InputError(name, f"cannot push a {type(rows).__name__}: push a pyarrow Table or "
                               f"RecordBatch, a pandas or Polars DataFrame, a dict of columns "
                               f"or a list of rows (tuples or dicts)") from None


def _rows_to_table(name: str, schema: pa.Schema, rows: Iterable) -> pa.Table:
    rows = row_list(name, rows)
    names = schema.names
    cols: list[list] = [[] for _ in names]
    for i, r in enumerate(rows):
        if isinstance(r, dict):
            extra = [k for k in r if k not in names and k != WEIGHT]
            if extra:
                raise InputError(name, f"unknown column (the input has columns {names})",
                                 extra[0], i)
            for j, c in enumerate(names):
                cols[j].append(r.get(c))
        else:
            if not isinstance(r, (tuple, list)):
                raise InputError(name, f"a row must be a tuple or a dict, got {type(r).__name__}",
                                 row=i)
            if len(r) != len(names):
                raise InputError(name, f"row has {len(r)} values, the input has {len(names)} "
                                       f"columns {names}", row=i)
            for j in range(len(names)):
                cols[j].append(r[j])
    arrays = []
    for f, vals in zip(schema, cols):
        if pa.types.is_integer(f.type):
            _exact_ints(name, f.name, vals)
        elif pa.types.is_timestamp(f.type):
            _same_tz_kind(name, f.name, f.type, vals)
        try:
            arrays.append(pa.array(vals, type=f.type, from_pandas=False))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            for i, v in enumerate(vals):
                try:
                    pa.array([v], type=f.type)
                except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError,
                        ValueError) as e:
                    raise InputError(name, f"value {v!r} does not fit type {f.type} ({e})",
                                     f.name, i) from None
            raise
    table = pa.Table.from_arrays(arrays, schema=schema)
    if rows and isinstance(rows[0], dict) and any(WEIGHT in r for r in rows):
        w = [r.get(WEIGHT, 1) for r in rows]
        table = table.append_column(WEIGHT, pa.array(w, pa.int64()))
    return table


def _frozen(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_frozen(x) for x in v)
    if isinstance(v, dict):
        return tuple((k, _frozen(x)) for k, x in v.items())
    return v


def py_values(arr: Any) -> list:
    """The Python values of a column, hashable: nested values (lists, structs, maps) become
    tuples (a struct ``{"a": 1}`` is ``(("a", 1),)``, a map the tuple of its ``(key, value)``
    pairs) so that rows holding them can key a dict."""
    vals = arr.to_pylist()
    t = arr.type
    if pa.types.is_nested(t):
        return [_frozen(v) for v in vals]
    return vals


def empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    """A record batch of ``schema`` with no rows. Cached per schema: batches never change, and
    building one costs an Arrow call per column (the empty steps of a circuit ask for many)."""
    b = _EMPTY_BY_ID.get(schema)  # (hashing the schema for _EMPTY costs more than the rest)
    if b is not None:
        return b
    b = _EMPTY.get(schema)
    if b is None:
        b = pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)
        if len(_EMPTY) >= 4096:
            _EMPTY.clear()
        _EMPTY[schema] = b
    return _EMPTY_BY_ID.put(schema, b)


#: ``schema -> empty record batch`` (see :func:`empty_batch`)
_EMPTY: dict = {}
#: the same, by the schema object (:mod:`~dbsp.algebra.identity`)
_EMPTY_BY_ID = IdentityCache()


#: largest take (rows out) done by :func:`take` natively on fixed-width columns: Arrow's take
#: costs tens of microseconds a call in dispatch and index conversion, which dominates a small
#: step; above this, Arrow's kernel (it releases the GIL) is used
SMALL_TAKE = 1 << 14

#: Arrow type ids of the fixed-width types :func:`fixed_columns` reads with numpy (one values
#: buffer, no children, no dictionary), and the unsigned numpy dtype of each byte width
_FIXED_IDS = frozenset(t.id for t in (
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
    pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.timestamp("s"), pa.date32(),
    pa.date64(), pa.time32("s"), pa.time64("us"), pa.duration("s")))
_UINT = {8: np.dtype(np.uint8), 16: np.dtype(np.uint16), 32: np.dtype(np.uint32),
         64: np.dtype(np.uint64)}


def take(batch: pa.RecordBatch, idx: np.ndarray) -> pa.RecordBatch:
    """Rows ``idx`` of a record batch. Small takes of fixed-width columns without nulls gather
    natively through the Arrow C data interface (:func:`~dbsp.algebra.kernels.take_batch`: no
    pyarrow object per column, the cost that dominated a hundred-row take); the rest is Arrow's
    multi-column take (it releases the GIL). ``idx``: row positions in ``0..num_rows-1`` (an
    engine-computed index; past the end raises IndexError)."""
    n = batch.num_rows
    m = len(idx)
    if m == n and n and K.is_identity(idx):
        return batch
    if 0 < m <= SMALL_TAKE and n and batch.num_columns:
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"take: row indices must be integers, got {idx.dtype}")
        out = K.take_batch(batch, idx)
        if out is not None:
            return out
    types = batch.schema.types
    if m > SMALL_TAKE and any(t.id in _VAR_OFFSETS for t in types) \
            and all(_gathered(t) for t in types):
        # strings: sized once and copied row by row, where Arrow's take grows its buffers
        idx = np.asarray(idx)
        if idx.dtype.kind not in "iu":
            raise TypeError(f"take: row indices must be integers, got {idx.dtype}")
        return _gather(batch.schema, [batch], idx.astype(np.int64, copy=False))
    return batch.take(pa.array(idx, type=pa.int64()))


def fixed_columns(batch: pa.RecordBatch) -> Optional[list]:
    """The columns of ``batch`` as zero-copy numpy views (unsigned ints of each column's width)
    when every column is a fixed-width type without nulls (see :func:`from_fixed_columns`),
    else None."""
    n = batch.num_rows
    out = []
    for col in batch.columns:
        if col.type.id not in _FIXED_IDS or col.null_count:
            return None
        dt = _UINT[col.type.bit_width]
        out.append(np.frombuffer(col.buffers()[1], dtype=dt, count=n,
                                 offset=col.offset * dt.itemsize))
    return out


def from_fixed_columns(schema: pa.Schema, cols: Sequence[np.ndarray]) -> pa.RecordBatch:
    """A record batch of ``schema`` over numpy arrays (as :func:`fixed_columns` gives them),
    zero-copy."""
    n = len(cols[0]) if len(cols) else 0
    arrays = [pa.Array.from_buffers(f.type, n, [None, pa.py_buffer(c)])
              for f, c in zip(schema, cols)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


#: Arrow type ids of the variable-length types :func:`take_batches` gathers natively, and the
#: dtype of their offsets
_VAR_OFFSETS = {pa.string().id: np.dtype(np.int32), pa.binary().id: np.dtype(np.int32),
                pa.large_string().id: np.dtype(np.int64), pa.large_binary().id: np.dtype(np.int64)}


#: Below this many input rows :func:`take_batches` concatenates its parts and takes (the
#: gather's set-up per part and column costs more than the copy): with a string or binary
#: column, and with fixed-width columns alone (whose gather is slower per row than the native
#: and Arrow takes of one batch: there it saves only memory, a few MB at this size). Measured by
#: ``bench/micro/bench_take_batches.py``: int64, float64 and string columns break even at about
#: 8K-10K rows (2 x 50 rows: 124 against 84 us; 2 x 10,000: 449 against 538); int64 and float64
#: alone are 1.2x slower gathered still at 2 x 50,000 (8x at 2 x 50).
CONCAT_TAKE_ROWS = 1 << 13
CONCAT_TAKE_FIXED_ROWS = 1 << 16


def concat_takes(schema: pa.Schema, rows: int) -> bool:
    """Whether :func:`take_batches` concatenates ``rows`` input rows of ``schema`` and takes,
    rather than gathering from the parts (see :data:`CONCAT_TAKE_ROWS`)."""
    var = any(t.id in _VAR_OFFSETS for t in schema.types)
    return rows < (CONCAT_TAKE_ROWS if var else CONCAT_TAKE_FIXED_ROWS)


def take_batches(schema: pa.Schema, parts: Sequence[pa.RecordBatch],
                 idx: np.ndarray) -> pa.RecordBatch:
    """``take(concat_batches(schema, parts), idx)`` without the concatenated copy: rows ``idx``
    (int64 positions in the concatenation of ``parts``, in any order) gathered from the parts
    column by column. Fixed-width columns go through :func:`~dbsp.algebra.kernels.take_runs`,
    string and binary columns (32- and 64-bit offsets) through
    :func:`~dbsp.algebra.kernels.take_var_runs`, their validity (when some part has nulls) as a
    byte mask through ``take_runs``; other types are concatenated and taken. A merge builds its
    output this way: its inputs and its output coexist, a concatenation of the inputs was a
    third copy of the data (and a third pass over the bytes of every string). Below
    :data:`CONCAT_TAKE_ROWS` input rows the parts are concatenated and taken instead: there the
    gather's set-up per part and column costs more than the copy it saves (see
    :func:`concat_takes`)."""
    parts = [p for p in parts if p.num_rows]
    idx = np.asarray(idx, dtype=np.int64)
    if not parts:
        if len(idx):
            raise IndexError(f"take: row index {idx[0]} out of range for 0 rows")
        return empty_batch(schema)
    if len(parts) == 1 or not len(schema) \
            or concat_takes(schema, sum(p.num_rows for p in parts)):
        # (no columns: only the row count to take)
        return take(concat_batches(schema, parts), idx)
    return _gather(schema, parts, idx)


def _gathered(t: pa.DataType) -> bool:
    """Whether :func:`_gather` gathers columns of type ``t`` natively."""
    return t.id in _FIXED_IDS or t.id in _VAR_OFFSETS


def _gather(schema: pa.Schema, parts: Sequence[pa.RecordBatch], idx: np.ndarray
            ) -> pa.RecordBatch:
    """Rows ``idx`` of the concatenation of the non-empty ``parts`` (see :func:`take_batches`)."""
    m = len(idx)
    cols = []
    for j, f in enumerate(schema):
        arrs = [p.column(j) for p in parts]
        tid = f.type.id
        odt = _VAR_OFFSETS.get(tid)
        if tid not in _FIXED_IDS and odt is None:
            cols.append(pa.concat_arrays(arrs).take(pa.array(idx, type=pa.int64())))
            continue
        if odt is None:
            dt = _UINT[f.type.bit_width]
            vals = K.take_runs([np.frombuffer(a.buffers()[1], dtype=dt, count=len(a),
                                              offset=a.offset * dt.itemsize) for a in arrs], idx)
            bufs = [pa.py_buffer(vals)]
        else:
            runs = []
            for a in arrs:
                b = a.buffers()
                runs.append((np.frombuffer(b[1], dtype=odt, count=len(a) + 1,
                                           offset=a.offset * odt.itemsize),
                             np.frombuffer(b[2], dtype=np.uint8) if b[2] is not None
                             else np.zeros(0, np.uint8)))
            offs, data = K.take_var_runs(runs, idx)
            bufs = [pa.py_buffer(offs), pa.py_buffer(data)]
        validity, nulls = None, 0
        if any(a.null_count for a in arrs):
            valid = K.take_runs([np.asarray(a.is_valid()).view(np.uint8) for a in arrs], idx)
            nulls = m - int(np.count_nonzero(valid))
            if nulls:
                validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
        cols.append(pa.Array.from_buffers(f.type, m, [validity] + bufs, null_count=nulls))
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def concat_batches(schema: pa.Schema, parts: Sequence[pa.RecordBatch]) -> pa.RecordBatch:
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return empty_batch(schema)
    if len(parts) == 1:
        return parts[0]
    return pa.concat_batches(parts)


def select(batch: pa.RecordBatch, names: Sequence[str]) -> pa.RecordBatch:
    return batch.select(list(names))


def filter_batch(batch: pa.RecordBatch, mask) -> pa.RecordBatch:
    return batch.filter(mask if isinstance(mask, pa.Array) else pa.array(mask, pa.bool_()))


__all__ = ["WEIGHT", "InputError", "as_schema", "conform", "exact_batch", "null_column",
           "is_polars", "from_polars", "is_columns", "columns_to_table", "type_supported",
           "py_values", "empty_batch", "take", "concat_batches", "take_batches", "select",
           "filter_batch", "check_type_supported"]

"""Column expressions: vectorised, typed at build time, evaluated with ``pyarrow.compute``.

``col("price") * 0.908``, ``when(col("qty") > 10, "bulk").otherwise("retail")``,
``col("name").str.lower()``, ``col("ts").dt.floor(timedelta(minutes=1))``, ``sum_("price")``.
An expression is bound to a stream's schema when the pipeline is built (unknown columns and type
errors are raised then, naming the expression) and runs as Arrow kernels over whole columns.

The package, by concern (each module imports only those above it in this list):

* :mod:`.tree`: the expression nodes, their binding and semantics (nulls, arithmetic, division,
  literals, casts), the constructors ``col``, ``lit``, ``when``, ``coalesce``, ``try_divide``, ``udf``;
* :mod:`.strings`: the ``.str`` namespace and ``concat_str``;
* :mod:`.datetime`: the ``.dt`` namespace;
* :mod:`.aggregates`: :class:`AggExpr` and ``count``, ``sum_``, ``avg``, ``min_``, ``max_``...

The type system they check against is :mod:`dbsp.algebra.dtypes` and the event-time helpers
:mod:`dbsp.algebra.time`; both names are re-exported here as before (``common_type``,
``duration_to_units``, ``physical_int``, ``from_physical``, ``is_time_type``).

>>> import pyarrow as pa
>>> e = (col("price") * 2 + 1).alias("p2")
>>> c = e.compile(pa.schema([("price", pa.int64())]))
>>> c.type, c(pa.record_batch({"price": [1, None, 3]})).to_pylist()
(DataType(int64), [3, None, 7])
"""
from ...algebra.dtypes import common_type
from ...algebra.time import duration_to_units, from_physical, is_time_type, physical_int
from .aggregates import AGG_KINDS, AggExpr, avg, count, count_distinct, max_, mean, min_, sum_
from .datetime import DtNamespace
from .strings import StrNamespace, concat_str
from .tree import (Alias, Arith, Cast, Coalesce, Col, ColumnNotFoundError, Compare, Compiled,
                   EvalFn, Expr, Func, IsIn, Lit, Logic, Unary, Value, When, coalesce, col, lit,
                   try_divide, udf, when)

__all__ = ["Expr", "Col", "Lit", "When", "AggExpr", "Compiled", "ColumnNotFoundError", "col", "lit",
           "when", "coalesce", "try_divide", "concat_str", "udf", "count", "sum_", "avg", "mean", "min_", "max_",
           "count_distinct", "common_type", "duration_to_units", "physical_int", "from_physical",
           "is_time_type", "Arith", "Compare", "Logic", "Unary", "Func", "Alias", "Cast", "IsIn",
           "Coalesce", "StrNamespace", "DtNamespace", "AGG_KINDS", "Value", "EvalFn"]

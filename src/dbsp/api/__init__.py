"""The fluent stream API: a :class:`StreamContext`, column expressions, windows and sinks.

>>> import pyarrow as pa
>>> from datetime import timedelta
>>> from dbsp.api import StreamContext, col, count, sum_, tumbling
>>> ctx = StreamContext(workers=2)
>>> bids = ctx.stream(pa.table({"auction": [1, 1, 2],
...                             "price": [10, 20, 5],
...                             "ts": pa.array([0, 1500, 2500], pa.timestamp("ms"))}),
...                   name="bids", time="ts", lateness=timedelta(seconds=1))
>>> per_window = (bids.with_columns(euro=col("price") * 0.908)
...                   .window(tumbling(timedelta(seconds=2)))
...                   .agg(n=count(), total=sum_("euro"))
...                   .collect())
>>> _ = ctx.execute()
>>> [(r[0].second, r[1].second, r[2]) for r in per_window.rows()]
[(0, 2, 2), (2, 4, 1)]

Modules: :mod:`~dbsp.api.expr` (expressions), :mod:`~dbsp.api.context` (the context, sources
steps and reports), :mod:`~dbsp.api.stream` (the stream methods), :mod:`~dbsp.api.source`
(batching modes), :mod:`~dbsp.api.sink` (collect / for_each). Windows and lateness are
implemented by :mod:`dbsp.operators.window`, :mod:`dbsp.operators.rolling` and
:mod:`dbsp.operators.watermark`.
"""
from ..operators.aggregate import Aggregator
from ..operators.window import hopping, session, tumbling
from .context import SourceStream, StreamContext
from .expr import (AggExpr, ColumnNotFoundError, Expr, avg, coalesce, col, concat_str, count,
                   count_distinct, lit, max_, mean, min_, sum_, try_divide, udf, when)
from .sink import Collector
from .source import AdaptiveBatching, FixedBatching, no_batching
from .stream import DataStream, GroupedStream, RollingStream, WindowedStream

__all__ = ["StreamContext", "SourceStream", "DataStream", "GroupedStream", "WindowedStream",
           "RollingStream", "Collector", "Expr", "AggExpr", "ColumnNotFoundError", "col", "lit",
           "when", "coalesce", "try_divide", "concat_str", "udf", "count", "sum_", "avg", "mean", "min_",
           "max_", "count_distinct", "tumbling", "hopping", "session", "FixedBatching",
           "AdaptiveBatching", "no_batching", "Aggregator"]

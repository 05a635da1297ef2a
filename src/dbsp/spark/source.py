"""A Spark Structured Streaming source of a pipeline's output: ``spark.readStream.format("dbsp")``.

A Spark 4 Python data source (:mod:`pyspark.sql.datasource`) over the output log of a durable
pipeline (:mod:`dbsp.ft.logs`, ``<storage>/ft/output``): its *offsets are steps*
(``{"step": n}``: every step below ``n`` was read), so a micro-batch is the changes of the steps
logged since the last one, each row with its ``__weight`` and ``__step``. The log holds every
step once (000's output rules: re-produced output after a recovery is discarded, not
appended), so a query that commits its offsets reads each change exactly once.

Use::

    dbsp.spark.source.register(spark)
    df = (spark.readStream.format("dbsp")
          .option("path", storage_dir)      # the pipeline's storage (or its ft/output directory)
          .option("output", "ids")          # the view
          .load())

Options: ``path`` and ``output`` (required); ``startingStep`` (default: the first step in the
log); ``maxStepsPerTrigger`` (default: all available). The schema is the view's columns plus
``__weight`` and ``__step``, read from the first record that holds the view; give it with
``.schema(...)`` when the log holds none yet. Reading is read-only: the log is never changed.
Records are read on the executors (one partition per run of up to 64 steps) as Arrow batches,
never row by row; they must see the directory.
"""
from __future__ import annotations

import os
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import ReadAllAvailable
from pyspark.sql.types import StructType

from ..ft.logs import STEP, WEIGHT, output_steps, read_output

__all__ = ["DbspSource", "register", "STEPS_PER_PARTITION"]

STEPS_PER_PARTITION = 64


def _log_dir(path: str) -> str:
    d = os.path.join(path, "ft", "output")
    return d if os.path.isdir(d) else path


class _Steps(InputPartition):
    def __init__(self, lo: int, hi: int):
        super().__init__((lo, hi))
        self.lo, self.hi = lo, hi


class DbspSource(DataSource):
    """The ``dbsp`` format (see the module doc)."""

    @classmethod
    def name(cls) -> str:
        return "dbsp"

    def _opts(self) -> tuple[str, str]:
        path, view = self.options.get("path"), self.options.get("output")
        if not path or not view:
            raise ValueError("the dbsp source needs .option('path', <the pipeline's storage "
                             "directory>) and .option('output', <a view name>)")
        d = _log_dir(path)
        if not os.path.isdir(d):
            raise ValueError(f"dbsp source: {path} holds no output log (no {d})")
        return d, view

    def schema(self) -> StructType:
        d, view = self._opts()
        first, end = output_steps(d)
        for s in range(first, end):
            t = read_output(d, s).get(view)
            if t is not None:
                return from_arrow_schema(t.schema)
        raise ValueError(f"dbsp source: the output log {d} holds no rows of {view!r} yet, so "
                         f"its schema is unknown: give it with .schema(...) (the view's columns, "
                         f"then {WEIGHT} long, {STEP} long)")

    def streamReader(self, schema: StructType) -> "DbspStreamReader":
        d, view = self._opts()
        return DbspStreamReader(d, view, self.options)


class DbspStreamReader(DataSourceStreamReader):
    """Offsets ``{"step": n}``; a micro-batch reads the records of steps ``[start, end)``."""

    def __init__(self, directory: str, view: str, options):
        self.dir = directory
        self.view = view
        start = options.get("startingStep")
        self.start = int(start) if start is not None else None
        m = options.get("maxStepsPerTrigger")
        self.max_steps = int(m) if m is not None else None
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"maxStepsPerTrigger must be >= 1, got {m}")

    def initialOffset(self) -> dict:
        if self.start is not None:
            return {"step": self.start}
        return {"step": output_steps(self.dir)[0]}

    def latestOffset(self, start: dict, limit) -> dict:
        end = output_steps(self.dir)[1]
        lo = int(start["step"])
        end = max(end, lo)
        if self.max_steps is not None and not isinstance(limit, ReadAllAvailable):
            end = min(end, lo + self.max_steps)
        return {"step": end}

    def partitions(self, start: dict, end: dict) -> list:
        lo, hi = int(start["step"]), int(end["step"])
        return [_Steps(a, min(a + STEPS_PER_PARTITION, hi))
                for a in range(lo, hi, STEPS_PER_PARTITION)]

    def read(self, partition: _Steps) -> Iterator[pa.RecordBatch]:
        for s in range(partition.lo, partition.hi):
            t = read_output(self.dir, s).get(self.view)
            if t is not None and t.num_rows:
                yield from t.to_batches()

    def commit(self, end: dict) -> None:
        """Nothing to release: the log belongs to the pipeline."""


def register(spark) -> None:
    """Register the ``dbsp`` format with ``spark``'s data sources."""
    spark.dataSource.register(DbspSource)

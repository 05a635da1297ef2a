"""File connectors: a stream's changes written as Parquet files in a directory.

:class:`ParquetSink` is given each step's change of a stream (a table of rows plus the weight
column :data:`dbsp.WEIGHT`, as :meth:`dbsp.api.DataStream.for_each` delivers it) and writes it as
Parquet files under one directory, optionally Hive-partitioned by some of its columns
(``dt=2015-07-15/hm=10:05/part-00000003-0.parquet``); the partitioning itself is pyarrow's
(:func:`pyarrow.parquet.write_to_dataset`).

Meaning of the files: the directory holds a Z-set. Every row carries its weight, so a stream
that retracts rows writes the retraction (weight ``-1``) into a later file; the sum of all files
(:meth:`ParquetSink.read`, consolidated) is the stream's integrated view. For an insert-only
stream (Nexmark q10) every weight is ``+1`` and the files are simply its rows.

A step's change may come unconsolidated (a row more than once, weights summing to its change,
as :meth:`~dbsp.api.DataStream.write_parquet` passes it to save sorting): the directory is a
Z-set either way. Files of one step share a sequence number in their name (``part-<step:08d>-<i>.parquet``), so
the files a step wrote are recognisable and listing order is step order. A file is written
whole by pyarrow before the next step; a crash can leave the step being written partial (this
sink is not exactly-once: that needs the output log of :mod:`dbsp.ft`).

>>> import tempfile, pyarrow as pa, dbsp
>>> d = tempfile.mkdtemp()
>>> sink = ParquetSink(d, pa.schema([("k", pa.string()), ("x", pa.int64())]), partition_by=["k"])
>>> sink.write(pa.table({"k": ["a", "b"], "x": [1, 2], dbsp.WEIGHT: [1, 1]}))
>>> sink.write(pa.table({"k": ["a"], "x": [1], dbsp.WEIGHT: [-1]}))
>>> sink.read().sort_by("k").to_pylist()
[{'k': 'b', 'x': 2, '__weight': 1}]
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ..algebra.schema import WEIGHT

__all__ = ["ParquetSink"]


class ParquetSink:
    """Writes Z-set changes over ``schema`` as Parquet files under ``path``.

    ``partition_by``: columns whose values name sub-directories (Hive style ``col=value``);
    they must be columns of ``schema``. ``path`` is created if missing; with ``overwrite=False``
    (the default) it must be empty, so that files of an earlier run are never mistaken for this
    run's output.
    """

    def __init__(self, path: str | os.PathLike, schema: pa.Schema,
                 partition_by: Sequence[str] = (), *, overwrite: bool = False,
                 compression: str = "snappy"):
        self.path = os.fspath(path)
        self.schema = schema
        self.partition_by = list(partition_by)
        missing = [c for c in self.partition_by if c not in schema.names]
        if missing:
            raise ValueError(f"ParquetSink({self.path!r}): partition columns {missing} are not "
                             f"columns of the stream (columns: {schema.names})")
        if WEIGHT in schema.names:
            raise ValueError(f"ParquetSink({self.path!r}): the stream has a column named "
                             f"{WEIGHT!r}, which the sink uses for weights")
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ValueError(f"ParquetSink: {self.path!r} exists and is not a directory")
        os.makedirs(self.path, exist_ok=True)
        if not overwrite and os.listdir(self.path):
            raise ValueError(f"ParquetSink: directory {self.path!r} is not empty (pass "
                             f"overwrite=True to add to it)")
        self.compression = compression
        self._file_schema = pa.schema(list(schema) + [pa.field(WEIGHT, pa.int64(), False)])
        self.steps_written = 0
        self.rows_written = 0

    def __repr__(self) -> str:
        return (f"ParquetSink({self.path!r}, partition_by={self.partition_by}, "
                f"{self.rows_written} rows in {self.steps_written} steps)")

    def write(self, delta: pa.Table | pa.RecordBatch) -> None:
        """Write one step's change: the columns of ``schema`` plus :data:`dbsp.WEIGHT`."""
        if isinstance(delta, pa.RecordBatch):
            delta = pa.Table.from_batches([delta])
        names = self._file_schema.names
        if sorted(delta.column_names) != sorted(names):
            raise ValueError(f"ParquetSink({self.path!r}): a change has columns "
                             f"{delta.column_names}, expected {names}")
        delta = delta.select(names).cast(self._file_schema)
        seq = self.steps_written
        self.steps_written += 1
        if delta.num_rows == 0:
            return
        pq.write_to_dataset(delta, self.path, partition_cols=self.partition_by or None,
                            basename_template=f"part-{seq:08d}-{{i}}.parquet",
                            existing_data_behavior="overwrite_or_ignore",
                            compression=self.compression)
        self.rows_written += delta.num_rows

    __call__ = write

    def read(self, consolidate: bool = True) -> pa.Table:
        """Every row written so far with its weight, in ``schema`` ++ :data:`dbsp.WEIGHT`.

        With ``consolidate`` equal rows are summed and rows of weight 0 dropped (the view);
        otherwise the rows come back file by file as written."""
        return read_parquet_zset(self.path, self.schema, self.partition_by,
                                 consolidate=consolidate)


def read_parquet_zset(path: str, schema: pa.Schema, partition_by: Sequence[str] = (),
                      *, consolidate: bool = True) -> pa.Table:
    """Read a directory written by :class:`ParquetSink` back as one table with weights."""
    file_schema = pa.schema(list(schema) + [pa.field(WEIGHT, pa.int64())])
    part: Optional[ds.Partitioning] = None
    if partition_by:
        part = ds.partitioning(pa.schema([schema.field(c) for c in partition_by]),
                               flavor="hive")
    dataset = ds.dataset(path, format="parquet", partitioning=part, schema=file_schema)
    table = dataset.to_table().select(file_schema.names).cast(file_schema)
    if not consolidate or table.num_rows == 0:
        return table
    names = list(schema.names)
    g = table.group_by(names, use_threads=False).aggregate([(WEIGHT, "sum")])
    g = g.rename_columns(names + [WEIGHT])
    g = g.filter(pc.not_equal(g.column(WEIGHT), 0))
    w = np.asarray(g.column(WEIGHT).to_numpy(), dtype=np.int64)
    return g.set_column(len(names), WEIGHT, pa.array(w)).cast(file_schema)

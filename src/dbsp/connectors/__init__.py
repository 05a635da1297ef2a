"""Connectors: where a pipeline's data comes from and goes to, outside the engine.

Layer: above :mod:`dbsp.runtime` and below :mod:`dbsp.api`. A connector knows Arrow tables and
files (or a remote system); it knows no operator and no stream. The API hands a sink each step's
change through :meth:`dbsp.api.DataStream.for_each`.

* :mod:`dbsp.connectors.files` -- :class:`ParquetSink`: every step's change of a stream as
  Parquet files in a (Hive-partitioned) directory, readable back as one Z-set.
"""
from .files import ParquetSink

__all__ = ["ParquetSink"]

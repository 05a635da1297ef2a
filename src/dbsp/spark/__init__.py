"""dbsp on Spark: W circuit replicas as one long-lived barrier job, exchanging over their own mesh.

Spark is used as a gang launcher and failure detector only (``../shared/research/spark-
distribution.md``): :class:`SparkJob` submits ``spark.range(W, numPartitions=W).mapInArrow(
worker, schema, barrier=True)`` in a background driver thread, so all W tasks start together,
one worker per task. Each task dials the coordinator on the driver (the launcher's rendezvous,
:class:`dbsp.runtime.launcher.Coordinator`: one TCP round trip, not a ~1 s ``allGather``),
passes the mesh handshake with the job's secret (carried in the task's closure), and joins the
authenticated TCP mesh of the other tasks; then it serves steps until the driver stops it. No
Spark job, stage or shuffle runs per step: a step is one request per worker from the driver and
the exchanges between workers over the mesh.

Data in and out goes through Arrow, never row by row. Input the tasks read themselves, no row
crossing the driver: a sliced source (:mod:`dbsp.runtime.slices`, e.g. Parquet files dealt to
the tasks by row group: ``SparkJob(sliced=[...])`` and :meth:`SparkJob.read_slices`), or an input
DataFrame as the barrier job's own input (``SparkJob(partitioned=(name, df, rows_per_step))``:
``cut_frame(df, W).mapInArrow(worker, ..., barrier=True)``, each task reading its partition's
Arrow batches from the task iterator step by step, :meth:`SparkJob.read_partition`; a durable
job cuts it into P partitions for its life and deals them over its W tasks, so that it may
change W: :class:`SparkDurableJob`). Input
through the driver: :meth:`SparkJob.push` takes a Spark
DataFrame (collected with ``toArrow``) or an Arrow table, and :meth:`SparkJob.changes` returns a
view's changes of the last step as a Spark DataFrame (built from an Arrow table, with a
``__weight`` column). :func:`run` does a whole list of steps and returns every output's changes
with a ``__step`` column.

Settings, read from the session conf (arguments win):

* ``spark.dbsp.workers``: W (default: the context's default parallelism);
* ``spark.dbsp.startupTimeout``: seconds for all tasks to start and form the mesh (120);
* ``spark.dbsp.storage``: a directory where each worker spills its state (none: in memory);
* ``spark.dbsp.coordinator.host``: the host the driver's coordinator listens on and tasks dial
  (default ``spark.driver.host``, else 127.0.0.1);
* ``spark.dbsp.worker.host``: the host a task listens on for its peers (default: its
  executor's host as the barrier context reports it).

The barrier job holds W task slots for its whole life, so reading an input DataFrame or using a
DataFrame of changes (each a Spark job) needs at least one slot more than W; with exactly W
slots, push Arrow tables (:meth:`SparkJob.push` says so instead of waiting forever).

Recovery: :func:`durable` gives a :class:`dbsp.ft.remote.DurableJob` whose generations are
barrier jobs (:class:`SparkGeneration`): a lost task or executor aborts the job (a barrier
ResultStage is never retried by Spark), the driver submits the next generation, its tasks
reload the last checkpoint from the shared storage directory and the input log replays; old
generations are fenced off (``<storage>/GENERATION``). A Structured Streaming source of a
pipeline's output log: :mod:`dbsp.spark.source` (``spark.readStream.format("dbsp")``).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import pyarrow as pa
from pyspark import BarrierTaskContext
from pyspark.sql import DataFrame, SparkSession

from ..ft.remote import DurableJob
from ..runtime.circuit import Circuit
from ..runtime.launcher import Coordinator, build_outputs, resolve_pipeline, serve_worker
from ..runtime.process import WorkerDied
from ..runtime.slices import LocalSource, SourceStep
from ..runtime.socket_transport import MeshAuth

__all__ = ["SparkJob", "SparkGeneration", "SparkDurableJob", "durable", "run", "settings",
           "SETTINGS", "PartitionSource", "PartitionReader", "RoutedPartitionReader",
           "routed_partitions", "cut_frame", "PARTITION"]

#: the ``spark.dbsp.*`` keys and their defaults
SETTINGS = {
    "spark.dbsp.workers": None,
    "spark.dbsp.startupTimeout": "120",
    "spark.dbsp.storage": None,
    "spark.dbsp.coordinator.host": None,
    "spark.dbsp.worker.host": None,
}

_STATUS = pa.schema([("worker", pa.int64()), ("status", pa.string()), ("seconds", pa.float64())])
_STATUS_DDL = "worker long, status string, seconds double"


def settings(spark: SparkSession) -> dict:
    """The ``spark.dbsp.*`` settings of ``spark``'s conf, defaults filled in."""
    out = {}
    for k, default in SETTINGS.items():
        out[k] = spark.conf.get(k, default)
    return out


def _worker_task(coordinator: str, auth: str, build: Callable, timeout: float,
                 host: Optional[str], partition_input: Optional[str] = None
                 ) -> Callable[[Iterator[Any]], Iterator]:
    """The function each barrier task runs: one dbsp worker until the driver stops it.
    ``partition_input``: the task's partition is an input DataFrame's, which the worker reads
    step by step (the local source :data:`PARTITION`) instead of draining it: ``"direct"``,
    the partition itself as Arrow batches (:class:`PartitionReader`, a ``mapInArrow`` task);
    ``"routed"``, the tagged batches of the partitions it holds (:class:`RoutedPartitionReader`,
    an RDD barrier task, which yields tuples)."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        sources = None
        if partition_input == "direct":
            sources = {PARTITION: PartitionReader(batches)}
        elif partition_input == "routed":
            sources = {PARTITION: RoutedPartitionReader(batches)}
        else:
            for _ in batches:  # the task's one row (its partition of spark.range(W))
                pass
        ctx = BarrierTaskContext.get()
        w = ctx.partitionId()
        listen = host or ctx.getTaskInfos()[w].address.rsplit(":", 1)[0]
        t0 = time.perf_counter()
        serve_worker(coordinator, MeshAuth.from_text(auth), w, build=build, listen_host=listen,
                     timeout=timeout, sources=sources)
        secs = time.perf_counter() - t0
        if partition_input == "routed":
            yield (w, "stopped", secs)
        else:
            yield pa.record_batch([pa.array([w], pa.int64()), pa.array(["stopped"]),
                                   pa.array([secs])], schema=_STATUS)

    return task


#: the name of a barrier task's own partition as a worker-local sliced source
PARTITION = "spark-partition"


class _Rows:
    """The buffered rows of one partition: Arrow batches from partition row ``lo`` to ``hi``,
    read in pieces ``[start, end)``; whole batches before the last piece's start are let go (a
    rolled-back step reads its piece again)."""

    def __init__(self) -> None:
        self.buf: list[pa.RecordBatch] = []
        self.lo = 0       # partition row of the first buffered row
        self.hi = 0       # partition row after the last buffered row
        self.schema: Optional[pa.Schema] = None
        self.done = False

    def add(self, b: pa.RecordBatch, floor: int = 0) -> None:
        self.schema = b.schema
        if b.num_rows and self.hi + b.num_rows <= floor and not self.buf:
            self.lo = self.hi = self.hi + b.num_rows  # wholly before any piece still to read
        elif b.num_rows:
            self.buf.append(b)
            self.hi += b.num_rows

    def take(self, lo: int, hi: int) -> pa.Table:
        if lo < self.lo:
            raise ValueError(f"rows [{lo}, {hi}) of the partition were let go already (the "
                             f"reader is at row {self.lo}): a piece before the last one read")
        while self.buf and self.lo + self.buf[0].num_rows <= lo:
            self.lo += self.buf.pop(0).num_rows
        if not self.buf:  # nothing left (no schema seen: an empty partition)
            if self.hi < lo:
                self.lo = self.hi  # (rows skipped wholly on arrival)
            return pa.table({}) if self.schema is None else self.schema.empty_table()
        t = pa.Table.from_batches(self.buf)
        a, b = lo - self.lo, min(hi, self.hi) - self.lo
        return t.slice(a, max(0, b - a))


class PartitionReader:
    """A barrier task's partition of the input DataFrame, read in pieces ``{"partition": w,
    "start": lo, "end": hi}`` (rows ``[lo, hi)`` of the partition) from the task's iterator of
    Arrow batches as the steps ask for them: only the rows from the last piece's start on are
    kept (a rolled-back step reads its piece again), earlier ones are let go. A piece past the
    end of the partition reads short (or empty)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._it = iter(batches)
        self._rows = _Rows()

    @property
    def done(self) -> bool:
        return self._rows.done

    def read(self, piece: dict) -> pa.Table:
        lo, hi = int(piece["start"]), int(piece["end"])
        r = self._rows
        while r.hi < hi and not r.done:
            try:
                r.add(next(self._it))
            except StopIteration:
                r.done = True
        return r.take(lo, hi)


#: the columns of a tagged input batch (:func:`_tag_partition`): its partition, its first row
#: in the partition, its rows (-1: the partition's end, ``start`` its row count) and the batch
#: as an Arrow IPC stream
_TAG_DDL = "part int, start long, rows long, ipc binary"
_TAG = pa.schema([("part", pa.int32()), ("start", pa.int64()), ("rows", pa.int64()),
                  ("ipc", pa.binary())])


def _tag_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A ``mapInArrow`` function over the input DataFrame's P partitions: each Arrow batch as
    one row (partition, first row, rows, IPC bytes), then an end row with the partition's row
    count, so that a task holding several partitions, whose batches reach it in any order
    between partitions, can put each partition's rows in order and knows where it ends."""
    from pyspark import TaskContext
    p = TaskContext.get().partitionId()
    n = 0

    def row(start: int, rows: int, ipc: bytes) -> pa.RecordBatch:
        return pa.record_batch([pa.array([p], pa.int32()), pa.array([start], pa.int64()),
                                pa.array([rows], pa.int64()), pa.array([ipc], pa.binary())],
                               schema=_TAG)
    for b in batches:
        if not b.num_rows:
            continue
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, b.schema) as wr:
            wr.write_batch(b)
        yield row(n, b.num_rows, sink.getvalue().to_pybytes())
        n += b.num_rows
    yield row(n, -1, b"")


def _route_key(workers: int) -> Callable[[Any], tuple]:
    def key(r: Any) -> tuple:
        return int(r[0]) % workers, (int(r[0]), int(r[1]), int(r[2]), bytes(r[3]))
    return key


def _identity(k: int) -> int:
    return k


def cut_frame(df: DataFrame, partitions: int) -> DataFrame:
    """``df`` cut into ``partitions`` partitions whose rows and order depend on its rows only:
    hash-partitioned by every column, each partition sorted by every column. A round-robin
    ``repartition(P)`` is not: its partitions depend on the upstream partitioning (the number
    of executors when the DataFrame is read) and a partition's order on the order the shuffle
    fetches blocks in, so after a lost executor a new generation would read other rows at the
    logged positions (which the logged checksums refuse). Every column must be sortable (no
    map columns)."""
    cols = df.columns
    return df.repartition(partitions, *cols).sortWithinPartitions(*cols)


def routed_partitions(df: DataFrame, partitions: int, workers: int) -> Any:
    """The RDD whose partition ``w`` holds the tagged batches (:func:`_tag_partition`) of the
    ``partitions`` partitions ``p`` of :func:`cut_frame` with ``p % workers ==
    w``: what a barrier task of ``workers`` reads when the input's partitions are not the
    tasks' (a job that changed its worker count). One record per Arrow batch crosses Python."""
    tagged = cut_frame(df, partitions).mapInArrow(_tag_partition, _TAG_DDL)
    return tagged.rdd.map(_route_key(workers)).partitionBy(workers, _identity).values()


class RoutedPartitionReader:
    """A barrier task's partitions of the input DataFrame when it holds several (or one that is
    not its own index): reads pieces ``{"partition": p, "start": lo, "end": hi}`` from the
    task's tagged batches (:func:`routed_partitions`), which arrive in order within a partition
    but in any order between partitions; batches of other partitions met on the way are kept
    until read. Every step's pieces start at the same row of every partition
    (:class:`PartitionSource`), so a batch wholly before the latest piece's start is dropped on
    arrival: a replay that starts late does not buffer the rows it skips."""

    def __init__(self, records: Iterator[Any]):
        self._it = iter(records)
        self._parts: dict[int, _Rows] = {}
        self._floor = 0
        self.done = False

    def _part(self, p: int) -> _Rows:
        r = self._parts.get(p)
        if r is None:
            r = self._parts[p] = _Rows()
        return r

    def read(self, piece: dict) -> pa.Table:
        p, lo, hi = int(piece["partition"]), int(piece["start"]), int(piece["end"])
        self._floor = max(self._floor, lo)
        r = self._part(p)
        while r.hi < hi and not r.done:
            try:
                q, start, rows, ipc = next(self._it)
            except StopIteration:  # every partition's end row came before (they end it)
                self.done = True
                if self._parts and not all(x.done for x in self._parts.values()):
                    raise RuntimeError(f"the tagged batches ended before partition {p}'s end "
                                       f"row") from None
                break
            rq = self._part(q)
            if rows < 0:
                if start != rq.hi:
                    raise RuntimeError(f"partition {q} ends at row {start} but {rq.hi} of its "
                                       f"rows arrived")
                rq.done = True
                continue
            if start != rq.hi:
                raise RuntimeError(f"partition {q}: a batch at row {start} arrived after row "
                                   f"{rq.hi} (out of order)")
            b = pa.ipc.open_stream(ipc).read_next_batch()
            rq.add(b, self._floor)
        return r.take(lo, hi)


class PartitionSource:
    """An input DataFrame as the barrier job's own input (see :class:`SparkJob`): the DataFrame
    cut into ``partitions`` partitions (:func:`cut_frame`); step ``k`` is rows ``[k n, (k
    + 1) n)`` of every one of them, piece ``p`` read by the task that holds partition ``p``
    (task ``p % W``, as :func:`~dbsp.runtime.slices.deal_pieces` deals piece ``p``), none
    through the driver. The pieces do not depend on the worker count, so a durable job may
    change it (:meth:`SparkDurableJob.relayout`). The source has no known end: a step whose
    pieces all read short is the last (:meth:`ended`)."""

    def __init__(self, partitions: int, rows_per_step: int):
        if rows_per_step < 1:
            raise ValueError(f"rows_per_step must be >= 1, got {rows_per_step}")
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        self.partitions, self.rows_per_step = partitions, rows_per_step

    def pieces(self, step: int) -> Optional[list]:
        if step < 0:
            return None
        n = self.rows_per_step
        return [{"partition": p, "start": step * n, "end": (step + 1) * n}
                for p in range(self.partitions)]

    def reader(self) -> LocalSource:
        return LocalSource(PARTITION)

    def read(self, piece: dict) -> Any:
        raise RuntimeError("a Spark partition is read only by the barrier task that holds it")

    def ended(self, report: Sequence) -> bool:
        """Whether a step whose per-piece ``(rows, crc)`` is ``report`` was the last."""
        return all(r < self.rows_per_step for r, _ in report)


def _to_arrow(df: DataFrame) -> pa.Table:
    """A DataFrame collected as an Arrow table (Spark >= 4: ``toArrow``; no per-row Python)."""
    to_arrow = getattr(df, "toArrow", None)
    if to_arrow is not None:
        return to_arrow()
    return pa.Table.from_batches(df._collect_as_arrow())  # Spark 3.5


class SparkGeneration:
    """One barrier job of W dbsp workers (one generation), submitted from a driver thread, and
    the coordinator its tasks dial: the :class:`dbsp.ft.remote.Generation` of a durable job on
    Spark, and the engine of :class:`SparkJob`."""

    def __init__(self, spark: SparkSession, auth: MeshAuth, build: Callable, workers: int,
                 storage: Optional[str], timeout: float, coordinator_host: str,
                 worker_host: Optional[str], sliced: Sequence[str] = (),
                 input_df: Optional[DataFrame] = None, partitions: Optional[int] = None):
        self.spark = spark
        self.workers = workers
        self.auth = auth
        self._error: Optional[BaseException] = None
        self._result: Optional[list] = None
        self.input_df = input_df
        #: the input DataFrame's partitions (None: one per task, partition w on task w)
        self.partitions = None if partitions in (None, workers) else int(partitions)
        mode = None if input_df is None else "direct" if self.partitions is None else "routed"
        self.coordinator = Coordinator(workers, auth, f"{coordinator_host}:0", None,
                                       {"storage": storage, "sliced": list(sliced)}, timeout,
                                       watch=self._watch)
        self.group = f"dbsp-{auth.job.hex()[:12]}-g{auth.generation}"
        task = _worker_task(self.coordinator.address, auth.to_text(), build, timeout,
                            worker_host, partition_input=mode)
        self._thread = threading.Thread(target=self._run_job, args=(task,), daemon=True,
                                        name=self.group)
        self._thread.start()

    def _run_job(self, task) -> None:
        sc = self.spark.sparkContext
        sc.setJobGroup(self.group, f"dbsp: {self.workers} circuit replicas, generation "
                                   f"{self.auth.generation}", interruptOnCancel=True)
        try:
            if self.input_df is not None and self.partitions is not None:
                # task w reads partitions p % W == w of the input's P (an RDD barrier stage)
                rdd = routed_partitions(self.input_df, self.partitions, self.workers)
                self._result = rdd.barrier().mapPartitions(task).collect()
                return
            if self.input_df is not None:  # each task reads its partition itself
                df = cut_frame(self.input_df, self.workers)
            else:
                df = self.spark.range(0, self.workers, numPartitions=self.workers)
            self._result = df.mapInArrow(task, _STATUS_DDL, barrier=True).collect()
        except BaseException as e:  # reported by _watch / close
            self._error = e

    def _watch(self) -> None:
        if self._error is not None:
            raise WorkerDied(f"the Spark barrier job of {self.workers} dbsp workers (generation "
                             f"{self.auth.generation}) failed before they met: "
                             f"{self._error}") from self._error
        if not self._thread.is_alive():
            raise WorkerDied("the Spark barrier job of the dbsp workers ended before they met")

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, failed: bool = False, timeout: float = 60.0) -> None:
        """Stop the workers (the job then ends); cancel the job if it does not, at once when
        the generation ``failed``: Spark frees the task slots for the next one."""
        self.coordinator.close()
        if not failed:
            self._thread.join(timeout)
        if self._thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(self.group)
            self._thread.join(timeout)


def _plan(spark: SparkSession, workers: Optional[int], storage: Any,
          timeout: Optional[float]) -> dict:
    """The settings of a job on ``spark``, arguments over ``spark.dbsp.*``, checked."""
    conf = settings(spark)
    sc = spark.sparkContext
    W = int(workers or conf["spark.dbsp.workers"] or sc.defaultParallelism)
    if W < 1:
        raise ValueError(f"workers must be >= 1, got {W}")
    slots = sc.defaultParallelism
    if W > slots:  # Spark would retry for minutes, then fail with SPARK-24819
        raise ValueError(f"workers={W}, but this Spark context has {slots} task slots: a "
                         f"barrier job needs all {W} tasks running at once (give more "
                         f"executors or cores, or fewer workers)")
    storage = storage if storage is not None else conf["spark.dbsp.storage"]
    return {"workers": W, "slots": slots,
            "storage": None if storage is None else os.fspath(storage),
            "timeout": float(timeout or conf["spark.dbsp.startupTimeout"]),
            "coordinator_host": (conf["spark.dbsp.coordinator.host"]
                                 or spark.conf.get("spark.driver.host", None) or "127.0.0.1"),
            "worker_host": conf["spark.dbsp.worker.host"]}


class SparkJob:
    """``pipeline`` running on ``workers`` Spark barrier tasks (see the module doc).

    ``pipeline``: ``build(circuit) -> {name: output}`` (a function or its ``module:function``
    name; it reaches the executors in the task's closure, so they need only dbsp installed).
    Use as a context manager, or call :meth:`close`. Not fault tolerant: see :func:`durable`.

    ``sliced``: inputs the tasks read themselves from sliced sources (:meth:`read_slices`).
    ``partitioned``: ``(input, DataFrame, rows_per_step)``: the DataFrame is the barrier job's
    own input (``cut_frame(df, W).mapInArrow(worker, ..., barrier=True)``: its rows
    hash-partitioned and sorted by every column, so that another barrier job reads the same
    partitions), each task reads
    its partition ``rows_per_step`` rows a step (:meth:`read_partition`) and no row passes
    through the driver. Spark shuffles the whole DataFrame into the W partitions before the
    tasks start (the barrier stage waits for the shuffle's map stage).
    """

    def __init__(self, spark: SparkSession, pipeline: Union[str, Callable],
                 workers: Optional[int] = None, storage: Any = None,
                 timeout: Optional[float] = None, sliced: Sequence[str] = (),
                 partitioned: Optional[tuple] = None):
        cfg = _plan(spark, workers, storage, timeout)
        self.spark = spark
        self.workers = W = cfg["workers"]
        self.slots = cfg["slots"]
        self.timeout = cfg["timeout"]
        build = resolve_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
        self.auth = MeshAuth.new()
        sliced = list(sliced)
        input_df = None
        #: the input read from the barrier job's own input DataFrame, and its source
        self.partitioned: Optional[tuple[str, PartitionSource]] = None
        if partitioned is not None:
            name, input_df, n = partitioned
            self.partitioned = (name, PartitionSource(W, int(n)))
            if name not in sliced:
                sliced.append(name)
        t0 = time.perf_counter()
        self.gen = SparkGeneration(spark, self.auth, build, W, cfg["storage"], self.timeout,
                                   cfg["coordinator_host"], cfg["worker_host"], sliced,
                                   input_df)
        self.coordinator = self.gen.coordinator
        self.group = self.gen.group
        self.circuit = Circuit(workers=W, executor=self.coordinator.executor)
        self.outputs = build_outputs(self.circuit, build)
        self.circuit.slice_inputs(*sliced)
        self.inputs = self.circuit.inputs
        try:
            self.coordinator.connect()
        except BaseException:
            self.close()
            raise
        #: seconds from submitting the barrier job to the mesh standing
        self.startup_seconds = time.perf_counter() - t0
        self.steps = 0

    # -- data -----------------------------------------------------------------------------
    def push(self, name: str, data: Any, weights: Any = None) -> int:
        """Add rows to input ``name`` for the next step: a Spark DataFrame (through Arrow), an
        Arrow table or batch (a ``__weight`` column gives weights), or what the circuit's
        inputs take."""
        if name not in self.inputs:
            raise KeyError(f"no input named {name!r} (inputs: {', '.join(self.inputs)})")
        if isinstance(data, DataFrame):
            self._need_free_slot("reading a DataFrame")
            data = _to_arrow(data)
        return self.inputs[name].push(data, weights)

    def read_slices(self, name: str, source: Any, step: int) -> int:
        """The next step, input ``name`` (named in ``sliced=``) also gets step ``step`` of the
        sliced ``source`` (:mod:`dbsp.runtime.slices`, e.g. a
        :class:`dbsp.connectors.slices.FileSlices` the executors see): each task reads its own
        pieces, no row passes through the driver. Returns the number of pieces."""
        return self.circuit.read_slices(name, source, step)

    def read_partition(self, step: int) -> None:
        """The next step, the ``partitioned`` input gets step ``step`` of the barrier job's own
        input: rows ``[step n, (step + 1) n)`` of each task's partition."""
        if self.partitioned is None:
            raise ValueError("this job has no partitioned input (SparkJob(partitioned=(name, "
                             "df, rows_per_step)))")
        name, src = self.partitioned
        self.circuit.read_slices(name, src, step)

    @property
    def partition_ended(self) -> bool:
        """Whether the last step read the end of every task's partition."""
        if self.partitioned is None:
            return False
        name, src = self.partitioned
        last = self.circuit.last_slices.get(name)
        return last is not None and src.ended(last["report"])

    def step(self) -> None:
        """One step on all workers: feed the pushed input, update every view."""
        self.circuit.step()
        self.steps += 1

    def changes_arrow(self, name: str) -> pa.Table:
        """Output ``name``'s changes of the last step, with a ``__weight`` column."""
        if name not in self.outputs:
            raise KeyError(f"no output named {name!r} (outputs: {', '.join(self.outputs)})")
        return self.outputs[name].to_arrow()

    def changes(self, name: str) -> DataFrame:
        """Output ``name``'s changes of the last step as a Spark DataFrame (using it runs Spark
        jobs, which need a task slot the workers do not hold)."""
        self._need_free_slot("a DataFrame of changes")
        return _from_arrow(self.spark, self.changes_arrow(name))

    def _need_free_slot(self, what: str) -> None:
        if self.workers >= self.slots:
            raise RuntimeError(
                f"{what} runs a Spark job, but the {self.workers} dbsp workers hold all "
                f"{self.slots} task slots of this context (it would wait forever): give Spark "
                f"at least {self.workers + 1} slots, or pass Arrow tables instead")

    # -- life -----------------------------------------------------------------------------
    def close(self, timeout: float = 60.0) -> None:
        """Stop the workers (the barrier job then ends); cancel the job if it does not."""
        self.circuit.close()
        self.gen.close(failed=self.coordinator.broken is not None, timeout=timeout)

    @property
    def result(self) -> Optional[list]:
        """The barrier job's rows (one per worker) once it ended normally."""
        return self.gen._result

    def __enter__(self) -> "SparkJob":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _from_arrow(spark: SparkSession, table: pa.Table) -> DataFrame:
    return spark.createDataFrame(table)


def run(spark: SparkSession, pipeline: Union[str, Callable], steps: Sequence[dict],
        workers: Optional[int] = None, storage: Any = None,
        sources: Optional[dict] = None) -> dict[str, DataFrame]:
    """Run ``pipeline`` on Spark over ``steps`` (each ``{input name: DataFrame or Arrow, or
    SourceStep(k)}``) and return, for every output, all its changes as one DataFrame with
    ``__step`` and ``__weight`` columns. The input DataFrames are read (through Arrow) before
    the workers start, so this works with exactly W task slots. ``sources``: ``{input:
    SlicedSource}`` for the inputs given as :class:`~dbsp.runtime.slices.SourceStep`: the
    tasks read those themselves, no row passes through the driver."""
    # read every input DataFrame before the workers take their task slots
    steps = [{name: _to_arrow(d) if isinstance(d, DataFrame) else d for name, d in st.items()}
             for st in steps]
    sources = dict(sources or {})
    with SparkJob(spark, pipeline, workers=workers, storage=storage,
                  sliced=list(sources)) as job:
        acc: dict[str, list] = {name: [] for name in job.outputs}
        for i, st in enumerate(steps):
            for name, data in st.items():
                if isinstance(data, SourceStep):
                    job.read_slices(name, sources[name], data.step)
                else:
                    job.push(name, data)
            job.step()
            for name in job.outputs:
                t = job.changes_arrow(name)
                acc[name].append(t.append_column("__step", pa.array([i] * t.num_rows,
                                                                     pa.int64())))
    return {name: _from_arrow(spark, pa.concat_tables(ts)) for name, ts in acc.items()}


class SparkDurableJob(DurableJob):
    """A :class:`~dbsp.ft.remote.DurableJob` whose generations are barrier jobs
    (:func:`durable`); :meth:`relayout` changes its worker count.

    ``partitioned``: ``(input, DataFrame, rows_per_step)``, the DataFrame as every generation's
    own barrier-job input (as :class:`SparkJob`'s): a step's input names it
    ``SourceStep(k)`` (or ``d.step(slices={input: k})``), the input log records each piece's
    row range of its partition with its checksum, and a new generation's tasks read their
    partitions again from the start (the rows before the replayed steps are skipped, the
    replayed ones checked against the log). ``partitions``: P, the partitions the DataFrame is
    cut into (:func:`cut_frame`, default the first worker count), fixed for the job's life:
    a step is ``rows_per_step`` rows of each, so what a step reads does not depend on the worker
    count. With W tasks, task ``w`` reads partitions ``p % W == w``: when P == W its own
    partition (``mapInArrow(barrier=True)``), else the tagged batches of its partitions routed
    to it (an RDD barrier stage, :func:`routed_partitions`). A layout change
    (:meth:`relayout`) thus moves state, never input: the next generation's tasks read the same
    pieces from the logged position on, dealt over the new worker count."""

    def __init__(self, spark: SparkSession, build: Callable, cfg: dict,
                 partitioned: Optional[tuple] = None, partitions: Optional[int] = None,
                 **kw: Any):
        self.spark, self.build_fn_spark, self.cfg = spark, build, cfg
        self.input_df = None
        #: the partitioned input's name and source (None: no DataFrame input)
        self.partitioned: Optional[tuple[str, PartitionSource]] = None
        if partitioned is not None:
            name, self.input_df, n = partitioned
            P = int(partitions or cfg["workers"])
            self.partitioned = (name, PartitionSource(P, int(n)))
            kw["sliced"] = {**(kw.get("sliced") or {}), name: self.partitioned[1]}
        elif partitions is not None:
            raise ValueError("partitions= is the partitioned input's: give partitioned= too")
        super().__init__(build, cfg["workers"], cfg["storage"], self._starter(cfg["workers"]),
                         **kw)

    def _starter(self, workers: int) -> Callable[[MeshAuth, str], SparkGeneration]:
        cfg = self.cfg
        P = None if self.partitioned is None else self.partitioned[1].partitions

        def start(auth: MeshAuth, root: str) -> SparkGeneration:
            return SparkGeneration(self.spark, auth, self.build_fn_spark, workers, root,
                                   cfg["timeout"], cfg["coordinator_host"], cfg["worker_host"],
                                   list(self.sliced), self.input_df, P)
        return start

    @property
    def partition_ended(self) -> bool:
        """Whether the last step read the end of every partition."""
        if self.partitioned is None or self.durable is None:
            return False
        name, src = self.partitioned
        last = self.durable.circuit.last_slices.get(name)
        return last is not None and src.ended(last["report"])

    def relayout(self, workers: int) -> dict:
        """A cold layout change to ``workers`` barrier tasks
        (:meth:`~dbsp.ft.remote.DurableJob.change_layout`): the last checkpoint in the old
        layout, the barrier job ended, the next one submitted with ``workers`` tasks, each
        loading the state of the shards it now owns, a checkpoint in the new layout before any
        input. A ``partitioned`` input's P partitions are then dealt over the new tasks (task
        ``w`` reads partitions ``p % workers == w``) from the step the checkpoint ends at."""
        W = _plan(self.spark, workers, self.cfg["storage"], self.cfg["timeout"])["workers"]
        return self.change_layout(W, self._starter(W))


def durable(spark: SparkSession, pipeline: Union[str, Callable], storage: Any = None,
            workers: Optional[int] = None, timeout: Optional[float] = None,
            **kw: Any) -> SparkDurableJob:
    """``pipeline`` on Spark, exactly-once, recovering from lost tasks and executors
    (:class:`dbsp.ft.remote.DurableJob`): ``storage`` (or ``spark.dbsp.storage``) is a
    directory the driver and every executor see; each generation is one barrier job. When a
    task or an executor is lost, Spark aborts the barrier job, and the next step (or the
    running loop of :meth:`~dbsp.ft.remote.DurableJob.run`) submits a new one with the next
    generation: its tasks reload the last checkpoint and the driver replays the input log.
    :meth:`SparkDurableJob.relayout` resumes it on another number of tasks (a cold layout
    change). ``partitioned=(input, df, rows_per_step)`` and ``partitions=P``: a DataFrame as
    the barrier jobs' own input (:class:`SparkDurableJob`). ``kw``: ``checkpoint_every``,
    ``checkpoint_seconds``, ``max_restarts``, ... of :class:`~dbsp.ft.remote.DurableJob`."""
    cfg = _plan(spark, workers, storage, timeout)
    if cfg["storage"] is None:
        raise ValueError("a durable job on Spark needs storage= (or spark.dbsp.storage): a "
                         "directory the driver and every executor see")
    build = resolve_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    return SparkDurableJob(spark, build, cfg, **kw)

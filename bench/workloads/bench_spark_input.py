# Run:  pytest bench/workloads/bench_spark_input.py --benchmark-only -s
#       (or: python bench/workloads/bench_spark_input.py [--events 400000] [--rounds 3])
"""A Spark DataFrame as input: collected to the driver (``toArrow``) and pushed, against the
barrier job's own input (``SparkJob(partitioned=...)``: ``df.repartition(W).mapInArrow(worker,
..., barrier=True)``, each task reading its partition step by step), on ``local[2]`` with W = 2.

The same DataFrame (``events`` rows of :data:`dbsp.testing.pipelines.EVENTS` made on the
executors with ``spark.range``, so that neither way starts with the rows on the driver) runs
through :func:`~dbsp.testing.pipelines.keyed_count` in steps of ``rows_per_step`` rows per
worker. Per way, medians over interleaved rounds: wall seconds from the start to the mesh
standing (``startup``: the barrier job's submission, and for the partitioned way the shuffle
that makes the W partitions before the barrier stage can start) and to the last step
(``total``), and CPU seconds of the driver's Python process and of the whole local process
tree (driver, JVM, Python workers: ``psutil``). The final views are checked equal.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import Counter

import psutil

MODES = ("collect", "partitioned")


def _tree_cpu() -> float:
    me = psutil.Process()
    total = 0.0
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def frame(spark, events: int):
    from pyspark.sql import functions as Fn
    return spark.range(0, events, numPartitions=4).select(
        (Fn.col("id") * 7919 % 50_000).alias("k"), (Fn.col("id") % 100).alias("v"))


def run_mode(spark, mode: str, events: int, rows_per_step: int, workers: int = 2) -> dict:
    from dbsp.spark import SparkJob, _to_arrow
    from dbsp.testing import pipelines as P
    df = frame(spark, events)
    t0, c0, tc0 = time.perf_counter(), time.process_time(), _tree_cpu()
    view: Counter = Counter()
    if mode == "collect":
        table = _to_arrow(df)
        with SparkJob(spark, P.keyed_count, workers=workers) as job:
            startup = time.perf_counter() - t0
            n = rows_per_step * workers
            for lo in range(0, table.num_rows, n):
                job.push("events", table.slice(lo, n))
                job.step()
                view.update(job.outputs["counts"].to_dict())
    else:
        with SparkJob(spark, P.keyed_count, workers=workers,
                      partitioned=("events", df, rows_per_step)) as job:
            startup = time.perf_counter() - t0
            k = 0
            while True:
                job.read_partition(k)
                job.step()
                view.update(job.outputs["counts"].to_dict())
                k += 1
                if job.partition_ended:
                    break
    return {"startup": startup, "total": time.perf_counter() - t0,
            "driver_cpu": time.process_time() - c0, "tree_cpu": _tree_cpu() - tc0,
            "view": {r: w for r, w in view.items() if w}}


def compare(spark, events: int, rows_per_step: int, rounds: int) -> dict:
    runs: dict = {m: [] for m in MODES}
    for r in range(rounds):
        for m in (MODES if r % 2 == 0 else MODES[::-1]):
            runs[m].append(run_mode(spark, m, events, rows_per_step))
    views = [x.pop("view") for m in MODES for x in runs[m]]
    if any(v != views[0] for v in views):
        raise AssertionError("the two ways gave different views")
    out = {"events": events, "rows_per_step": rows_per_step, "rounds": rounds,
           "load": os.getloadavg()[0]}
    for m in MODES:
        for k in ("startup", "total", "driver_cpu", "tree_cpu"):
            out[f"{m}_{k}"] = statistics.median(x[k] for x in runs[m])
    return out


def report(r: dict) -> str:
    lines = [f"Spark local[2], W=2, keyed_count over {r['events']} rows, {r['rows_per_step']} "
             f"rows a step per worker, medians of {r['rounds']} interleaved rounds "
             f"(load {r['load']:.1f})"]
    for m in MODES:
        lines.append(f"  {m:11s} startup {r[m + '_startup']:6.2f} s  total {r[m + '_total']:6.2f}"
                     f" s  driver CPU {r[m + '_driver_cpu']:6.2f} s  process tree CPU "
                     f"{r[m + '_tree_cpu']:6.2f} s")
    return "\n".join(lines)


def session():
    from pyspark.sql import SparkSession
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    return (SparkSession.builder.master("local[2]").appName("dbsp-bench-input")
            .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2").getOrCreate())


def test_spark_dataframe_input(benchmark):
    spark = session()
    out: list = []
    benchmark.group = "spark-input"
    benchmark.pedantic(lambda: out.append(compare(spark, 400_000, 50_000, 3)), rounds=1,
                       iterations=1)
    benchmark.extra_info.update(out[0])
    print("\n" + report(out[0]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=400_000)
    ap.add_argument("--rows-per-step", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    spark = session()
    compare(spark, 20_000, 5_000, 1)  # warm: first jobs, Python workers
    print(report(compare(spark, a.events, a.rows_per_step, a.rounds)))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

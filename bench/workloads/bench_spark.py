# Run:  pytest bench/workloads/bench_spark.py --benchmark-only -s
"""dbsp on Spark (issue 13): start-up, recovery, and the join workload on every runtime.

Recorded, not gated (2-core machine shared with other work: the figures are orders of
magnitude, the ratios measured within one run):

* ``test_spark_startup``: a ``local-cluster[2,1,1024]`` session (master, worker, two executor
  JVMs) from nothing until both executors registered, then the first barrier job of W = 2 replicas to a standing mesh;
* ``test_recovery``: on that session, a durable job (checkpoint every 4 steps) whose task
  Python worker is killed mid-run; recovery = kill -> the next generation recovered (its barrier
  job submitted, the mesh standing, the checkpoint reloaded, the input log replayed), as
  :attr:`dbsp.ft.remote.DurableJob.recovery_seconds` measures it, plus the seconds from the
  kill to the first new step;
* ``test_join_workload_ratios``: the join + aggregate + recursive pipeline
  (:func:`dbsp.testing.pipelines.join_agg_closure`) over the same steps, wall seconds per step
  embedded (1 worker), on the launcher (2 processes) and on Spark local-cluster (W = 2), rounds
  interleaved, medians; printed as ratios to embedded.
"""
from __future__ import annotations

import os
import signal
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pytest

pyspark = pytest.importorskip("pyspark")

import dbsp  # noqa: E402
from dbsp.runtime.launcher import build_outputs, launch  # noqa: E402
from dbsp.spark import SparkJob, durable  # noqa: E402
from dbsp.testing import crash  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402

MASTER = "local-cluster[2,1,1024]"
_session = {}


def _spark():
    if "s" not in _session:
        from pyspark.sql import SparkSession
        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
        os.environ["PYSPARK_PYTHON"] = sys.executable
        t0 = time.perf_counter()
        _session["s"] = (SparkSession.builder.master(MASTER).appName("dbsp-bench")
                         .config("spark.driver.host", "127.0.0.1")
                         .config("spark.driver.bindAddress", "127.0.0.1")
                         .config("spark.ui.enabled", "false")
                         .config("spark.executor.memory", "512m")
                         .config("spark.python.task.killTimeout", "500ms")
                         .getOrCreate())
        sc = _session["s"].sparkContext
        while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # 2 executors + the driver
            time.sleep(0.2)
        _session["start"] = time.perf_counter() - t0
    return _session["s"]


@pytest.fixture(scope="module", autouse=True)
def _stop_session():
    yield
    if "s" in _session:
        _session.pop("s").stop()


def test_spark_startup(benchmark):
    spark = _spark()
    job = SparkJob(spark, P.keyed_count, workers=2, timeout=600)
    job.close()
    print(f"\nSpark {MASTER}: session {_session['start']:.1f} s, first barrier job to a "
          f"standing mesh {job.startup_seconds:.1f} s")
    benchmark.extra_info.update(session_s=_session["start"], barrier_job_s=job.startup_seconds)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


def test_recovery(benchmark):
    spark = _spark()
    events, chunk = 400, 10
    steps = events // chunk
    d = tempfile.mkdtemp(prefix="dbsp-bench-recovery-")
    kill_at = {"t": None, "step": None, "first_new_step": None}

    def read(step, token):
        if kill_at["t"] is not None and kill_at["first_new_step"] is None \
                and job.generation > 1 and step > kill_at["step"]:
            kill_at["first_new_step"] = time.perf_counter() - kill_at["t"]
        if step == steps // 2 and kill_at["t"] is None:
            pid = job.pids()[0]
            kill_at["step"] = step
            kill_at["t"] = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)  # the death reaches the driver in this step
        return crash.step_input(step, events, chunk)

    with durable(spark, P.crash_views, storage=d, workers=2, checkpoint_every=4,
                 timeout=600) as job:
        co = job.run(read)
        assert co.stop(steps) == steps
        rec = list(job.recovery_seconds)
        what = job.report()["recoveries"][1]  # the second generation's: what it reloaded
    res = crash.check(d, events)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), res
    print(f"\nrecovery on {MASTER}: next generation recovered {rec[0]:.1f} s after the failure "
          f"was seen (checkpoint of step {what['checkpoint_step']} reloaded, "
          f"{what['replayed_steps']} logged steps replayed in {what['seconds']:.2f} s); kill -> "
          f"first new step {kill_at['first_new_step']:.1f} s")
    benchmark.extra_info.update(recovery_s=rec, kill_to_new_step_s=kill_at["first_new_step"],
                                recovery=what)
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


def _tables(step):
    schemas = {"bids": P.BIDS, "auctions": P.AUCTIONS, "edges": P.EDGES}
    out = {}
    for name, (rows, weights) in step.items():
        cols = list(zip(*rows)) if rows else [[] for _ in schemas[name]]
        out[name] = (pa.table({f.name: pa.array(c, f.type)
                               for f, c in zip(schemas[name], cols)}), weights)
    return out


def _per_step(inputs, step, steps) -> float:
    t0 = time.perf_counter()
    for st in steps:
        for name, (t, w) in st.items():
            inputs[name].push(t, w)
        step()
    return (time.perf_counter() - t0) / len(steps)


def test_join_workload_ratios(benchmark):
    spark = _spark()
    steps = [_tables(st) for st in P.sample_steps(20, seed=3)]
    times: dict[str, list] = {"embedded": [], "launcher": [], "spark": []}
    with launch(P.join_agg_closure, 2) as lj, \
            SparkJob(spark, P.join_agg_closure, workers=2, timeout=600) as sj:
        for _ in range(3):  # rounds interleaved: each runtime on a fresh circuit state
            with dbsp.Circuit(workers=1) as c:
                build_outputs(c, P.join_agg_closure)
                times["embedded"].append(_per_step(c.inputs, c.step, steps))
            times["launcher"].append(_per_step(lj.inputs, lj.step, steps))
            times["spark"].append(_per_step(sj.inputs, sj.step, steps))
    med = {k: statistics.median(v) for k, v in times.items()}
    print("\njoin workload, ms per step (median of 3 interleaved rounds): " +
          ", ".join(f"{k} {v * 1e3:.2f}" for k, v in med.items()) +
          f"; launcher/embedded {med['launcher'] / med['embedded']:.2f}, "
          f"spark local-cluster/embedded {med['spark'] / med['embedded']:.2f}")
    benchmark.extra_info.update({f"{k}_ms": v * 1e3 for k, v in med.items()})
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)

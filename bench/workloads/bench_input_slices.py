# Run:  pytest bench/workloads/bench_input_slices.py --benchmark-only -s
#       (a quick report without pytest: python bench/workloads/bench_input_slices.py
#        [--events 100000] [--steps 12] [--workers 2] [--rounds 3])
"""Driver-fed input against input the workers read themselves (:mod:`dbsp.runtime.slices`).

The :func:`~dbsp.testing.pipelines.join_avg` workload on the launcher (W worker processes and
the driver), its bids (10 of every 11 events) stored as one Parquet file per step, cut into
``4 W`` row groups. The same steps run two ways, interleaved round by round:

* ``driver``: the driver reads each step's file and pushes the rows; it deals them to the
  workers by the join key (:mod:`dbsp.runtime.placement`), so the join's exchange is local;
* ``sliced``: the driver sends each worker only the names of its row groups; the workers read
  them and the join's exchange routes the rows by key over the mesh.

Auctions are pushed through the driver in both. Reported per way (medians over rounds, the
steady state after ``warm`` steps): CPU seconds of the driver (``time.process_time``) and of
every process (the driver plus each worker's ``cpu_seconds``), and wall seconds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

from dbsp.connectors.slices import FileSlices
from dbsp.runtime.launcher import launch
from dbsp.testing import pipelines as P

MODES = ("driver", "sliced")


def write_steps(d: str, events: int, steps: int, groups: int) -> tuple[FileSlices, list]:
    """Bids of ``steps`` join_avg steps as Parquet files under ``d`` (``groups`` row groups
    each); returns the source and the auctions of each step."""
    data = P.join_avg_steps(events, steps, seed=5)
    for s, st in enumerate(data):
        b = st["bids"]
        pq.write_table(pa.Table.from_batches([b]), os.path.join(d, f"bids-{s:04d}.parquet"),
                       row_group_size=-(-b.num_rows // groups))
    return FileSlices(d), [st["auctions"] for st in data]


def run_mode(mode: str, workers: int, src: FileSlices, auctions: list,
             warm: int = 3) -> dict:
    """One run; CPU and wall seconds of the steps after ``warm``."""
    sliced = ["bids"] if mode == "sliced" else []
    with launch(P.join_avg, workers=workers, sliced=sliced) as job:
        def one(s: int) -> None:
            job.inputs["auctions"].push(auctions[s])
            if mode == "sliced":
                job.read_slices("bids", src, s)
            else:
                job.inputs["bids"].push(pq.read_table(src.files[s]))
            job.step()
            job.outputs["avg"].to_arrow()
        for s in range(warm):
            one(s)
        c0, w0, t0 = time.process_time(), job.circuit._executor.call("cpu_seconds"), \
            time.perf_counter()
        for s in range(warm, len(auctions)):
            one(s)
        wall = time.perf_counter() - t0
        c1, w1 = time.process_time(), job.circuit._executor.call("cpu_seconds")
    driver = c1 - c0
    return {"driver_cpu": driver, "all_cpu": driver + sum(w1) - sum(w0), "wall": wall}


def compare(events: int, steps: int, workers: int, rounds: int) -> dict:
    """Interleaved rounds of both modes on the same files; medians per mode."""
    runs: dict = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as d:
        src, auctions = write_steps(d, events, steps, 4 * workers)
        for r in range(rounds):
            for m in (MODES if r % 2 == 0 else MODES[::-1]):
                runs[m].append(run_mode(m, workers, src, auctions))
    out: dict = {"events": events, "steps": steps, "workers": workers, "rounds": rounds,
                 "load": os.getloadavg()[0]}
    for m in MODES:
        for k in ("driver_cpu", "all_cpu", "wall"):
            out[f"{m}_{k}"] = statistics.median(x[k] for x in runs[m])
    out["driver_cpu_ratio"] = out["sliced_driver_cpu"] / out["driver_driver_cpu"]
    out["all_cpu_ratio"] = out["sliced_all_cpu"] / out["driver_all_cpu"]
    return out


def report(r: dict) -> str:
    n = r["steps"] - 3
    lines = [f"join_avg, {r['events']} events a step, {n} measured steps, W={r['workers']} "
             f"launcher, medians of {r['rounds']} interleaved rounds (load {r['load']:.1f})"]
    for m in MODES:
        lines.append(f"  {m:7s} driver CPU {r[m + '_driver_cpu']:7.3f} s   all processes "
                     f"{r[m + '_all_cpu']:7.3f} s   wall {r[m + '_wall']:7.3f} s")
    lines.append(f"  sliced / driver-fed: driver CPU {r['driver_cpu_ratio']:.3f}, all "
                 f"processes {r['all_cpu_ratio']:.3f}")
    return "\n".join(lines)


def test_input_slices(benchmark):
    pytest_events = int(os.environ.get("DBSP_BENCH_SLICES_EVENTS", 100_000))
    out: list = []
    benchmark.group = "input-slices"
    benchmark.pedantic(lambda: out.append(compare(pytest_events, 12, 2, 3)), rounds=1,
                       iterations=1)
    benchmark.extra_info.update(out[0])
    print("\n" + report(out[0]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    print(report(compare(a.events, a.steps, a.workers, a.rounds)))


if __name__ == "__main__":
    sys.exit(main())

# Run:      pytest bench/workloads/bench_checkpoint.py --benchmark-only -s
# Compare:  pytest-benchmark compare 0001 0002 --group-by=group --columns=min,median
# Sizes: DBSP_BENCH_CKPT_MIB (default "10,100"; add 1024 for the 1 GiB case).
"""Checkpoint pause, checkpoint write throughput and recovery time (issue 12's benchmarks).

The state is one join trace (``(k int64, v int64)`` rows indexed by ``k``, 24 bytes a row with its
weight; the other side stays empty) grown to the target size in 100K-row steps, 1 worker, the
threads runtime. (Not ``integrate``: its output is the consolidated integral, which merges the
whole trace into one new in-memory batch every step, so every checkpoint would write it anew.)

* ``pause``: the time the circuit does not step for a checkpoint: :meth:`CheckpointStore.begin`
  (each spine's batch list and the small state captured at the step boundary). Target < 50 ms at
  every size. The write that follows runs beside the next steps.
* ``write``: the rest of the checkpoint (in-memory batches written to layer files, fsyncs, the
  catalog); ``extra_info["mb_per_s"]`` is the checkpoint's bytes over that time.
* ``recovery``: opening the directory again: restore the checkpoint, then replay ``r`` logged
  steps (``extra_info`` per ``r``).

Measured (2 vCPU, shared with other jobs, so times are loose; 3 rounds each):

=========  ===========  ==============================  ================================
state      pause        write (bytes)                   notes
=========  ===========  ==============================  ================================
10 MiB     0.3-0.5 ms   0.15-0.6 s (7-34 MB)            first checkpoint 43-45 MB/s
100 MiB    0.3-0.6 ms   4.3 s (186 MB), then 0.37 s     later ones 6.9 MB: merge outputs
                        (6.9 MB)                        in files are referenced, not copied
=========  ===========  ==============================  ================================

With the small state only referenced at the boundary (pickled by the writer), under a load
average of ~15 on 2 vCPUs (``DBSP_BENCH_CKPT_MIB=10,100,1024 pytest
bench/workloads/bench_checkpoint.py --benchmark-only -s -k pause``):

=========  ====================  ==========================  =================================
state      pause (3 rounds)      write                       bytes
=========  ====================  ==========================  =================================
10 MiB     38.4*, 0.85, 0.56 ms  3.6, 3.2, 1.1 s             27.5, 34.2, 6.9 MB (7.6 MB/s)
100 MiB    0.78, 0.64, 0.29 ms   29.5, 0.09, 1.5 s           295, 6.9, 6.9 MB (10.0 MB/s)
1 GiB      1.09, 0.80, 0.87 ms   33.8, 0.94, 1.2 s           323, 6.9, 6.9 MB (9.6 MB/s)
=========  ====================  ==========================  =================================

(* the first checkpoint of the process.) The write rates are a quarter of the unloaded ones
above: the disk and both CPUs were shared with seven other jobs.

Recovery (10 MiB state): 8-18 ms with nothing to replay, 0.15-0.39 s for 10 replayed steps of
10K rows, 1.0-1.5 s for 40.

Recovery is the replay's own work: a replayed step costs what the same step costs live (the
bench prints both). With the next record read on a thread beside the replayed step and the
output-log repair checking checksums only, at a load average of ~20 on 2 vCPUs: 0 steps
0.15-0.35 s, 10 steps 1.3-2.1 s (live 2.2 s), 40 steps 4.5-6.2 s (live 6.3 s); the code before,
same load, same bench: 0.22-0.38, 1.2-1.8 (live 1.6), 5.7-6.6 s (live 6.2). At load ~11
(the same set-up run from a script, three rounds): before 1.75-2.12 s for 40 steps, after
0.91-0.99 s.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import numpy as np
import pyarrow as pa
import pytest

from dbsp.checkpoint import CheckpointStore
from dbsp.ft import DurableCircuit
from dbsp.runtime.circuit import Circuit
from dbsp.storage.config import StorageConfig

SIZES = [int(x) for x in os.environ.get("DBSP_BENCH_CKPT_MIB", "10,100").split(",")]
ROW_BYTES = 24
STEP_ROWS = 100_000
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def _build(d: str):
    c = Circuit(storage=StorageConfig(d, memory_budget_bytes=4 << 30))
    t = c.add_input("t", SCHEMA)
    u = c.add_input("u", SCHEMA)
    # the state: the join's trace of t (u stays empty, so each step only files t's delta)
    t.index_by(["k"]).join(u.index_by(["k"])).output(name="j", view=False)
    store = lambda circ: CheckpointStore(d, circ.fingerprint())  # noqa: E731
    return c, t, DurableCircuit(c, store, os.path.join(d, "ft"), checkpoint_on_close=False)


def _batch(i: int) -> pa.RecordBatch:
    k = np.arange(i * STEP_ROWS, (i + 1) * STEP_ROWS, dtype=np.int64)
    return pa.RecordBatch.from_arrays([pa.array(k), pa.array(k * 7)], schema=SCHEMA)


def _grow(d, t, dc, mib: int) -> int:
    steps = max(1, (mib << 20) // (STEP_ROWS * ROW_BYTES))
    for i in range(steps):
        t.push(_batch(i))
        dc.step()
    return steps


@pytest.mark.parametrize("mib", SIZES)
def test_checkpoint_pause(benchmark, mib):
    d = tempfile.mkdtemp(prefix="dbsp-bench-ckpt-")
    try:
        c, t, dc = _build(d)
        steps = _grow(d, t, dc, mib)
        pauses, writes, sizes = [], [], []

        def once():
            t0 = time.perf_counter()
            pc = dc.store.begin(c, dc.step_no)
            t1 = time.perf_counter()
            info = pc.finish()
            t2 = time.perf_counter()
            pauses.append(t1 - t0)
            writes.append(t2 - t1)
            sizes.append(info.bytes)
            t.push(_batch(steps + len(pauses)))  # a step between checkpoints
            dc.step()
            return t1 - t0

        benchmark.group = "checkpoint pause"
        benchmark.pedantic(once, rounds=3, iterations=1)
        first_mb_s = sizes[0] / writes[0] / 1e6
        benchmark.extra_info.update(
            state_mib=mib, state_rows=c.state_rows(), pause_ms=[round(p * 1e3, 2) for p in pauses],
            write_s=[round(w, 3) for w in writes], checkpoint_mb=[round(s / 1e6, 1) for s in sizes],
            first_write_mb_per_s=round(first_mb_s, 1))
        print(f"\n{mib} MiB: pauses {benchmark.extra_info['pause_ms']} ms, writes "
              f"{benchmark.extra_info['write_s']} s, sizes {benchmark.extra_info['checkpoint_mb']}"
              f" MB, first write {first_mb_s:.1f} MB/s")
        dc.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("replay", [0, 10, 40])
def test_recovery_time(benchmark, replay):
    d = tempfile.mkdtemp(prefix="dbsp-bench-recover-")
    try:
        c, t, dc = _build(d)
        _grow(d, t, dc, 10)
        dc.checkpoint()
        t_live = time.perf_counter()
        for i in range(replay):
            t.push(_batch(1000 + i).slice(0, 10_000))
            dc.step()
        live = time.perf_counter() - t_live  # the same steps run live (logging included)
        dc.circuit.close()  # as a crash would: nothing more is checkpointed

        def recover():
            c2, _, dc2 = _build(d)
            t0 = time.perf_counter()
            dc2.open()
            dt = time.perf_counter() - t0
            assert dc2.replayed == replay
            dc2.circuit.close()
            return dt

        benchmark.group = "recovery"
        secs = []
        benchmark.pedantic(lambda: secs.append(recover()), rounds=3, iterations=1)
        benchmark.extra_info.update(replayed_steps=replay,
                                    recovery_s=[round(s, 3) for s in secs],
                                    live_steps_s=round(live, 3))
        print(f"\nrecovery with {replay} steps replayed: {[round(s, 3) for s in secs]} s "
              f"(the same steps live: {live:.3f} s)")
    finally:
        shutil.rmtree(d, ignore_errors=True)

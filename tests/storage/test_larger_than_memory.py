"""State 4x the memory budget: the join + per-category average workload runs to the right answer
with the process's peak RSS within the budget plus a measured fixed overhead (and its merge
helper's private memory within a stated bound).

Three subprocesses of ``ltm_workload.py``, each reporting its own peak RSS (``VmHWM``: the
``ru_maxrss`` of a child carries its spawner's high-water mark across ``exec``, i.e. pytest's):

1. ``memory``: the workload without storage: the expected result and the state's size;
2. ``baseline``: the fixed overhead: interpreter, pyarrow, numpy, dbsp, a circuit with storage
   and its slab pool touched whole, three steps of the same size on a small state;
3. ``disk``: the workload with ``StorageConfig(memory_budget_bytes=BUDGET)``.

Measured here (2 vCPU AMD EPYC; 6M bids, 100K auctions, 100 steps, 32 MiB budget, uring):
state 176-183 MiB (5.5-5.7x the budget; taken at the end, mid-merge), in-memory peak RSS
489-583 MiB in 0.8-1.1 s; fixed overhead 140-141 MiB (of which the 8 MiB slab pool, also part of
the budget); on disk, peak RSS 171-173 MiB in 1.9-2.1 s, plus the merge helper process's
private memory, 57-66 MiB at its peak (about 40 MiB of it the inherited heap pages it writes in
its first merge; see :mod:`dbsp.trace.merge_helper`). The check allows ``TRANSIENT_MIB``
(24 MiB) above budget + fixed overhead for the circuit's process (a step's working set over the
large state while a background merge runs) and ``HELPER_MIB`` (80 MiB) for the helper. With
``merge_process_rows=None`` (merges in the merger thread, ``ltm_workload.py --no-merge-helper``)
the process peaks at 182 MiB with no helper, in 2.5-2.9 s. Without ``limit_allocators`` the
peak is near 235 MiB: glibc's dynamic mmap threshold and mimalloc keep freed memory.

On a 2 vCPU Intel Xeon, after the spill order changed (never-probed batches first): state
156-157 MiB, in memory 538-556 MiB in 1.1-1.4 s, fixed overhead 160 MiB, on disk 191-201 MiB in
2.0-2.1 s (limit 216), helper 60-62 MiB. Later (installed wheel, the CI set-up; 6 runs): in
memory 517-542 MiB, fixed overhead 159-173 MiB, on disk 187-209 MiB, helper 52-64 MiB: above the
fixed overhead, disk + helper 81-104 MiB against 173-191 MiB for half the in-memory cost.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BIDS, AUCTIONS, STEPS = 6_000_000, 100_000, 100
BUDGET_MIB = 32
TRANSIENT_MIB = 24
HELPER_MIB = 80
MiB = 1 << 20


def _run(mode: str, tmp, backend: str = "auto") -> dict:
    cmd = [sys.executable, os.path.join(HERE, "ltm_workload.py"), mode, "--bids", str(BIDS),
           "--auctions", str(AUCTIONS), "--steps", str(STEPS), "--budget-mib", str(BUDGET_MIB),
           "--backend", backend, "--dir", str(tmp / mode)]
    env = dict(os.environ)
    env.pop("DBSP_TUNE_MALLOC", None)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


@pytest.mark.slow
def test_state_four_times_the_budget_runs_within_budget_plus_overhead(tmp_path):
    mem = _run("memory", tmp_path)
    base = _run("baseline", tmp_path)
    disk = _run("disk", tmp_path)
    budget = BUDGET_MIB * MiB
    report = (f"state {mem['state_bytes'] / MiB:.0f} MiB; in memory: peak {mem['maxrss'] / MiB:.0f}"
              f" MiB in {mem['seconds']:.1f} s; fixed overhead {base['maxrss'] / MiB:.0f} MiB; on "
              f"disk (budget {BUDGET_MIB} MiB): peak {disk['maxrss'] / MiB:.0f} MiB in "
              f"{disk['seconds']:.1f} s, {disk['files_written']} files written, accountant "
              f"{disk['storage']}; merge helpers {disk['helpers']}")
    print(report)
    assert mem["state_bytes"] >= 4 * budget, report
    assert disk["result"] == mem["result"], report
    assert len(disk["result"]) == 100
    assert disk["files_written"] > 0 and disk["storage"]["spills"] > 0, report
    assert disk["maxrss"] <= budget + base["maxrss"] + TRANSIENT_MIB * MiB, report
    # the merge helper process (dbsp.trace.merge_helper) adds its private memory: a fixed
    # part (inherited heap pages it writes) plus one merge's rounds, bounded by HELPER_MIB
    helper = sum(h["private_peak_bytes"] for h in disk["helpers"])
    assert disk["helpers"] and sum(h["jobs"] for h in disk["helpers"]) > 0, report
    assert helper <= HELPER_MIB * MiB, report
    # and storage at least halves what the state costs above the fixed overhead (comparing whole
    # peaks, overhead included on both sides, left a few MiB of margin and failed 1 run in 3)
    base_rss = base["maxrss"]
    assert disk["maxrss"] - base_rss + helper < (mem["maxrss"] - base_rss) / 2, report

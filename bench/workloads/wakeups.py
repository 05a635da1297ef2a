# Run:  python bench/workloads/wakeups.py [--runtimes processes,launcher] [--steps 200]
#       python bench/workloads/wakeups.py --wake-only      (the machine's cost of a wake-up)
#       A/B: the same with PYTHONPATH=<other tree>/src (alternate them; per-thread figures)
"""Where a second worker process's CPU goes: per thread, per step (issue 13, task proc13).

For the ``processes`` and ``launcher`` runtimes at W = 1 and W = 2 on ``join_avg`` steps, every
thread of every process (the driver, each worker's main thread, the spines' merger threads) is
read from ``/proc/<pid>/task/<tid>/schedstat`` and ``status`` before and after ``--steps``
steps (settled at both edges, as :mod:`_efficiency` does): CPU (ns resolution, not clock
ticks), time spent runnable but waiting for a CPU (the machine's load), and voluntary
context switches (a wait: a blocking receive, a lock, the GIL) a step.

``--wake-only`` (and the first table of a full run) measures what one wake-up costs on this
machine: a process blocks on a socket, its peer sends one byte after ``gap`` seconds, and the
woken process then encodes one small wire message (the exchange's 1.7 KB of aggregate
partials). Printed: the CPU of the blocking receive (the kernel's wake-up path, charged to the
woken thread) and of the encode right after it, against the same encode run hot.

Measured on the 2-vCPU VM (main 65ec283, load 2-6 from other sessions), 10K events a step:

* a wake-up: the blocking receive costs 13-28 us CPU, the 1.5 us encode after it 7-50 us
  (cold caches and TLB after the vCPU idled): 30-80 us of CPU a wake-up, none of it in the
  transport's code; a sender's ``sendmsg`` to a sleeping peer costs ~20 us of system time
  (the wake-up's inter-processor interrupt);
* voluntary switches a step (all threads): processes 0.4 (W = 1) -> 3.3 (W = 2), launcher
  1.5 -> 4.8; the worker main threads' CPU a step: processes 1.1 ms (W = 1, driver) -> 1.3 +
  1.0 ms, launcher 1.3 ms -> 1.3 + 1.25 ms, where their instructions drop to 0.67 of W = 1
  each (``callgrind_launcher.py``: 5.76M -> 3.87M a worker): at W = 2 each process runs at
  about two thirds of the instructions a microsecond of W = 1;
* the transport itself, 4 ``sendmsg`` and 8 ``recvfrom`` a step (processes, W = 2; strace -c
  -f over 80 extra steps); the step message (a worker's input, 118 KB) encodes in 10 us and
  decodes in 13 us hot, the exchange's 1.7 KB message in 1.5 / 3 us.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _efficiency as E  # noqa: E402


def _threads(pid: int) -> dict:
    """``{(pid, tid): (name, cpu ns, runnable-wait ns, voluntary, involuntary)}``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait, _ = (int(x) for x in f.read().split())
            vol = inv = 0
            name = "?"
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("voluntary_ctxt_switches"):
                        vol = int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches"):
                        inv = int(line.split()[1])
            out[(pid, int(tid))] = (name, run, wait, vol, inv)
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass  # a thread that ended meanwhile
    return out


def per_thread(runtime: str, workers: int, events: int, steps: int) -> list[tuple]:
    """Per thread ``(pid, name, cpu us, runnable-wait us, voluntary, involuntary)`` a step."""
    data = E.steps_of("join_avg", events, steps + 3)
    circuit, job, one = E.open_run(runtime, "join_avg", workers)
    try:
        for st in data[:3]:
            one(st)
        E.settle(circuit)
        pids = E.pids_of(circuit, runtime)
        a = {k: v for p in pids for k, v in _threads(p).items()}
        for st in data[3:]:
            one(st)
        E.settle(circuit)
        b = {k: v for p in pids for k, v in _threads(p).items()}
    finally:
        (job or circuit).close()
    rows = []
    for k, (name, run, wait, vol, inv) in sorted(b.items()):
        _, run0, wait0, vol0, inv0 = a.get(k, (name, 0, 0, 0, 0))
        rows.append((k[0], name, (run - run0) / steps / 1e3, (wait - wait0) / steps / 1e3,
                     (vol - vol0) / steps, (inv - inv0) / steps))
    return rows


def wake_cost(gaps=(0.0, 0.0005, 0.002, 0.01), n: int = 200) -> list[tuple]:
    """Per ``gap``: medians of (CPU of the blocking receive, CPU of one encode after it) and
    the encode's CPU hot, in us (see the module doc)."""
    import numpy as np
    from dbsp.storage import wire
    obj = (6, (np.zeros((4, 51), np.uint64), [(8, True, False)]))
    out = []
    for gap in gaps:
        a, b = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(n):
                    time.sleep(gap)
                    a.send(b"x")
            finally:
                os._exit(0)
        waits, encs = [], []
        for _ in range(n):
            c = time.thread_time()
            b.recv(1)
            c1 = time.thread_time()
            wire.dumps(obj)
            encs.append(time.thread_time() - c1)
            waits.append(c1 - c)
        os.waitpid(pid, 0)
        a.close()
        b.close()
        c = time.thread_time()
        for _ in range(n):
            wire.dumps(obj)
        hot = (time.thread_time() - c) / n
        waits.sort()
        encs.sort()
        out.append((gap, waits[n // 2] * 1e6, encs[n // 2] * 1e6, hot * 1e6))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtimes", default="processes,launcher")
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--wake-only", action="store_true")
    a = ap.parse_args()
    print("a wake-up (us CPU, medians): gap, blocking receive, encode after it, encode hot")
    for gap, w, e, h in wake_cost():
        print(f"  {gap * 1e3:5.1f} ms {w:8.1f} {e:8.1f} {h:8.1f}")
    if a.wake_only:
        return
    print(f"\njoin_avg {a.events} ev/step x{a.steps}, load {os.getloadavg()[0]:.1f}: per thread a "
          f"step (CPU us, runnable-waiting us, voluntary / involuntary switches)")
    for rt in a.runtimes.split(","):
        for w in (1, 2):
            rows = per_thread(rt, w, a.events, a.steps)
            tot = [sum(r[i] for r in rows) for i in (2, 3, 4, 5)]
            print(f"{rt} W={w}: CPU {tot[0]:.0f} us, waiting for a CPU {tot[1]:.0f} us, "
                  f"switches {tot[2]:.2f} / {tot[3]:.2f}")
            for pid, name, cpu, wait, vol, inv in rows:
                if cpu > 5 or vol > 0.02:
                    print(f"    pid {pid} {name[:15]:15s} {cpu:7.0f} {wait:7.0f} {vol:6.2f} "
                          f"{inv:6.2f}")


if __name__ == "__main__":
    main()

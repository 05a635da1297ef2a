# Run:  pytest bench/workloads/bench_mesh.py --benchmark-only -s
"""The authenticated TCP mesh between worker processes (issue 13).

* ``test_exchange_step``: one exchange of the mesh (2 processes on loopback, each sending one
  part to the other and receiving one) for an empty part, 1,000 rows (three int64 columns as an
  Arrow batch, ~24 KB) and 1 MB per peer. The process on the other end runs the same loop, so
  the figure is a full step's exchange.
* ``test_parallel_efficiency``: CPU seconds (user + system, over the driver and every worker
  process) of the launcher with W = 2 over W = 1 on the same work, the keyed-count aggregate
  at steps of 10K and 100K events (the launcher row of ``bench_efficiency.py``, which has the
  other runtimes and workloads). This 2-core machine cannot show a wall-clock speed-up, but
  the CPU ratio says how much extra work two workers do (exchange, split, merge): 1.0 is
  perfect. Warm-up steps (imports, first allocation) are outside the count.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time

import numpy as np
import pyarrow as pa
import pytest

from _efficiency import efficiency, report
from dbsp.runtime.socket_transport import MeshAuth, tcp_mesh

ROUNDS = int(os.environ.get("DBSP_BENCH_MESH_ROUNDS", 2000))


def _part(kind: str):
    if kind == "empty":
        return None
    n = 1000 if kind == "1K rows" else (1 << 20) // 24
    x = np.arange(n, dtype=np.int64)
    return pa.record_batch({"a": x, "b": x * 2, "c": x * 3})


def _peer(addrs, auth, kind, rounds, listener_port):
    lst = socket.create_server(("127.0.0.1", listener_port))
    t = tcp_mesh(1, addrs, auth, listener=lst)
    part = _part(kind)
    for _ in range(rounds):
        t.exchange(1, [part, None])
    t.close()


@pytest.mark.parametrize("kind", ["empty", "1K rows", "1 MB"])
def test_exchange_step(benchmark, kind):
    auth = MeshAuth.new()
    l0 = socket.create_server(("127.0.0.1", 0))
    probe = socket.create_server(("127.0.0.1", 0))
    port1 = probe.getsockname()[1]
    probe.close()
    addrs = [f"127.0.0.1:{l0.getsockname()[1]}", f"127.0.0.1:{port1}"]
    rounds = ROUNDS if kind != "1 MB" else max(ROUNDS // 10, 50)
    ctx = mp.get_context("fork")
    warm = 20
    proc = ctx.Process(target=_peer, args=(addrs, auth, kind, rounds + warm, port1))
    proc.start()
    t = tcp_mesh(0, addrs, auth, listener=l0)
    part = _part(kind)
    for _ in range(warm):
        t.exchange(0, [None, part])
    times = []

    def one():
        t0 = time.perf_counter()
        t.exchange(0, [None, part])
        times.append(time.perf_counter() - t0)

    benchmark.pedantic(one, rounds=rounds, iterations=1)
    t.close()
    proc.join(timeout=60)
    med = float(np.median(times))
    benchmark.extra_info.update(median_ms=med * 1e3, p90_ms=float(np.quantile(times, .9)) * 1e3)
    print(f"\nmesh exchange, {kind} per peer: median {med * 1e3:.3f} ms, "
          f"p90 {np.quantile(times, .9) * 1e3:.3f} ms over {rounds} steps")


@pytest.mark.parametrize("step_events", [10_000, 100_000])
def test_parallel_efficiency(benchmark, step_events):
    """The launcher's row of ``bench_efficiency.py`` (the keyed count), kept here under the
    name issue 13 gave it."""
    steps = int(os.environ.get("DBSP_BENCH_EFF_STEPS", 40 if step_events == 10_000 else 10))
    out: list = []
    benchmark.pedantic(lambda: out.append(efficiency("launcher", "keyed_count", step_events,
                                                     steps, 3)), rounds=1, iterations=1)
    r = out[0]
    benchmark.extra_info.update(cpu_ratio_w2_over_w1=r["cpu_ratio"], runs=r["ratios"],
                                floor=r["floor"], speedup=r["speedup"], ceiling=r["ceiling"])
    print("\n" + report(r))

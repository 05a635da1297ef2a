# Compare: pytest bench/micro/bench_spine.py --benchmark-only --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""The spine: inserting 1,000 batches of 10K rows (10M rows), key lookups and cursor walks in a
10M-row spine, and the merger's threading (shared pool vs a thread per spine).

Batches are ``OrdIndexedZSet`` with an int64 key drawn from ``[0, 1e9)`` (u64 codes) and an
int64 value in ``[0, 1000)``, all weights 1, fixed seeds, built before timing. Groups:

* ``spine-insert``: one spine, 1,000 inserts then ``flush()`` (every owed merge done), for
  ``foreground`` (merges inside ``insert``, the synchronous spine), ``background-1`` and
  ``background-2`` (a private merger of 1 or 2 threads). The time is insert + flush, so
  ``rows_per_s`` is sustained throughput; ``insert_rows_per_s`` is until the last ``insert``
  returned and ``insert_p99_ms`` the insert latency (backpressure included).
* ``spine-lookup``: ``lookup`` of 1,000 sorted distinct keys (half present) in the 10M-row spine,
  as the merges leave it (a few batches) and compacted to one batch.
* ``spine-cursor``: a ``SpineCursor`` walking 100K keys, and seeking 1,000 sorted keys.
* ``spine-threads``: 8 spines fed round-robin with 400 batches (4M rows): one shared merger
  thread, two shared threads, or a thread per spine.

Set ``DBSP_BENCH_SPINE_BATCHES`` for a smaller run (the lookup spine shrinks with it).
``extra_info``: ``rows_per_s`` (or ``keys_per_s``), merge statistics, ``rss_growth_MB``.
"""
from __future__ import annotations

import os
import time

import numpy as np
import psutil
import pyarrow as pa
import pytest

from dbsp.trace.batch import OrdIndexedZSet
from dbsp.trace.spine_cursor import SpineCursor
from dbsp.trace.spine import Merger, Spine

BATCHES = int(os.environ.get("DBSP_BENCH_SPINE_BATCHES", "1000"))
ROWS = 10_000
KS = pa.schema([pa.field("k", pa.int64(), nullable=False)])
VS = pa.schema([pa.field("v", pa.int64(), nullable=False)])


def make_batches(n: int, seed: int) -> list[OrdIndexedZSet]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = pa.array(rng.integers(0, 10 ** 9, ROWS))
        v = pa.array(rng.integers(0, 1000, ROWS))
        out.append(OrdIndexedZSet.from_parts(pa.record_batch([k], schema=KS),
                                             pa.record_batch([v], schema=VS),
                                             np.ones(ROWS, np.int64)))
    return out


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2 ** 20


@pytest.fixture(scope="module")
def batches():
    return make_batches(BATCHES, seed=42)


@pytest.mark.parametrize("mode", ["foreground", "background-1", "background-2"])
def test_insert(benchmark, batches, mode):
    benchmark.group = "spine-insert"
    runs: list[dict] = []

    def run():
        merger = Merger(int(mode[-1]), name=f"bench-{mode}") if mode != "foreground" else None
        sp = Spine(name="bench", background=merger is not None, merger=merger)
        lat = np.empty(len(batches))
        rss0 = rss_mb()
        t0 = time.perf_counter()
        for i, b in enumerate(batches):
            a = time.perf_counter()
            sp.insert(b)
            lat[i] = time.perf_counter() - a
        t1 = time.perf_counter()
        sp.flush()
        t2 = time.perf_counter()
        runs.append(dict(insert_s=t1 - t0, total_s=t2 - t0, lat=lat, stats=sp.stats.as_dict(),
                         batches=sp.num_batches, rss=rss_mb() - rss0))
        sp.close()
        if merger is not None:
            merger.shutdown()

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=0)
    best = min(runs, key=lambda r: r["total_s"])
    rows = len(batches) * ROWS
    s = best["stats"]
    benchmark.extra_info.update(
        rows=rows, rows_per_s=rows / best["total_s"], insert_rows_per_s=rows / best["insert_s"],
        insert_p50_ms=float(np.median(best["lat"]) * 1e3),
        insert_p99_ms=float(np.percentile(best["lat"], 99) * 1e3),
        insert_max_ms=float(best["lat"].max() * 1e3), merges=s["merges"],
        rows_merged=s["rows_in"], merge_seconds=s["merge_seconds"],
        blocked_seconds=s["blocked_seconds"], batches_at_end=best["batches"],
        rss_growth_MB=best["rss"])


@pytest.fixture(scope="module")
def big_spine(batches):
    sp = Spine(name="lookup")
    for b in batches:
        sp.insert(b)
    sp.flush()
    keys = np.concatenate([b.kcodes for b in batches[:: max(1, len(batches) // 100)]])
    yield sp, keys
    sp.close()


def probe_codes(present_from: np.ndarray, seed: int, n: int = 1000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    present = rng.choice(present_from, n // 2, replace=False)
    absent = OrdIndexedZSet.from_parts(
        pa.record_batch([pa.array(rng.integers(0, 10 ** 9, n - n // 2))], schema=KS),
        pa.record_batch([pa.array(np.zeros(n - n // 2, np.int64))], schema=VS),
        np.ones(n - n // 2, np.int64)).kcodes
    return np.unique(np.concatenate([present, absent]))


@pytest.mark.parametrize("shape", ["levels", "compacted"])
def test_lookup(benchmark, big_spine, shape):
    benchmark.group = "spine-lookup"
    sp, keys = big_spine
    if shape == "compacted":
        sp.compact()
    probe = probe_codes(keys, seed=3)
    found = sp.lookup(probe)
    assert found is not None and found.num_keys >= len(probe) // 2 - 5
    benchmark.pedantic(lambda: sp.lookup(probe), rounds=50, iterations=1, warmup_rounds=2)
    benchmark.extra_info.update(
        spine_rows=len(sp), spine_batches=sp.num_batches, probe_keys=len(probe),
        keys_found=found.num_keys, keys_per_s=len(probe) / benchmark.stats.stats.median)


@pytest.mark.parametrize("op", ["walk-100K", "seek-1K"])
def test_cursor(benchmark, batches, op):
    benchmark.group = "spine-cursor"
    sp = Spine(name="cursor", max_merge=4)
    for b in batches[:min(len(batches), 100)]:
        sp.insert(b)
    sp.flush()
    snap = sp.batches()
    probe = np.sort(probe_codes(np.concatenate([b.kcodes for b in snap]), seed=5)).tolist()

    def walk():
        c = SpineCursor(snap)
        n = 0
        while c.key_valid() and n < 100_000:
            while c.val_valid():
                c.weight()
                c.step_val()
            c.step_key()
            n += 1
        return n

    def seek():
        c = SpineCursor(snap)
        hits = 0
        for code in probe:
            c.seek_key_code(code)
            hits += c.key_valid() and c.key_code() == code
        return hits

    fn = walk if op == "walk-100K" else seek
    n = fn()
    benchmark.pedantic(fn, rounds=5, iterations=1, warmup_rounds=1)
    keys = n if op == "walk-100K" else len(probe)
    benchmark.extra_info.update(spine_batches=len(snap), keys=keys,
                                keys_per_s=keys / benchmark.stats.stats.median)
    sp.close()


@pytest.mark.parametrize("threads", ["shared-1", "shared-2", "per-spine"])
def test_threads(benchmark, batches, threads):
    benchmark.group = "spine-threads"
    nspines, feed = 8, batches[:min(len(batches), 400)]

    def run():
        if threads == "per-spine":
            mergers = []
            spines = [Spine.with_own_thread(name=f"s{i}") for i in range(nspines)]
        else:
            mergers = [Merger(int(threads[-1]), name=f"bench-{threads}")]
            spines = [Spine(name=f"s{i}", merger=mergers[0]) for i in range(nspines)]
        for j, b in enumerate(feed):
            spines[j % nspines].insert(b)
        for sp in spines:
            sp.flush()
        for sp in spines:
            sp.close()
        for m in mergers:
            m.shutdown()

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=0)
    rows = len(feed) * ROWS
    benchmark.extra_info.update(rows=rows, spines=nspines,
                                rows_per_s=rows / benchmark.stats.stats.min)

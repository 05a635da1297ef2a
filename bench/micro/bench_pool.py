# Compare: pytest bench/micro/bench_pool.py --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Slab buffer pool (``dbsp._native.slab_pool``): hit-path lookups and eviction policies.

Groups:

* ``pool-hit``: lookups of resident blocks from Python: one ``lookup`` call per block (each
  makes a pinning ``BlockRef`` and drops it), and ``acquire_many`` over 1024 blocks at a time.
  Target: >= 1M lookups/s per call style. ``extra_info["lookups_per_s"]``.
* ``pool-policy``: hit rates of s3fifo / clock / lru replayed (``SlabPool.simulate``, the same
  code paths as real lookups) on fixed-seed traces over 100k blocks: Zipf 0.8, 1.0 and 1.2, and
  Zipf 1.0 mixed with one-off sequential scans (a cursor scanning a cold layer while joins probe
  hot keys), at cache sizes of 1%, 5% and 20% of the blocks. ``extra_info`` holds every hit
  rate; the benchmark time is the replay speed.

Without pytest-benchmark, ``python bench/micro/bench_pool.py`` prints the same figures.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from dbsp._native.slab_pool import POLICIES, SlabPool

SEED = 7
UNIVERSE = 100_000
TRACE = 1_000_000
SIZES = (0.01, 0.05, 0.20)


def zipf_trace(alpha: float, n: int = TRACE, universe: int = UNIVERSE, seed: int = SEED):
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, universe + 1, dtype=np.float64)
    p = ranks ** -alpha
    p /= p.sum()
    keys = rng.choice(universe, size=n, p=p)
    perm = rng.permutation(universe)          # hot keys spread over the key space
    return perm[keys].astype(np.uint64)


def scan_mixed_trace(seed: int = SEED):
    """Zipf 1.0 point lookups interleaved with sequential scans of never-reused blocks."""
    rng = np.random.default_rng(seed + 1)
    pts = zipf_trace(1.0, TRACE // 2, seed=seed + 2)
    out = []
    next_scan = UNIVERSE          # scan blocks live beyond the point-lookup universe
    i = 0
    while i < len(pts):
        k = int(rng.integers(500, 5000))
        out.append(pts[i:i + k])
        i += k
        s = int(rng.integers(200, 5000))
        out.append(np.arange(next_scan, next_scan + s, dtype=np.uint64))
        next_scan += s
    return np.concatenate(out)


TRACES = {
    "zipf0.8": lambda: zipf_trace(0.8),
    "zipf1.0": lambda: zipf_trace(1.0),
    "zipf1.2": lambda: zipf_trace(1.2),
    "zipf1.0+scans": scan_mixed_trace,
}


def hit_rates(trace: np.ndarray, universe: int = UNIVERSE) -> dict:
    files = np.ones(len(trace), dtype=np.uint64)
    out = {}
    for frac in SIZES:
        slots = max(8, int(universe * frac))
        for pol in POLICIES:
            pool = SlabPool(slots * 4096, 4096, pol)
            out[f"{pol}@{int(frac * 100)}%"] = pool.simulate(files, trace) / len(trace)
    return out


def _hot_pool(n_blocks: int = 4096):
    pool = SlabPool(n_blocks * 4096, 4096)
    f = pool.register_file()
    for b in range(n_blocks):
        st, slot = pool.acquire(f, b)
        pool.complete(slot, 4096)
    return pool, f


@pytest.mark.benchmark(group="pool-hit")
def test_lookup_hit_python_loop(benchmark):
    pool, f = _hot_pool()
    blocks = np.random.default_rng(SEED).integers(0, 4096, 200_000).tolist()
    lookup = pool.lookup

    def run():
        for b in blocks:
            lookup(f, b)
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    rate = len(blocks) / benchmark.stats.stats.median
    benchmark.extra_info["lookups_per_s"] = rate
    benchmark.extra_info["target_per_s"] = 1e6
    assert pool.stats()["pinned"] == 0


@pytest.mark.benchmark(group="pool-hit")
def test_lookup_hit_acquire_many(benchmark):
    pool, f = _hot_pool()
    batches = [np.random.default_rng(SEED + k).integers(0, 4096, 1024).astype(np.uint64)
               for k in range(200)]

    def run():
        for b in batches:
            refs, status, slots = pool.acquire_many(f, b)
            del refs
    benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    rate = 1024 * len(batches) / benchmark.stats.stats.median
    benchmark.extra_info["lookups_per_s"] = rate
    benchmark.extra_info["target_per_s"] = 1e6


@pytest.mark.benchmark(group="pool-policy")
@pytest.mark.parametrize("trace_name", sorted(TRACES))
def test_policy_hit_rates(benchmark, trace_name):
    trace = TRACES[trace_name]()
    rates = {}

    def run():
        rates.update(hit_rates(trace))
    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info.update({k: round(v, 4) for k, v in rates.items()})
    benchmark.extra_info["replays_per_s"] = len(trace) * len(SIZES) * len(POLICIES) / \
        benchmark.stats.stats.median


def main():
    pool, f = _hot_pool()
    blocks = np.random.default_rng(SEED).integers(0, 4096, 1_000_000).tolist()
    lookup = pool.lookup
    t = time.perf_counter()
    for b in blocks:
        lookup(f, b)
    dt = time.perf_counter() - t
    print(f"pool hit, Python loop: {len(blocks) / dt / 1e6:.2f} M lookups/s")
    print(f"{'trace':<16}" + "".join(f"{p + '@' + str(int(s * 100)) + '%':>14}"
                                      for s in SIZES for p in POLICIES))
    for name in sorted(TRACES):
        r = hit_rates(TRACES[name]())
        print(f"{name:<16}" + "".join(f"{r[p + '@' + str(int(s * 100)) + '%']:>14.4f}"
                                      for s in SIZES for p in POLICIES))


if __name__ == "__main__":
    main()

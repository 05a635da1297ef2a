# Compare: pytest bench/workloads/bench_nexmark_generator.py --benchmark-autosave
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""Throughput of the Nexmark event generator (``dbsp.nexmark.generator``), fixed seed.

The generator feeds every Nexmark workload, so it must not be the bottleneck: the target is
>= 5M events/s on one core for the numeric columns.  Groups:

* ``nexmark-generate``: full events (numeric and string columns) as Arrow record batches, for
  several chunk sizes (events per ``generate`` call).
* ``nexmark-generate-numeric``: numeric columns only (``generate_numeric``).

Each benchmark generates ``EVENTS`` events; ``extra_info`` records events/s (from the median)
and the bytes of Arrow data produced per event.  Without pytest-benchmark,
``python bench/workloads/bench_nexmark_generator.py`` prints the same figures.
"""

from __future__ import annotations

import sys
import time

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

from dbsp.nexmark import NexmarkGenerator

SEED = 42
EVENTS = 1_000_000
CHUNKS = (10_000, 100_000, 1_000_000)


@pytest.fixture(scope="module")
def gen() -> NexmarkGenerator:
    g = NexmarkGenerator(seed=SEED)
    g.generate(0, 1000)  # warm up pools and kernels
    return g


def _full(gen: NexmarkGenerator, chunk: int) -> int:
    nbytes = 0
    for batch in gen.iter_batches(EVENTS, chunk):
        nbytes += batch.person.nbytes + batch.auction.nbytes + batch.bid.nbytes
    return nbytes


def _numeric(gen: NexmarkGenerator, chunk: int) -> int:
    nbytes = 0
    for start in range(0, EVENTS, chunk):
        cols = gen.generate_numeric(start, min(chunk, EVENTS - start))
        nbytes += sum(a.nbytes for kind in cols.values() for a in kind.values())
    return nbytes


def _record(benchmark: BenchmarkFixture, nbytes: int) -> None:
    stats = benchmark.stats.stats if benchmark.stats else None
    if stats is not None:
        benchmark.extra_info["events_per_s"] = round(EVENTS / stats.median)
    benchmark.extra_info["bytes_per_event"] = round(nbytes / EVENTS, 1)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_generate(benchmark: BenchmarkFixture, gen: NexmarkGenerator, chunk: int) -> None:
    benchmark.group = "nexmark-generate"
    nbytes = benchmark.pedantic(_full, args=(gen, chunk), rounds=3, iterations=1)
    _record(benchmark, nbytes)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_generate_numeric(
    benchmark: BenchmarkFixture, gen: NexmarkGenerator, chunk: int
) -> None:
    benchmark.group = "nexmark-generate-numeric"
    nbytes = benchmark.pedantic(_numeric, args=(gen, chunk), rounds=3, iterations=1)
    _record(benchmark, nbytes)


def main() -> None:
    g = NexmarkGenerator(seed=SEED)
    g.generate(0, 1000)
    for name, fn in (("full", _full), ("numeric", _numeric)):
        for chunk in CHUNKS:
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                nbytes = fn(g, chunk)
                best = min(best, time.perf_counter() - t0)
            print(
                f"{name:8s} chunk={chunk:>9,d}: {EVENTS / best / 1e6:6.2f}M events/s "
                f"({nbytes / EVENTS:.1f} bytes/event)",
                file=sys.stdout,
            )


if __name__ == "__main__":
    main()

# Compare: pytest bench/micro/bench_strings.py --benchmark-only
#          pytest-benchmark compare --group-by=group --columns=min,median,ops
"""String kernels of the expression API on Nexmark bid URLs (100K events, fixed seed).

Group ``split_part``: ``dbsp.algebra.strings.split_part`` by the native kernel
(``dbsp._native.strings``: memchr per row, one copy of the pieces) beside the Arrow-compute
path it replaced (``split_pattern`` + list flatten + take), for the parts q22 asks for.
``extra_info``: rows per second from the median.
"""
from __future__ import annotations

import pytest

from dbsp.algebra import strings as S
from dbsp.nexmark import NexmarkGenerator

URLS = NexmarkGenerator(seed=42).generate(0, 100_000).bid.column("url")


@pytest.mark.benchmark(group="split_part")
@pytest.mark.parametrize("index", [3, 5])
@pytest.mark.parametrize("path", ["native", "arrow"])
def test_split_part(benchmark, path, index):
    if path == "native" and S._native_strings is None:
        pytest.skip("dbsp._native.strings is not built")
    fn = {"native": lambda: S._split_part_native(URLS, b"/", index),
          "arrow": lambda: S._split_part_arrow(URLS, "/", index)}[path]
    out = benchmark(fn)
    assert out.equals(S._split_part_arrow(URLS, "/", index))
    benchmark.extra_info["rows_per_s"] = len(URLS) / benchmark.stats.stats.median

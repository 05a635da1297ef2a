"""Process allocator policy: one place that sets glibc's ``mallopt`` knobs, with two policies.

* **throughput** (:func:`tune_malloc`, applied when a circuit starts): keep freed memory for
  reuse. Every step allocates and frees large arrays (sort permutations, gathered columns, merge
  outputs); by default glibc serves big blocks with fresh ``mmap`` calls and returns freed heap
  tops to the kernel, so each step pays page faults on memory it just gave back (15-50% of the
  Nexmark q4 step loop), and concurrent faults and ``munmap`` calls serialise on the process's
  memory-map lock. Sets the mmap threshold to 32 MiB and the trim threshold to 2 GiB.
* **bounded** (:func:`limit_allocator_retention`, applied by storage with a memory budget and
  ``limit_allocators=True``): return freed memory promptly so the RSS tracks live state (mmap
  threshold 256 KiB, trim 1 MiB, at most 2 arenas, Arrow on the system allocator); about 20%
  slower steps, but a budget means something.

Both policies also stop numpy from advising its large arrays onto transparent huge pages
(:func:`numpy_huge_pages`). numpy asks for them (``madvise(MADV_HUGEPAGE)``) on every array of
4 MiB or more. Where the kernel gives huge pages to advised memory (``enabled`` and
``defrag`` set to ``madvise``, the common default), each fault on such an array allocates,
defragmenting on demand, and zeroes a whole 2 MiB page; each merge's output arrays are new
memory. In a long join + average run (10K events a
step, 3,000 steps, one worker, threads runtime) the spines' merges then spent a quarter of all
CPU in the kernel (``perf``: huge page faults, ``clear_page_erms`` under
``do_huge_pmd_anonymous_page``); without the advice, three interleaved pairs of runs: system CPU
0.74-0.98 -> 0.28-0.37 ms a step, wall 1.93-2.20 -> 1.58-1.69 ms a step, page faults 77-87 ->
136-154 a step (small ones now). ``bench_join_avg_rate.py`` at 30M bids in 3,000 steps: 5.44 /
5.48 -> 6.00 / 6.16M events/s; at its default 10M bids no change (the big merges are fewer), and
``bench_memory.py``'s peak RSS the same (697 -> 688 MB).
The engine's own tables that gain from huge pages (the aggregate's hash table) ask for them
themselves. ``NUMPY_MADVISE_HUGEPAGE`` set in the environment is the user's choice and is kept.

Bounded wins: once a process is bounded, :func:`tune_malloc` leaves it alone, whatever the order
of the calls. ``DBSP_TUNE_MALLOC=0`` disables the throughput policy (e.g. in a host process that
must return memory to the kernel promptly).
"""
from __future__ import annotations

import os

from .libc import libc_function

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_policy: str | None = None  # None, "throughput" or "bounded"


def _mallopt(settings: dict[int, int]) -> bool:
    """Apply glibc ``mallopt`` settings; False where there is no glibc or one is refused."""
    mallopt = libc_function("mallopt")
    if mallopt is None:  # not glibc
        return False
    return all(mallopt(k, v) == 1 for k, v in settings.items())


def policy() -> str | None:
    """The policy in effect in this process (None: the allocators' defaults)."""
    return _policy


def tune_malloc() -> bool:
    """The throughput policy; returns whether it is in effect."""
    global _policy
    if _policy is not None:
        return _policy == "throughput"
    if os.environ.get("DBSP_TUNE_MALLOC", "1") == "0":
        return False
    if _mallopt({_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 2**31 - 1}):
        _policy = "throughput"
        numpy_huge_pages(False)
    return _policy == "throughput"


def limit_allocator_retention() -> bool:
    """The bounded policy (see the module doc); returns whether glibc accepted it."""
    global _policy
    if _policy == "bounded":
        return True
    _policy = "bounded"
    numpy_huge_pages(False)
    try:
        import pyarrow as pa
        pa.set_memory_pool(pa.system_memory_pool())
    except Exception:  # pragma: no cover - an Arrow build without it
        pass
    return _mallopt({_M_MMAP_THRESHOLD: 256 << 10, _M_TRIM_THRESHOLD: 1 << 20, _M_ARENA_MAX: 2})


def numpy_huge_pages(on: bool) -> bool | None:
    """Set whether numpy advises its large arrays onto transparent huge pages from now on (see
    the module doc); returns the setting before, or None when it is left as it is: the user set
    ``NUMPY_MADVISE_HUGEPAGE`` in the environment, or numpy has no such switch."""
    import numpy as np
    core = getattr(np, "_core", None) or getattr(np, "core", None)
    switch = getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)
    if switch is None or "NUMPY_MADVISE_HUGEPAGE" in os.environ:
        return None
    return bool(switch(bool(on)))


_trim = None  # libc's malloc_trim, looked up once (False: not glibc)


def release_free_memory() -> None:
    """Give the pages the allocators hold free back to the kernel: glibc's ``malloc_trim(0)``
    (under the throughput policy freed heap memory is kept, up to the 2 GiB trim threshold,
    and, fragmented between live blocks, counts in the RSS) and Arrow's pool
    (``release_unused``). A few milliseconds: meant before and after a merge of millions of
    rows, whose inputs, output and temporaries are the process's peak (see
    :mod:`dbsp.trace.spine`), not per step."""
    global _trim
    if _trim is None:
        _trim = libc_function("malloc_trim") or False
    if _trim:
        _trim(0)
    try:
        import pyarrow as pa
        pa.default_memory_pool().release_unused()
    except Exception:  # pragma: no cover - an Arrow build without it
        pass

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
    return _policy == "throughput"


def limit_allocator_retention() -> bool:
    """The bounded policy (see the module doc); returns whether glibc accepted it."""
    global _policy
    if _policy == "bounded":
        return True
    _policy = "bounded"
    try:
        import pyarrow as pa
        pa.set_memory_pool(pa.system_memory_pool())
    except Exception:  # pragma: no cover - an Arrow build without it
        pass
    return _mallopt({_M_MMAP_THRESHOLD: 256 << 10, _M_TRIM_THRESHOLD: 1 << 20, _M_ARENA_MAX: 2})


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

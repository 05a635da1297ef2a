"""Process memory tuning: keep freed memory for reuse instead of returning it to the kernel.

Every step allocates and frees large arrays (sort permutations, gathered columns, merge
outputs). glibc serves blocks above its mmap threshold with fresh ``mmap`` calls and returns
freed heap tops to the kernel, so each step pays page faults on memory it just gave back: on the
Nexmark q4 step loop that cost 15–50% of a worker's time, and concurrent faults and ``munmap``
calls serialise on the process's memory-map lock, which hurts worker threads most.

:func:`tune_malloc` raises the mmap threshold to its maximum (32 MiB) and the trim threshold to
2 GiB, once per process. It is called when a circuit starts. Set ``DBSP_TUNE_MALLOC=0`` to leave
the allocator alone (e.g. in a host process that must return memory to the kernel promptly).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_done = False


def tune_malloc() -> bool:
    """Apply the tuning (glibc only); returns whether it is in effect."""
    global _done
    if _done:
        return True
    if os.environ.get("DBSP_TUNE_MALLOC", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, 32 << 20) == 1 and mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1
    _done = ok
    return ok

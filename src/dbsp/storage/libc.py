"""The C library of this process, for the few calls the engine makes into it directly
(``prctl`` to name a thread, ``mallopt`` / ``malloc_trim`` for the allocator policy).

It is taken from the process's own symbols (``ctypes.CDLL(None)``): libc is always among them
where there is one. ``ctypes.util.find_library("c")`` would instead run ``ldconfig -p`` in a
child process, a fork of a possibly large process such as a Spark executor's Python worker, and
regex-search its output: 2 ms and 4.8M instructions, the first time a thread is named or a
circuit starts.
"""
from __future__ import annotations

import ctypes
import os
from typing import Any, Optional

_libc: Any = None  # looked up once; False: none here


def libc_function(name: str) -> Optional[Any]:
    """The C library's function ``name`` (a ctypes function with default int arguments and
    result), or None where this process has no such symbol (no glibc, not a POSIX system)."""
    global _libc
    if _libc is None:
        _libc = False
        if os.name == "posix":
            try:
                _libc = ctypes.CDLL(None)
            except OSError:  # pragma: no cover - a loader that cannot open the main program
                pass
    if not _libc:
        return None
    return getattr(_libc, name, None)


__all__ = ["libc_function"]

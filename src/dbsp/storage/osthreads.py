"""The kernel's name of a thread: what ``perf``, ``top -H``, ``py-spy`` and ``/proc`` show.

Python (before 3.14) keeps a thread's name to itself: every thread of the process reads
``python`` in ``perf report --sort comm`` or ``top -H``, so a spine's merger, a worker of the
threads runtime and the checkpoint writer cannot be told apart in a profile, nor in
``/proc/<pid>/task/<tid>/comm`` (which ``bench/workloads/wakeups.py`` reads per thread). Each
long-lived thread the engine starts calls :func:`name_os_thread` first, which gives the kernel
its Python name (Linux ``prctl(PR_SET_NAME)``, cut to the kernel's 15 bytes).
"""
from __future__ import annotations

import ctypes
import sys
import threading
from typing import Optional

from .libc import libc_function

_PR_SET_NAME = 15
_prctl = None  # libc's prctl, looked up once (False: none here)


def name_os_thread(name: Optional[str] = None) -> bool:
    """Name the calling thread in the kernel: ``name``, else its Python name (the first 15
    bytes of it). False where that is not possible (not Linux, no libc); never raises."""
    global _prctl
    if _prctl is None:
        _prctl = (libc_function("prctl") if sys.platform.startswith("linux") else None) or False
    if not _prctl:
        return False
    raw = (name if name is not None else threading.current_thread().name).encode(
        "utf-8", "replace")[:15]
    return _prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0


__all__ = ["name_os_thread"]

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

_PR_SET_NAME = 15
_prctl = None  # libc's prctl, looked up once (False: none here)


def name_os_thread(name: Optional[str] = None) -> bool:
    """Name the calling thread in the kernel: ``name``, else its Python name (the first 15
    bytes of it). False where that is not possible (not Linux, no libc); never raises."""
    global _prctl
    if _prctl is None:
        _prctl = False
        if sys.platform.startswith("linux"):
            # the process's own symbols, libc's among them: ``ctypes.util.find_library``
            # would run ``ldconfig -p`` in a child process (a fork of a large process, and
            # 4.8M instructions of regex over its output) the first time a thread is named
            try:
                _prctl = ctypes.CDLL(None).prctl
            except (OSError, AttributeError):
                pass
    if not _prctl:
        return False
    raw = (name if name is not None else threading.current_thread().name).encode(
        "utf-8", "replace")[:15]
    return _prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0


__all__ = ["name_os_thread"]

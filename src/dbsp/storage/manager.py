"""Per-worker storage: a worker's directory, its file names, the process's block backend and the
disk-space gate.

This is the bottom of the storage runtime and knows no batch, spine or operator: it hands out
file names and space, and reads blocks through one backend per process. What to put in files,
and when, is the spilling policy of the trace (:mod:`dbsp.trace.spill`, whose
:class:`~dbsp.trace.spill.SpineStorage` extends :class:`WorkerStorage` with the memory
accountant and the spine hooks).

Goals
-----
* One directory per worker (``<dir>/worker-<i>/``); temporaries (``*.mut``) left by a crash are
  removed when it is opened; new files get unique names (``b-<uuid>.dbsp``: immutable once
  written, so a checkpoint can list them).
* One backend (and slab pool) per process and configuration
  (:func:`dbsp.storage.backend.make_backend` with a ``config.cache`` pool): every worker of the
  process reads through it.
* A full disk stalls, then fails with a typed error: a merge that writes a file first reserves
  the space it may need (the size of its inputs) and waits, with backoff and a log line, until
  the file system has it, at most ``disk_wait_seconds`` (then :class:`DiskFull`).

*Allocators.* Freed memory that the allocators keep counts in the RSS as much as live state. With
``limit_allocators`` (the default) the first :class:`WorkerStorage` of a process applies the
*bounded* allocator policy of :mod:`dbsp.storage.memory`, so peak RSS tracks live memory (about
20% of step time; figures in ``tests/storage/test_larger_than_memory.py`` and
``bench/workloads/bench_storage.py``).

Invariants
----------
* ``reserved`` disk bytes are released when the reserving block ends, whatever its outcome.
* The per-process registries (backends) are rebuilt in a forked child: the parent's threads and
  rings are not the child's.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import logging
import os
import threading
import time
import uuid
from typing import Any, Iterator

from . import config as _config
from .backend import make_backend
from .config import StorageConfig, as_storage_config
from .format import bloom_params
from .memory import limit_allocator_retention

__all__ = ["WorkerStorage", "backend_for", "reserved_bytes", "on_fork", "DiskFull"]

log = logging.getLogger("dbsp.storage")

_MAX_BACKOFF = 2.0

# --- process-wide registries (rebuilt after a fork) -----------------------------------------------

_lock = threading.Lock()
_backends: dict = {}
_pid = os.getpid()
_fork_hooks: list = []


def on_fork(fn) -> None:
    """Call ``fn()`` in a forked child the first time it uses storage (registries of layers
    above, such as the trace's memory accountants, reset themselves this way)."""
    _fork_hooks.append(fn)


def _check_fork() -> None:
    global _pid, _lock
    if os.getpid() != _pid:  # a forked child: the parent's threads and rings are not ours
        _pid = os.getpid()
        _lock = threading.Lock()
        _backends.clear()
        for fn in _fork_hooks:
            fn()


def check_fork() -> None:
    """Reset the per-process registries if this is a forked child (see :func:`on_fork`)."""
    _check_fork()


def backend_for(config: StorageConfig):
    """The backend (and slab pool) that every file batch of this process using ``config``
    reads through."""
    _check_fork()
    with _lock:
        key = (config.backend, config.cache, config.block_size, config.direct)
        be = _backends.get(key)
        if be is None:
            if config.backend == "mmap":
                be = make_backend("mmap")
            else:
                be = make_backend(config.backend, budget=config.cache,
                                  slot_size=config.block_size, direct=config.direct)
            _backends[key] = be
        return be


# --- disk space -------------------------------------------------------------------------------------

class DiskFull(OSError):
    """The disk had no room for a file-writing merge within ``disk_wait_seconds``."""

_disk_lock = threading.Lock()
_reserved = 0


def reserved_bytes() -> int:
    """Disk bytes reserved by merges running now (in this process)."""
    return _reserved


# --- per-worker storage -----------------------------------------------------------------------------

class WorkerStorage:
    """One worker's view of the storage: its directory, file names, the shared backend and the
    disk-space gate (see the module doc). ``helper``: opened by a merge helper process, which
    shares the worker's directory (its temporaries are live, not left by a crash)."""

    def __init__(self, config: Any, worker: int = 0, helper: bool = False):
        config = as_storage_config(config)
        if config is None:
            raise ValueError("WorkerStorage needs a StorageConfig or a directory")
        self.config: StorageConfig = config
        self.worker = worker
        self.dir = os.path.join(config.dir, f"worker-{worker}")
        os.makedirs(self.dir, exist_ok=True)
        self.removed_temporaries = 0
        # (a merge helper process shares the parent's directory: its temporaries are live)
        for p in ([] if helper else glob.glob(os.path.join(self.dir, "*.mut"))):
            try:
                os.unlink(p)
                self.removed_temporaries += 1
            except FileNotFoundError:
                pass
        if config.limit_allocators:
            limit_allocator_retention()
        self.disk_waits = 0
        self.disk_wait_seconds = 0.0
        self.files_written = 0
        self.bytes_written = 0
        self._prepare()

    def _prepare(self) -> None:
        """Pay the one-time costs of writing and reading files now, at circuit start, not in
        the first merge of a running step: the Bloom parameters of the configured rate (a
        numeric search, ~15 ms) and the backend with its slab pool (ring set-up, one aligned
        allocation). Measured in the first spilling step of the storage workload: about 30% of
        its file-merge time was these (with the imports of the file modules, now module-level)."""
        if self.config.bloom_fpr is not None:
            bloom_params(self.config.bloom_fpr)
        self.backend  # noqa: B018 - built and cached per process

    def __repr__(self) -> str:
        return f"WorkerStorage({self.dir!r}, budget={self.config.memory_budget_bytes})"

    def __reduce__(self):  # a worker process rebuilds its own (own backend)
        return (type(self), (self.config, self.worker))

    @property
    def backend(self):
        return backend_for(self.config)

    def new_path(self) -> str:
        """A fresh, unique file name in this worker's directory."""
        return os.path.join(self.dir, f"b-{uuid.uuid4().hex}.dbsp")

    def writer_options(self) -> dict:
        c = self.config
        return {"block_size": c.block_size, "compression": c.compression,
                "bloom_fpr": c.bloom_fpr, "durable": c.durable, "index_fanout": c.index_fanout}

    @contextlib.contextmanager
    def reserve_disk(self, nbytes: int, what: str = "merge") -> Iterator[None]:
        """Wait until the disk has ``nbytes`` (plus ``min_free_bytes`` and what other merges
        reserved) free, hold that reservation for the block, release it afterwards."""
        global _reserved
        nbytes = max(int(nbytes), 0)
        delay = 0.01
        waited = 0.0
        logged = False
        while True:
            with _disk_lock:
                free = _config.free_space(self.dir)
                if free - _reserved - nbytes >= self.config.min_free_bytes:
                    _reserved += nbytes
                    break
            limit = self.config.disk_wait_seconds
            if limit is not None and waited >= limit:
                self.disk_wait_seconds += waited
                raise DiskFull(errno.ENOSPC,
                               f"{what} in {self.dir} needs {nbytes} B plus "
                               f"{self.config.min_free_bytes} B kept free; {free} B were "
                               f"available after waiting {waited:.1f} s "
                               f"(disk_wait_seconds={limit})")
            if not logged:
                log.warning("%s in %s waits for disk space: needs %d B plus %d B kept free, "
                            "%d B available (%d B reserved by other merges)", what, self.dir,
                            nbytes, self.config.min_free_bytes, free, _reserved)
                logged = True
            self.disk_waits += 1
            if limit is not None:
                delay = min(delay, max(limit - waited, 0.0))
            time.sleep(delay)
            waited += delay
            delay = min(max(delay, 0.01) * 2, _MAX_BACKOFF)
        if logged:
            self.disk_wait_seconds += waited
            log.warning("%s in %s resumed after waiting %.2f s for disk space", what, self.dir,
                        waited)
        try:
            yield
        finally:
            with _disk_lock:
                _reserved -= nbytes

    def stats(self) -> dict:
        d = {"dir": self.dir, "files_written": self.files_written,
             "bytes_written": self.bytes_written, "disk_waits": self.disk_waits,
             "disk_wait_seconds": self.disk_wait_seconds}
        return d

"""Storage configuration: where a circuit's state goes when it does not fit in memory.

``dbsp.Circuit(storage=StorageConfig(dir, memory_budget_bytes=...))`` (or a directory path, which
takes the defaults) makes every spine of the circuit *storage-aware*
(:mod:`dbsp.trace.spill`): small batches stay in memory, large ones and everything over the
memory budget go to layer files under ``<dir>/worker-<i>/``.

The budget
----------
``memory_budget_bytes`` bounds the memory that holds *state*: the in-memory batches of every spine
of the circuit in this process plus the block cache (the slab pool the file batches are read
through, ``cache_bytes``, by default a quarter of the budget, 1-256 MiB). The rest of a process's
memory is not state and is not bounded by it: the interpreter and libraries (about 100 MiB), one
step's deltas and outputs, and the chunks a streaming merge holds (``merge_chunk_rows`` rows per
input). With the threads runtime all workers share the budget; with the processes runtime each
worker process gets ``memory_budget_bytes / workers``.

Disk space
----------
A merge that writes a file first waits until the file system has room for the sum of its inputs
plus ``min_free_bytes`` (:func:`free_space`, from ``statvfs``); it logs (logger
``dbsp.storage``) and retries with backoff, so a short shortage stalls the pipeline and it
resumes once space is freed; after ``disk_wait_seconds`` it fails with the typed error
:class:`~dbsp.storage.manager.DiskFull` (the step fails; the last checkpoint stays usable).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Optional, Union

__all__ = ["StorageConfig", "free_space", "as_storage_config"]

MiB = 1 << 20


def free_space(path: str) -> int:
    """Bytes available to unprivileged writers on the file system of ``path`` (``statvfs``).
    Tests replace this function to simulate a full disk."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class StorageConfig:
    """How and where a circuit keeps state that does not fit in memory (see the module doc).

    ``dir``: the storage directory (created if missing); files go to ``dir/worker-<i>/``.
    ``memory_budget_bytes``: in-memory batches + block cache, per circuit and process.
    ``backend``: ``auto``, ``uring``, ``pread`` or ``mmap``
    (:func:`dbsp.storage.backend.make_backend`); ``mmap`` has no pool, its cache is the page
    cache (mapped pages count in the RSS while touched).
    ``block_size``: data block size of batch files (and the pool's slot size).
    ``compression``: ``None`` or ``"lz4"`` per block.
    ``min_file_rows``: a merge whose inputs sum to at least this many rows writes its output to
    a file (streaming, chunk by chunk), whatever the memory; a smaller merge stays in memory
    when its output fits beside the memory in use, else it streams to a file too.
    ``min_spill_bytes``: the memory accountant never spills a batch smaller than this (a file
    costs an fd, an index and a filter; small batches are merged in memory first and spilled
    as one file). Default: a 32nd of the budget, 64 KiB to 1 MiB.
    ``cache_bytes``: slab pool size (default: a quarter of the budget, 1-256 MiB).
    ``merge_chunk_rows``: rows a streaming merge reads from each input at a time (at most).
    ``merge_round_bytes``: bytes of input one round of a streaming merge may hold (default: a
    sixteenth of the budget, at least 2 MiB: with 1 MiB the per-round work of reading, merging
    and writing dominated, 1.7 s against 1.0 s on ``bench/workloads/bench_storage.py``; 4 MiB
    gained 5% more); more inputs mean smaller pieces. A round holds about three times this
    while it merges (part of the transient memory above the budget).
    ``bloom_fpr``: Bloom filter false-positive rate of batch files (over their keys).
    ``min_free_bytes``: disk space a file-writing merge leaves free (it waits otherwise).
    ``disk_wait_seconds``: how long such a merge waits for space (for other merges and GC to
    free it) before it fails with :class:`~dbsp.storage.manager.DiskFull` (None: forever).
    ``durable``: fsync batch files when written (off by default: no checkpoint refers to them
    yet; a checkpoint syncs the files it lists).
    ``index_fanout``: cap on children per index block (tests use it for deep index trees).
    ``merge_process_rows``: file merges of at least this many input rows run in a helper
    process, off the step's GIL (:mod:`dbsp.trace.merge_helper`); None: every merge runs in
    the merger thread.
    ``direct_io``: read blocks with ``O_DIRECT`` (the slab pool is the cache; nothing is cached
    twice). ``None`` (default): direct for the pooled backends wherever the file system accepts
    it (a file on tmpfs, which refuses it, is read buffered with the kernel's readahead off);
    cold random block reads ran at 0.69-1.9x of fio direct against 0.4-0.56x buffered
    (``bench/micro/bench_block_io.py``). ``False``: buffered (the page cache then also holds
    recently written files, outside the budget). Ignored by ``mmap``.
    ``limit_allocators``: make glibc and Arrow return freed memory to the kernel, so the peak
    RSS follows the budget (:mod:`dbsp.storage.memory`; costs about 20% of step time).
    """

    dir: str
    memory_budget_bytes: int = 1 << 30
    backend: str = "auto"
    block_size: int = 65536
    compression: Optional[str] = None
    min_file_rows: int = 1 << 20
    min_spill_bytes: Optional[int] = None
    cache_bytes: Optional[int] = None
    merge_chunk_rows: int = 32768
    merge_round_bytes: Optional[int] = None
    bloom_fpr: Optional[float] = 1e-3
    min_free_bytes: int = 64 * MiB
    durable: bool = False
    index_fanout: Optional[int] = None
    limit_allocators: bool = True
    direct_io: Optional[bool] = None
    merge_process_rows: Optional[int] = 65536
    disk_wait_seconds: Optional[float] = 300.0

    def __post_init__(self):
        object.__setattr__(self, "dir", os.fspath(self.dir))
        if self.memory_budget_bytes <= 0:
            raise ValueError(f"memory_budget_bytes must be positive, got {self.memory_budget_bytes}")
        if self.block_size % 4096 or self.block_size < 4096:
            raise ValueError(f"block_size must be a positive multiple of 4096, got "
                             f"{self.block_size}")
        if self.backend not in ("auto", "uring", "pread", "mmap"):
            raise ValueError(f"unknown backend {self.backend!r}; choose auto, uring, "
                             f"pread or mmap")
        if self.compression not in (None, "lz4"):
            raise ValueError(f"compression must be None or 'lz4', got {self.compression!r}")
        if self.min_file_rows < 1 or self.merge_chunk_rows < 1:
            raise ValueError("min_file_rows and merge_chunk_rows must be at least 1")
        if self.disk_wait_seconds is not None and self.disk_wait_seconds < 0:
            raise ValueError(f"disk_wait_seconds must be >= 0 or None, got "
                             f"{self.disk_wait_seconds}")

    @property
    def cache(self) -> int:
        """The slab pool's size in bytes (at least 16 blocks)."""
        c = self.cache_bytes
        if c is None:
            c = min(max(self.memory_budget_bytes // 4, MiB), 256 * MiB)
        return max(c, 16 * self.block_size)

    @property
    def direct(self) -> bool:
        """Whether the pooled backends open files with ``O_DIRECT`` (``direct_io`` or its
        default)."""
        return self.direct_io is None or bool(self.direct_io)

    @property
    def round_bytes(self) -> int:
        if self.merge_round_bytes is not None:
            return self.merge_round_bytes
        return max(self.memory_budget_bytes // 16, 2 * MiB)

    @property
    def spill_floor(self) -> int:
        """``min_spill_bytes`` or its default."""
        if self.min_spill_bytes is not None:
            return self.min_spill_bytes
        return min(max(self.memory_budget_bytes // 32, 64 << 10), MiB)

    @property
    def batch_budget(self) -> int:
        """The part of the budget left for in-memory batches (the budget minus the cache, or
        the cache when the budget is smaller: the pool needs its slots either way)."""
        if self.backend == "mmap":
            return self.memory_budget_bytes
        return max(self.memory_budget_bytes - self.cache, self.memory_budget_bytes // 8)

    def share(self, parts: int) -> "StorageConfig":
        """This config with the budget (and an explicit cache) divided among ``parts``
        processes."""
        if parts <= 1:
            return self
        cache = None if self.cache_bytes is None else max(self.cache_bytes // parts, 1)
        return replace(self, memory_budget_bytes=max(self.memory_budget_bytes // parts, 1),
                       cache_bytes=cache)


def as_storage_config(storage: Union[None, str, os.PathLike, StorageConfig, Any]
                      ) -> Optional[StorageConfig]:
    """``None``, a directory or a :class:`StorageConfig` -> a config or None."""
    if storage is None or isinstance(storage, StorageConfig):
        return storage
    if isinstance(storage, (str, os.PathLike)):
        return StorageConfig(os.fspath(storage))
    raise TypeError(f"storage must be a directory or a StorageConfig, got "
                    f"{type(storage).__name__}")

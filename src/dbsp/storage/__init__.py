"""Storage: layer files on disk, the backends that read them, and the slab buffer pool.

Bottom up:

* ``dbsp._native.slab_pool``: the slab buffer pool (fixed 4 KiB-aligned slots, pinning views,
  S3-FIFO eviction) shared by every reader of the process.
* :mod:`dbsp.storage.format`: the layer file format (fixed-size checksummed blocks, per-stream
  B-tree index, Bloom filter, versioned trailer).
* :mod:`dbsp.storage.backend`: ``mmap``, ``uring`` (Cython + liburing, nogil) and ``pread``
  backends behind one interface; ``make_backend("auto")``.
* :mod:`dbsp.storage.writer` / :mod:`dbsp.storage.reader`: ``LayerFileWriter`` (streaming, sorted
  chunks) and ``LayerFile`` (row ranges as zero-copy views, ``lower_bound``, Bloom filter,
  prefetch) -- what file-backed batches and their cursors are built on.
* :mod:`dbsp.storage.inspect`: ``inspect_file`` / ``verify_file`` (``dbsp storage inspect|verify``).
* :mod:`dbsp.storage.config`: ``StorageConfig`` (directory, memory budget, backend, block size...),
  given to ``Circuit(storage=...)`` / ``StreamContext(storage=...)``.
* :mod:`dbsp.storage.manager`: ``WorkerStorage`` per worker (``<dir>/worker-<i>/``): file names,
  the process's backend, the disk-space gate of merges.
* :mod:`dbsp.storage.lock`: the storage directory's exclusive lock (one live process per
  directory); :mod:`dbsp.storage.faults`: durable writes (``.mut`` -> fsync -> rename) and the
  fault hooks the crash tests use (named kill points, injected fsync failures).
* :mod:`dbsp.storage.memory`: the process's allocator policies; :mod:`dbsp.storage.wire`: the
  wire format of values crossing a process boundary (pickle 5, buffers out of band, Arrow IPC).

This layer knows no batch, spine or operator. What goes into files and when (the memory
accountant, spilling, the merge helper process) is the trace's spilling policy
(:mod:`dbsp.trace.spill`); file-backed batches and streaming merges live in
:mod:`dbsp.trace.file_batch` and :mod:`dbsp.trace.merge_stream`.
"""
from .backend import available_backends, default_backend, make_backend
from .config import StorageConfig, free_space
from .format import CorruptBlockError, FormatVersionError, StorageError, TruncatedFileError
from .inspect import inspect_file, verify_file
from .lock import DirectoryLock, DirectoryLocked
from .manager import DiskFull, WorkerStorage
from .reader import LayerChunk, LayerFile, read_metadata
from .writer import LayerFileWriter, LayerSpec

__all__ = ["available_backends", "default_backend", "make_backend", "StorageConfig", "free_space",
           "CorruptBlockError", "FormatVersionError", "StorageError", "TruncatedFileError",
           "inspect_file", "verify_file", "WorkerStorage", "DiskFull", "DirectoryLock",
           "DirectoryLocked", "LayerChunk", "LayerFile",
           "read_metadata", "LayerFileWriter", "LayerSpec"]

"""Durable-write primitives and the fault hooks that test them: named kill points, fsync
failures.

Every write a checkpoint or a log depends on goes through :func:`fsync` / :func:`fsync_dir` /
:func:`write_durable` here, so that the crash and fault-injection tests (``tests/ft/``) can make
any of them fail, and every protocol step can be a place where the process dies.

Kill points
-----------
``DBSP_KILL_AT=name`` (or ``name:n``) makes the process kill itself with ``SIGKILL`` the first
(the ``n``-th) time it passes :func:`kill_point` ``(name)``. Points in the code:

* ``input-log-before-fsync``: an input-log record is written, not yet fsynced;
* ``input-log-before-rename``: fsynced, not yet renamed into place;
* ``checkpoint-mid-workers``: some workers' state is written, not all;
* ``checkpoint-after-rename``: the catalog is renamed into place, old checkpoints not yet removed;
* ``merge-mid``: a streaming merge has written part of its output file;
* ``output-log-before-record``: an output-log record is written, not yet renamed into place.


fsync failures
--------------
``DBSP_FAIL_FSYNC=n`` (or :func:`fail_fsync_at`) makes the ``n``-th call of :func:`fsync` in
this process raise ``OSError(EIO)``. A failed fsync is never retried: the caller's write fails
(see :mod:`dbsp.checkpoint.store`), because after a failed fsync the kernel may have dropped the
dirty pages and a second fsync would report success over lost data.
"""
from __future__ import annotations

import errno
import os
import signal
import threading
from typing import Any, Optional

__all__ = ["kill_point", "fsync", "fsync_dir", "fsync_path", "write_durable", "write_atomic", "write_all", "fail_fsync_at",
           "fsync_calls", "KILL_POINTS"]

KILL_POINTS = ("input-log-before-fsync", "input-log-before-rename", "checkpoint-mid-workers",
               "checkpoint-after-rename", "merge-mid", "output-log-before-record")

_lock = threading.Lock()
_hits: dict[str, int] = {}
_fsyncs = 0
_fail_at: Optional[int] = None


def _kill_spec() -> tuple[Optional[str], int]:
    spec = os.environ.get("DBSP_KILL_AT")
    if not spec:
        return None, 0
    name, _, n = spec.partition(":")
    return name, int(n) if n else 1


def kill_point(name: str) -> None:
    """Die here (``SIGKILL``) if ``DBSP_KILL_AT`` names this point and its count is reached."""
    want, n = _kill_spec()
    if want != name:
        return
    with _lock:
        _hits[name] = _hits.get(name, 0) + 1
        hit = _hits[name] == n
    if hit:
        os.kill(os.getpid(), signal.SIGKILL)


def fail_fsync_at(n: Optional[int]) -> None:
    """Make the ``n``-th :func:`fsync` from now fail with EIO (None: never)."""
    global _fsyncs, _fail_at
    with _lock:
        _fsyncs = 0
        _fail_at = n


def fsync_calls() -> int:
    """fsyncs made since the last :func:`fail_fsync_at` (or since start)."""
    return _fsyncs


def fsync(fd: int) -> None:
    """``os.fsync`` through the fault hook (see the module doc)."""
    global _fsyncs
    with _lock:
        _fsyncs += 1
        n = _fsyncs
        at = _fail_at
        if at is None and os.environ.get("DBSP_FAIL_FSYNC"):
            at = int(os.environ["DBSP_FAIL_FSYNC"])
    if at is not None and n == at:
        raise OSError(errno.EIO, "fsync failed (injected)")
    os.fsync(fd)


def fsync_path(path: str) -> None:
    """fsync a file that is already written (opened read-only: Linux syncs the inode)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync a directory, making the names created or renamed in it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: Any) -> int:
    """Write ``data`` (a buffer, or a sequence of buffers written one after the other, none
    copied) to ``fd``; returns the bytes written. ``os.write`` releases the GIL."""
    parts = data if isinstance(data, (list, tuple)) else [data]
    n = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            k = os.write(fd, view)
            view = view[k:]
            n += k
    return n


def write_durable(path: str, data: Any, kill_before_fsync: Optional[str] = None,
                  kill_before_rename: Optional[str] = None) -> None:
    """Write ``data`` (a buffer or a list of buffers, see :func:`write_all`) to ``path``
    atomically and durably: ``path.mut``, fsync, rename, fsync of the directory. A crash
    leaves the old file (or none) and perhaps a ``.mut``; never a partial ``path``."""
    tmp = path + ".mut"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
        if kill_before_fsync:
            kill_point(kill_before_fsync)
        fsync(fd)
    finally:
        os.close(fd)
    if kill_before_rename:
        kill_point(kill_before_rename)
    os.rename(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def write_atomic(path: str, data: Any, kill_before_rename: Optional[str] = None) -> None:
    """Write ``data`` to ``path`` atomically, not durably: ``path.mut``, rename. A crash of
    the process leaves the old file (or none) and perhaps a ``.mut``, never a partial ``path``;
    a power loss may leave a damaged ``path`` unless it is fsynced later (with its directory)."""
    tmp = path + ".mut"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    if kill_before_rename:
        kill_point(kill_before_rename)
    os.rename(tmp, path)

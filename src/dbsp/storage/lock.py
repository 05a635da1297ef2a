"""The storage directory's exclusive lock: one live process per directory.

Two processes on one directory corrupt each other (the second removes the first's ``*.mut``
files, its start-up clean-up deletes files the first still needs). So a circuit with storage
takes this lock before it touches the directory, and keeps it until it closes.

Design
------
The lock is a POSIX record lock (``fcntl.lockf``) on ``<dir>/LOCK``. The kernel drops it when
its process dies, however it dies (``kill -9`` included), so a lock left by a dead process is
taken over by the next opener without any guesswork about stale pids. Record locks belong to a
process and are *not* inherited by ``fork``: a forked worker or merge helper that outlives its
parent does not keep the directory locked. The holder writes ``pid host`` into the file after
taking the lock, so that a refused opener can say who holds it. Inside one process, record locks
do not conflict with each other, so the module also keeps a registry of the directories this
process holds.
"""
from __future__ import annotations

import fcntl
import os
import socket
import threading
from typing import Optional

__all__ = ["DirectoryLock", "DirectoryLocked"]

_held: dict[str, "DirectoryLock"] = {}
_held_lock = threading.Lock()


class DirectoryLocked(RuntimeError):
    """The storage directory is in use by another live process (or another circuit here)."""

    def __init__(self, directory: str, pid: Optional[int], host: str):
        self.directory, self.pid, self.host = directory, pid, host
        who = f"process {pid} on host {host!r}" if pid is not None else "another process"
        super().__init__(f"storage directory {directory!r} is locked by {who} "
                         f"(lock file {os.path.join(directory, 'LOCK')}); "
                         f"close that pipeline first or use another directory")


def _holder(path: str) -> tuple[Optional[int], str]:
    try:
        with open(path) as f:
            parts = f.read().split()
        return int(parts[0]), parts[1] if len(parts) > 1 else "?"
    except (OSError, ValueError, IndexError):
        return None, "?"


class DirectoryLock:
    """Holds ``<directory>/LOCK`` until :meth:`release` (see the module doc)."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.directory = os.path.realpath(directory)
        self.path = os.path.join(self.directory, "LOCK")
        self._fd: Optional[int] = None
        with _held_lock:
            other = _held.get(self.directory)
            if other is not None and other._fd is not None:
                raise DirectoryLocked(self.directory, os.getpid(), socket.gethostname())
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                pid, host = _holder(self.path)
                raise DirectoryLocked(self.directory, pid, host) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
            os.fsync(fd)
            self._fd = fd
            self._pid = os.getpid()
            _held[self.directory] = self

    @property
    def held(self) -> bool:
        return self._fd is not None and self._pid == os.getpid()

    def release(self) -> None:
        """Drop the lock (idempotent; a forked child never releases its parent's lock)."""
        with _held_lock:
            if self._fd is None:
                return
            fd, self._fd = self._fd, None
            if self._pid != os.getpid():  # a forked copy: the lock is the parent's
                try:
                    os.close(fd)
                except OSError:
                    pass
                return
            if _held.get(self.directory) is self:
                del _held[self.directory]
            try:
                os.close(fd)  # closing the descriptor drops the record lock
            except OSError:
                pass

    def __enter__(self) -> "DirectoryLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.release()
        except Exception:
            pass

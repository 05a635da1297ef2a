"""One worker's (or the driver's) state in a checkpoint: capture at a step boundary, write
after, read back.

Goals
-----
* The pause a checkpoint costs the circuit does not grow with the state: at the step boundary
  the operators' state values are only *referenced* (they are immutable between steps) and each
  spine's batch list recorded (batches are immutable, so holding the list is a consistent
  snapshot: 001's barrier snapshot made trivial); pickling the small state and writing the
  batches that live only in memory happen afterwards, while the circuit steps on
  (:class:`PendingState`).
* Batch files are shared: a batch already in a file is referenced, not copied; a batch written
  for a checkpoint replaces its in-memory twin in the spine, so the next checkpoint references
  that file too.

Design
------
The state (``Scheduler.checkpoint_state()``, see :mod:`dbsp.circuit.operator`) is pickled with a
persistent id for every :class:`~dbsp.trace.spine.SpineImage`: the pickle holds
``("spine", i, key_bound)``; the file's header holds spine ``i``'s batch list as
``(path relative to the storage root, first key, end key)`` triples. File layout::

    b"DBSPSTAT" | u32 header length | header JSON | pickle | u32 crc32 of all before

Files a checkpoint references are pinned in this process (:func:`pin`) so that a merge that
retires them does not delete them; :func:`release` unpins (and deletes what no live batch uses)
when the last checkpoint naming them is removed.

Invariants
----------
* A state file is written with :func:`dbsp.storage.faults.write_durable` and names only files
  that were fsynced before it.
* Reading checks the magic and the checksum and every referenced file; a mismatch is a
  :class:`CheckpointCorrupt` error, never a silently different state.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import struct
import threading
import zlib
from typing import Any

from ..storage.faults import fsync_dir, fsync_path, write_durable
from ..trace.file_batch import BatchFile, FileOrdIndexedZSet, FileOrdZSet, write_batch
from ..trace.spine import SpineImage

__all__ = ["PendingState", "capture_state", "read_state", "pin", "release", "CheckpointCorrupt",
           "CheckpointError"]

MAGIC = b"DBSPSTAT"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written (the previous one stands) or restored."""


class CheckpointCorrupt(CheckpointError):
    """A checkpoint file is damaged or a file it names is missing."""


# -- files this process keeps for checkpoints --------------------------------------------------

_lock = threading.Lock()
# absolute path -> [(shared state dict, finalizer)] of every BatchFile object this process
# opened on it and pinned (a directory reopened in the same process opens the file again)
_pins: dict[str, list] = {}
_synced: set[str] = set()      # absolute paths fsynced by this process


def pin(bf: BatchFile) -> None:
    """Keep ``bf``'s file on disk after its batches are gone (a checkpoint names it)."""
    with _lock:
        held = _pins.setdefault(bf.path, [])
        if not any(st is bf._state for st, _ in held):
            bf.pin()
            held.append((bf._state, bf._fin))


def release(paths: list[str]) -> int:
    """Unpin ``paths`` (absolute) and delete those that no live batch of this process uses.
    Returns the files deleted now."""
    removed = 0
    for p in paths:
        with _lock:
            held = _pins.pop(p, [])
            _synced.discard(p)
        for st, _ in held:
            st["pins"] = max(0, st["pins"] - 1)
        if any(fin.alive for _, fin in held):
            continue  # a live batch still reads it; its finalizer deletes it (pins == 0)
        try:
            os.unlink(p)
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def _fsync_once(path: str) -> bool:
    """fsync ``path`` unless this process did already; True if it did now."""
    with _lock:
        if path in _synced:
            return False
    fsync_path(path)
    with _lock:
        _synced.add(path)
    return True


# -- capture and write ---------------------------------------------------------------------------

class _Pickler(pickle.Pickler):
    def __init__(self, f, images: list):
        super().__init__(f, protocol=5)
        self.images = images

    def persistent_id(self, obj: Any):
        if isinstance(obj, SpineImage):
            self.images.append(obj)
            return ("spine", len(self.images) - 1, obj.key_bound)
        return None


class PendingState:
    """A state captured at a step boundary, still to be serialised and written.

    Capturing (:func:`capture_state`) only walks the operators: it holds references to their
    state values (immutable between steps: a step replaces them, never mutates them) and each
    spine's batch list, so the pause does not grow with the state, large non-spine values
    included. :meth:`write` (on any thread, while the circuit steps on) pickles the small state,
    writes the in-memory batches to layer files, fsyncs every file the state names and writes
    the state file; it returns ``{"files": [relative paths], "bytes": state file bytes + new
    batch bytes}``.
    """

    def __init__(self, state: Any, storage: Any, root: str):
        self.state = state
        self.storage = storage
        self.root = os.path.realpath(root)

    def write(self, path: str) -> dict:
        images: list = []
        f = io.BytesIO()
        _Pickler(f, images).dump(self.state)
        blob = f.getbuffer()
        self.state = None  # the references are not needed any more
        spines: list[list] = []
        files: list[str] = []
        dirs: set[str] = set()  # directories that gained a file this checkpoint names
        new_bytes = 0
        for im in images:
            entries = []
            for b in im.batches:
                if not getattr(b, "is_file", False):
                    if self.storage is None:
                        raise CheckpointError("a checkpoint needs storage (StorageConfig) to "
                                              "write in-memory state to")
                    name = getattr(im.source, "name", "")
                    wf = getattr(self.storage, "write_file", None)  # in the merge helper
                    fb = wf(b, name) if wf is not None else write_batch(self.storage, b, name=name)
                    if fb is None:
                        continue
                    new_bytes += fb.file_bytes
                    pin(fb.file)
                    if im.source is not None:  # the next checkpoint reuses the file
                        fb.hits = getattr(b, "hits", 0)
                        im.source.replace_batch(b, fb)
                    b = fb
                else:
                    pin(b.file)
                ap = os.path.realpath(b.path)
                rel = os.path.relpath(ap, self.root)
                if rel.startswith(".."):
                    raise CheckpointError(f"batch file {ap} is outside the storage root "
                                          f"{self.root}")
                if _fsync_once(ap):
                    dirs.add(os.path.dirname(ap))
                entries.append([rel, int(b.k0), int(b.k1)])
                files.append(rel)
            spines.append(entries)
        header = json.dumps({"version": 1, "spines": spines}).encode()
        head = MAGIC + struct.pack("<I", len(header)) + header
        crc = zlib.crc32(blob, zlib.crc32(head))
        for d in sorted(dirs):  # the new files' names are durable too, not only their bytes
            fsync_dir(d)
        write_durable(path, [head, blob, struct.pack("<I", crc)])
        return {"files": sorted(set(files)), "bytes": len(head) + len(blob) + 4 + new_bytes}


def capture_state(state: Any, storage: Any, root: str) -> PendingState:
    """Hold ``state`` (a ``checkpoint_state()`` result: references, taken at a step boundary)
    for writing later; see :class:`PendingState`."""
    return PendingState(state, storage, root)


# -- read ------------------------------------------------------------------------------------------

class _Unpickler(pickle.Unpickler):
    def __init__(self, f, spines: list):
        super().__init__(f)
        self.spines = spines

    def persistent_load(self, pid: Any):
        kind, i, bound = pid
        if kind != "spine" or not 0 <= i < len(self.spines):
            raise CheckpointCorrupt(f"bad spine reference {pid!r}")
        return SpineImage(self.spines[i], bound)


def read_state(path: str, storage: Any, root: str) -> Any:
    """The state in the state file ``path``, its spines' batches opened from their files
    (pinned: the checkpoint names them)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CheckpointCorrupt(f"checkpoint state file {path} is missing") from None
    if len(data) < len(MAGIC) + 8 or data[:len(MAGIC)] != MAGIC:
        raise CheckpointCorrupt(f"{path}: not a dbsp checkpoint state file")
    (crc,) = struct.unpack("<I", data[-4:])
    if zlib.crc32(data[:-4]) != crc:
        raise CheckpointCorrupt(f"{path}: checksum mismatch (the file is damaged)")
    (hl,) = struct.unpack("<I", data[len(MAGIC):len(MAGIC) + 4])
    h0 = len(MAGIC) + 4
    header = json.loads(data[h0:h0 + hl])
    root = os.path.realpath(root)
    files: dict[str, BatchFile] = {}
    spines = []
    backend = storage.backend if storage is not None else None
    acct = getattr(storage, "accountant", None)
    for entries in header["spines"]:
        batches = []
        for rel, k0, k1 in entries:
            ap = os.path.join(root, rel)
            bf = files.get(ap)
            if bf is None:
                if not os.path.exists(ap):
                    raise CheckpointCorrupt(f"{path}: batch file {rel} is missing")
                try:
                    bf = BatchFile(ap, backend, accountant=acct)
                except Exception as e:
                    raise CheckpointCorrupt(f"{path}: batch file {rel} is unreadable: "
                                            f"{e}") from e
                pin(bf)
                with _lock:
                    _synced.add(ap)
                files[ap] = bf
            cls = FileOrdIndexedZSet if bf.indexed else FileOrdZSet
            batches.append(cls(bf, k0, k1))
        spines.append(tuple(batches))
    return _Unpickler(io.BytesIO(data[h0 + hl:-4]), spines).load()


"""The checkpoint store: a storage directory's catalog of checkpoints, and the protocol that
writes, restores and retires them (seed 002, "Persistent Circuits").

Layout of the storage root (the circuit's ``StorageConfig.dir``)::

    LOCK                      the exclusive lock (pid host), dbsp.storage.lock
    checkpoints.json          the catalog: fingerprint, checkpoints oldest first, each with
                              name, step, time, bytes, the batch files it names and its
                              layout (shard map: shards -> workers; hosts: workers -> hosts)
    ckpt-<uuid>/              one directory per checkpoint
        worker-<w>.state      each worker's operator state (dbsp.checkpoint.state)
        driver.state          the driver's: keyed inputs, output views, step count
    worker-<w>/b-<uuid>.dbsp  immutable batch files, shared by checkpoints and live spines

Goals
-----
* A checkpoint is published by one atomic rename of the catalog; everything it depends on is
  fsynced before (the state files, the batch files they name, the checkpoint directory), and
  the catalog's directory after. A crash at any point leaves the previous catalog, which names
  only complete checkpoints.
* Nothing is orphaned: opening the store removes every ``*.mut``, every checkpoint directory
  the catalog does not name and every batch file no checkpoint names (the store holds the
  directory lock, so none of them belongs to a live process). Retiring a checkpoint (gc, keep
  the last ``keep`` >= 2) removes its directory and the files only it named.
* A checkpoint is restored only into the circuit that wrote it: the catalog's fingerprint
  (:meth:`dbsp.runtime.circuit.Circuit.fingerprint`) must match.
* The layout is part of every checkpoint (seed 000, "Scale in and out": the state database
  includes the scale). A circuit resumed with the same worker count takes the checkpoint's shard
  map (:meth:`CheckpointStore.prepare`, before its workers start); with another count, the map
  is resized (moving the fewest shards) and every new worker loads the state of the shards it
  now owns (:mod:`dbsp.checkpoint.reshard`): a cold layout change. The caller then commits a
  checkpoint in the new layout before any input is processed (:mod:`dbsp.ft.durable` does).
* The pause is short: :meth:`CheckpointStore.begin` captures the state at a step boundary;
  the writing (:meth:`PendingCheckpoint.finish`) may run while the circuit steps on. Worker
  processes write their own state on a thread of their own, started by :meth:`begin`
  (:meth:`dbsp.runtime.circuit.Circuit.apply_background`), beside their next steps.

Invariants
----------
* A failed fsync is never retried over: the checkpoint fails with :class:`CheckpointError`, the
  previous one stands, and the store refuses further checkpoints (the kernel may have dropped
  the dirty pages; a later fsync would report success over lost data). Restart to recover.
* The catalog never names a checkpoint whose files are not all durable.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

from .._version import __version__, formats, readable
from ..circuit.exchange import ShardMap, as_shard_map
from ..storage.faults import fsync_dir, kill_point, write_durable
from .reshard import load_worker_resharded, moved_fraction, old_worker_count
from .state import CheckpointCorrupt, CheckpointError, capture_state, read_state, release

__all__ = ["CheckpointStore", "CheckpointInfo", "PendingCheckpoint", "CheckpointError",
           "CheckpointCorrupt", "CircuitMismatch", "CheckpointVersionError", "save_worker_begin", "save_worker_finish",
           "load_worker", "release_worker_files"]

CATALOG = "checkpoints.json"
MIN_KEEP = 2


class CircuitMismatch(CheckpointError):
    """The checkpoints in a storage directory were written by a different circuit."""


class CheckpointVersionError(CheckpointError):
    """The checkpoints were written in a checkpoint or layer-file format this package cannot
    read (another dbsp version: :mod:`dbsp._version`)."""


@dataclass
class CheckpointInfo:
    """One published checkpoint."""

    name: str
    step: int
    #: wall-clock time (``time.time()``, or the clock the caller of :meth:`CheckpointStore.begin`
    #: gave) at which the state was captured, the step boundary the checkpoint holds; the time
    #: cadence of :mod:`dbsp.ft.durable` counts from it across restarts. (Catalogs written
    #: before it was the capture time hold the publish time, a little later: still a bound.)
    time: float
    bytes: int
    files: list = field(default_factory=list)
    #: ``{"shards": ShardMap.to_dict(), "hosts": [host of each worker]}``; None in catalogs
    #: written before layouts were recorded (their state is re-sharded on restore)
    layout: Optional[dict] = None

    def as_dict(self) -> dict:
        return {"name": self.name, "step": self.step, "time": self.time, "bytes": self.bytes,
                "files": self.files, "layout": self.layout}

    @property
    def shard_map(self) -> Optional[ShardMap]:
        return None if self.layout is None else ShardMap.from_dict(self.layout["shards"])


# -- functions run on each worker (module level: a worker process gets them by reference) -------

_pending: dict[tuple, Any] = {}
_pending_lock = threading.Lock()


def save_worker_begin(sched: Any, root: str, name: str) -> None:
    """Capture this worker's state now (the pause: references only); the write is left for
    :func:`save_worker_finish`."""
    ps = capture_state(sched.checkpoint_state(), sched.ctx.storage, root)
    with _pending_lock:
        _pending[(root, name, sched.ctx.worker)] = ps


def save_worker_finish(sched: Any, root: str, name: str) -> dict:
    """Write the state captured by :func:`save_worker_begin` into the checkpoint directory."""
    w = sched.ctx.worker
    with _pending_lock:
        ps = _pending.pop((root, name, w))
    return ps.write(os.path.join(root, name, f"worker-{w}.state"))


def save_worker_abort(sched: Any, root: str, name: str) -> None:
    with _pending_lock:
        _pending.pop((root, name, sched.ctx.worker), None)


def load_worker(sched: Any, root: str, name: str) -> None:
    """Restore this worker's operators from checkpoint ``name``."""
    state = read_state(os.path.join(root, name, f"worker-{sched.ctx.worker}.state"),
                       sched.ctx.storage, root)
    sched.restore_state(state)


def release_worker_files(sched: Any, root: str, paths: list) -> int:
    """Unpin / delete the files among ``paths`` (relative) in this worker's directory."""
    prefix = f"worker-{sched.ctx.worker}{os.sep}"
    mine = [os.path.join(os.path.realpath(root), p) for p in paths if p.startswith(prefix)]
    return release(mine)


# -- the store -------------------------------------------------------------------------------------

class PendingCheckpoint:
    """A checkpoint captured at a step boundary, being written (see :meth:`finish`)."""

    def __init__(self, store: "CheckpointStore", circuit: Any, name: str, step: int,
                 driver: Any, paused: float, layout: Optional[dict] = None,
                 taken: Optional[float] = None):
        self.store, self.circuit, self.name, self.step = store, circuit, name, step
        #: wall-clock time of the capture (:attr:`CheckpointInfo.time`)
        self.time = time.time() if taken is None else taken
        self.driver = driver
        self.layout = layout
        self.pause_seconds = paused
        self.info: Optional[CheckpointInfo] = None
        self.writes: Any = None  # the workers' writes (Circuit.apply_background)

    def finish(self) -> CheckpointInfo:
        """Write every worker's state and the driver's, fsync, publish in the catalog, retire
        old checkpoints. Raises :class:`CheckpointError` (the previous checkpoint stands)."""
        if self.info is not None:
            return self.info
        return self.store._finish(self)

    def abort(self) -> None:
        """Drop the captured state without writing it (the previous checkpoint stands)."""
        if self.info is None:
            try:
                self.writes.result()  # (worker processes may be writing: let them finish)
            except BaseException:
                pass
            self.circuit.apply(save_worker_abort, self.store.root, self.name)
            shutil.rmtree(os.path.join(self.store.root, self.name), ignore_errors=True)


_roots: dict[str, threading.RLock] = {}
_roots_lock = threading.Lock()


def _root_lock(root: str) -> threading.RLock:
    """The lock of storage root ``root`` in this process: a store's catalog writes (the fence
    check and the rename together) and another store's clean-up of the same root exclude each
    other. (A durable job's next generation opens a store on the root while the last one's
    writer may still be publishing: checked, then cleaned, then published, the checkpoint would
    name a directory and batch files the clean-up removed as unpublished.)"""
    with _roots_lock:
        lk = _roots.get(root)
        if lk is None:
            lk = _roots[root] = threading.RLock()
        return lk


class CheckpointStore:
    """The checkpoints of one storage directory (see the module doc). The circuit must hold the
    directory lock (a circuit with storage does from its construction)."""

    def __init__(self, root: str, fingerprint: str, keep: int = MIN_KEEP,
                 before_publish: Optional[Any] = None):
        if keep < MIN_KEEP:
            raise ValueError(f"keep must be at least {MIN_KEEP} (the last checkpoint and the one "
                             f"before it), got {keep}")
        self.root = os.path.realpath(root)
        self.fingerprint = fingerprint
        self.keep = keep
        #: called before every write of the catalog (publish, gc); raises to refuse it, e.g.
        #: the generation fence of :mod:`dbsp.ft.remote` (a replica of an old generation
        #: must not publish or retire checkpoints)
        self.before_publish = before_publish
        self.failed: Optional[BaseException] = None
        #: the last layout change :meth:`restore` made (workers before and after, rows kept
        #: and moved, the fraction moved, seconds), None if it made none
        self.layout_change: Optional[dict] = None
        self._lock = threading.Lock()
        self._root_lock = _root_lock(self.root)
        with self._root_lock:
            self.checkpoints: list[CheckpointInfo] = self._read_catalog()
            if not os.path.exists(self.catalog_path):
                # an empty catalog before any checkpoint directory exists: from now on a
                # directory the catalog does not name is an unpublished checkpoint, safe to
                # remove
                self._write_catalog([])
            self.removed_at_open = self._clean()

    # -- catalog -----------------------------------------------------------------------------
    @property
    def catalog_path(self) -> str:
        return os.path.join(self.root, CATALOG)

    def _read_catalog(self) -> list[CheckpointInfo]:
        try:
            with open(self.catalog_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            if glob.glob(os.path.join(self.root, "ckpt-*", "*.state")):
                raise CheckpointCorrupt(
                    f"{self.root}: checkpoint directories exist but the catalog {CATALOG} is "
                    f"missing; refusing to start (and to delete them)") from None
            return []
        try:
            doc = json.loads(raw)
            body = json.dumps(doc["catalog"], sort_keys=True).encode()
            if zlib.crc32(body) != doc["crc32"]:
                raise ValueError("checksum mismatch")
            cat = doc["catalog"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointCorrupt(f"{self.catalog_path}: damaged catalog ({e})") from e
        self._check_formats(cat)
        if cat["fingerprint"] != self.fingerprint and cat["checkpoints"]:
            raise CircuitMismatch(
                f"storage directory {self.root} holds checkpoints of a different circuit "
                f"(fingerprint {cat['fingerprint']}, this circuit {self.fingerprint}): the "
                f"operators, inputs or outputs changed; use a new directory")
        return [CheckpointInfo(**c) for c in cat["checkpoints"]]

    def _check_formats(self, cat: dict) -> None:
        """Refuse checkpoints in a checkpoint or layer-file format this package cannot read (a
        catalog without ``formats`` predates them: version 1 of both)."""
        if not cat.get("checkpoints"):
            return
        mine = formats()
        theirs = cat.get("formats") or {"checkpoint": 1, "layer": 1}
        for name in ("checkpoint", "layer"):
            v = int(theirs.get(name, 1))
            if not readable(mine[name], v):
                raise CheckpointVersionError(
                    f"{self.root}: the checkpoints were written by dbsp "
                    f"{cat.get('package', 'of an unknown version')} in {name} format {v}; this "
                    f"is dbsp {__version__}, which reads {name} format "
                    f"{mine[name][1]}..{mine[name][0]}: resume with a dbsp that reads it")

    def _write_catalog(self, cps: list[CheckpointInfo]) -> None:
        with self._root_lock:  # the check and the rename, never a clean-up between them
            self._write_catalog_locked(cps)

    def _write_catalog_locked(self, cps: list[CheckpointInfo]) -> None:
        if self.before_publish is not None:
            self.before_publish()
        f = formats()
        cat = {"version": 1, "fingerprint": self.fingerprint,
               "formats": {"checkpoint": f["checkpoint"][0], "layer": f["layer"][0]},
               "package": __version__,
               "checkpoints": [c.as_dict() for c in cps]}
        body = json.dumps(cat, sort_keys=True).encode()
        doc = json.dumps({"catalog": cat, "crc32": zlib.crc32(body)}).encode()
        write_durable(self.catalog_path, doc)

    def referenced(self, cps: Optional[list] = None) -> set:
        return {f for c in (self.checkpoints if cps is None else cps) for f in c.files}

    def _clean(self) -> int:
        """Remove ``*.mut``, unnamed checkpoint directories and unnamed batch files, by the
        catalog as it is now (read again: another store of this process may have published
        since this one read it), with every other store's catalog writes held off."""
        with self._root_lock:
            self.checkpoints = self._read_catalog()
            return self._clean_locked()

    def _clean_locked(self) -> int:
        removed = 0
        names = {c.name for c in self.checkpoints}
        refs = self.referenced()
        for p in glob.glob(os.path.join(self.root, "*.mut")) + \
                glob.glob(os.path.join(self.root, "*", "*.mut")):
            _unlink(p)
            removed += 1
        for d in glob.glob(os.path.join(self.root, "ckpt-*")):
            if os.path.basename(d) not in names:
                shutil.rmtree(d, ignore_errors=True)
                removed += 1
        for p in glob.glob(os.path.join(self.root, "worker-*", "*.dbsp")):
            if os.path.relpath(p, self.root) not in refs:
                _unlink(p)
                removed += 1
        for c in self.checkpoints:
            if not os.path.isdir(os.path.join(self.root, c.name)):
                raise CheckpointCorrupt(f"{self.root}: checkpoint {c.name} (step {c.step}) is in "
                                        f"the catalog but its directory is missing")
        if removed:
            fsync_dir(self.root)
        return removed

    # -- queries -----------------------------------------------------------------------------
    @property
    def latest(self) -> Optional[CheckpointInfo]:
        return self.checkpoints[-1] if self.checkpoints else None

    def find(self, name: Optional[str] = None) -> Optional[CheckpointInfo]:
        """Checkpoint ``name`` (a name or a step number), or the latest (None if there is
        none)."""
        if name is None:
            return self.latest
        for c in self.checkpoints:
            if c.name == name or (isinstance(name, int) and c.step == name):
                return c
        known = ", ".join(f"{c.name} (step {c.step})" for c in self.checkpoints) or "none"
        raise CheckpointError(f"no checkpoint {name!r} in {self.root} (known: {known})")

    # -- writing -----------------------------------------------------------------------------
    def begin(self, circuit: Any, step: int, at: Optional[float] = None) -> PendingCheckpoint:
        """Capture ``circuit``'s state at this step boundary (the pause the circuit sees).
        ``at``: the wall-clock time of the capture to record (default: ``time.time()`` now)."""
        at = time.time() if at is None else at
        if self.failed is not None:
            raise CheckpointError(f"an earlier checkpoint failed ({self.failed}); storage "
                                  f"cannot be trusted until the pipeline restarts from the "
                                  f"last checkpoint") from self.failed
        t0 = time.perf_counter()
        name = f"ckpt-{uuid.uuid4().hex}"
        d = os.path.join(self.root, name)
        try:
            circuit.apply(save_worker_begin, self.root, name)
            driver = capture_state(circuit.driver_state(), circuit.driver_storage(), self.root)
            os.makedirs(d, exist_ok=False)
            # worker processes write their state on threads of their own from now on
            writes = circuit.apply_background(save_worker_finish, self.root, name)
        except BaseException:
            circuit.apply(save_worker_abort, self.root, name)
            shutil.rmtree(d, ignore_errors=True)
            raise
        layout = circuit.layout_info() if hasattr(circuit, "layout_info") else None
        pc = PendingCheckpoint(self, circuit, name, step, driver, time.perf_counter() - t0,
                               layout, taken=at)
        pc.writes = writes
        return pc

    def _finish(self, pc: PendingCheckpoint) -> CheckpointInfo:
        circuit, name = pc.circuit, pc.name
        d = os.path.join(self.root, name)
        try:
            results = list(pc.writes.result())
            W = getattr(circuit, "workers", len(results))
            if len(results) != W:  # e.g. a runtime whose workers were stopped meanwhile
                raise CheckpointError(f"{len(results)} of the {W} workers reported their "
                                      f"state written")
            kill_point("checkpoint-mid-workers")  # every worker's state written, not the driver's
            results.append(pc.driver.write(os.path.join(d, "driver.state")))
            fsync_dir(d)
            fsync_dir(self.root)
        except BaseException as e:
            self.failed = e if isinstance(e, OSError) else self.failed
            try:
                circuit.apply(save_worker_abort, self.root, name)
            except BaseException:  # (workers that were stopped hold nothing to drop)
                pass
            shutil.rmtree(d, ignore_errors=True)
            raise CheckpointError(f"checkpoint at step {pc.step} failed: {e}; the previous "
                                  f"checkpoint stands") from e
        files = sorted({f for r in results for f in r["files"]})
        info = CheckpointInfo(name, pc.step, pc.time, sum(r["bytes"] for r in results),
                              files, pc.layout)
        with self._lock, self._root_lock:
            cps = self.checkpoints + [info]
            try:
                if not os.path.isdir(d):  # another store's clean-up took it as unpublished
                    raise CheckpointError(f"{d} was removed before it was published")
                self._write_catalog(cps)
            except BaseException as e:
                self.failed = e
                raise CheckpointError(f"checkpoint at step {pc.step} failed publishing the "
                                      f"catalog: {e}; the previous checkpoint stands") from e
            self.checkpoints = cps
        pc.info = info
        kill_point("checkpoint-after-rename")
        self.gc(circuit)
        return info

    def checkpoint(self, circuit: Any, step: int) -> CheckpointInfo:
        """Capture and write a checkpoint now (blocking)."""
        return self.begin(circuit, step).finish()

    def gc(self, circuit: Any, keep: Optional[int] = None) -> int:
        """Retire checkpoints beyond the last ``keep`` (default: the store's): catalog first,
        then their directories, then the files no remaining checkpoint names."""
        keep = max(self.keep if keep is None else keep, MIN_KEEP)
        with self._lock:
            if len(self.checkpoints) <= keep:
                return 0
            old, cps = self.checkpoints[:-keep], self.checkpoints[-keep:]
            self._write_catalog(cps)
            self.checkpoints = cps
        for c in old:
            shutil.rmtree(os.path.join(self.root, c.name), ignore_errors=True)
        gone = sorted(self.referenced(old) - self.referenced(cps))
        circuit.apply(release_worker_files, self.root, gone)
        return len(old)

    def close(self) -> int:
        """Final clean-up once the circuit has stopped (its merges finished): remove every
        file and directory no checkpoint names, so a closed pipeline leaves no orphan."""
        return self._clean()

    # -- restoring ---------------------------------------------------------------------------
    def prepare(self, circuit: Any, name: Optional[str] = None) -> Optional[ShardMap]:
        """Give ``circuit`` (built, its workers not started) the layout it resumes checkpoint
        ``name`` (default: the latest) in: the checkpoint's shard map with the same worker
        count, else that map resized to the circuit's workers (the fewest shards move). Returns
        the layout set (None: no checkpoint, the circuit keeps its own)."""
        info = self.find(name)
        if info is None:
            return None
        old = info.shard_map
        W = circuit.workers
        if old is None:
            new = as_shard_map(W)
        elif old.workers == W:
            new = old
        else:
            new = old.resize(W)
        circuit.set_layout(new)
        return new

    def restore(self, circuit: Any, name: Optional[str] = None) -> Optional[CheckpointInfo]:
        """Load checkpoint ``name`` (default: the latest) into ``circuit`` (freshly built, not
        stepped). Returns it, or None when the store has no checkpoint.

        When the checkpoint's layout is not the circuit's (another worker count, or a catalog
        without layouts), every worker loads the part of the state its shards now own
        (:mod:`dbsp.checkpoint.reshard`) and :attr:`layout_change` says what moved; the caller
        should then checkpoint before it processes input (the new layout's first commit)."""
        info = self.find(name)
        if info is None:
            return None
        d = os.path.join(self.root, info.name)
        self.layout_change = None
        layout = getattr(circuit, "layout", None)
        same = layout is None or (info.layout is not None and
                                  info.layout["shards"] == layout.to_dict())
        if same:
            circuit.apply(load_worker, self.root, info.name)
        else:
            t0 = time.perf_counter()
            W0 = info.shard_map.workers if info.layout is not None else old_worker_count(d)
            stats = circuit.apply(load_worker_resharded, self.root, info.name, W0,
                                  layout.to_dict())
            self.layout_change = {
                "checkpoint": info.name, "step": info.step, "from_workers": W0,
                "to_workers": circuit.workers,
                "kept_rows": sum(s["kept_rows"] for s in stats),
                "moved_rows": sum(s["moved_rows"] for s in stats),
                "moved_fraction": moved_fraction(stats),
                "reused_batches": sum(s["reused_batches"] for s in stats),
                "cut_batches": sum(s["cut_batches"] for s in stats),
                "seconds": time.perf_counter() - t0}
        driver = read_state(os.path.join(d, "driver.state"), circuit.driver_storage(), self.root)
        circuit.restore_driver_state(driver)
        if circuit.steps != info.step:
            raise CheckpointCorrupt(f"checkpoint {info.name}: catalog says step {info.step}, "
                                    f"its state step {circuit.steps}")
        return info


def _unlink(p: str) -> None:
    try:
        os.unlink(p)
    except FileNotFoundError:
        pass

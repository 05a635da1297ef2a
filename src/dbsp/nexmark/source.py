"""Nexmark events generated in processes of their own, handed over through shared memory.

A real source runs beside the pipeline, not inside its interpreter: a generator thread would
share the pipeline's GIL and cap the end-to-end rate at what one core does for both. Here the
events come from ``P`` *generator processes*:

* process ``p`` generates chunks ``p, p + P, p + 2P, ...`` of ``chunk`` events each (the
  generator is chunk-invariant, so together they produce exactly the events ``[0, events)``);
* it writes each chunk's three record batches (person, auction, bid) as Arrow IPC streams, one
  after the other, into one file of a shared-memory directory (``/dev/shm``), and puts the file's
  name and the three streams' byte ranges on its own bounded queue (at most ``depth`` chunks
  ahead: backpressure, so a slow pipeline does not fill the memory);
* the consumer (:meth:`GeneratorChannel.batches`) takes the queues round-robin, so chunks arrive
  in event order, maps each file, removes its name and reads the batches **zero-copy**: their
  buffers point into the mapping, which lives as long as any of them does.

The handle that crosses processes is :class:`GeneratorChannel` (queues, events, the directory:
all picklable when a process starts); :class:`GeneratorProcesses` owns the processes and the
directory. Start the processes from the process that does *not* consume, when the consumer's
peak RSS must be its own (``dbsp nexmark`` starts both from its fork server, so neither is the
other's child).

>>> with GeneratorProcesses(events=250, chunk=100, processes=2) as gp:
...     ch = gp.channel
...     ch.wait_ready()
...     [(b.start_event, b.count, b.bid.num_rows) for b in ch.batches()]
[(0, 100, 92), (100, 100, 92), (200, 50, 46)]
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import shutil
import tempfile
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import pyarrow as pa

from .generator import NexmarkBatch, NexmarkGenerator

__all__ = ["GeneratorChannel", "GeneratorProcesses", "shared_memory_dir"]

_KINDS = ("person", "auction", "bid")
_POLL_S = 0.1


def shared_memory_dir() -> str:
    """``/dev/shm`` where it is a writable directory (memory-backed files), else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        return shm
    return tempfile.gettempdir()


@dataclass
class GeneratorChannel:
    """The consumer's side of the generator processes (picklable at process start).

    ``queues[p]`` carries process ``p``'s chunks as ``(path, start, count, ranges)`` (``ranges``:
    ``(offset, length)`` of each kind's IPC stream in the file), then ``None``; an error in a
    process arrives as ``("error", text)``.
    """

    events: int
    chunk: int
    seed: int
    directory: str
    queues: list
    ready: Any  # a semaphore each process releases once its generator is built
    go: Any  # set by the consumer to start generating (the clock starts there)
    stop: Any  # set to make the processes stop early

    @property
    def processes(self) -> int:
        return len(self.queues)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every process has built its generator, then let them start."""
        deadline = time.monotonic() + timeout
        for _ in range(self.processes):
            if not self.ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"generator processes not ready after {timeout} s")
        self.go.set()

    def batches(self) -> Iterator[NexmarkBatch]:
        """The chunks in event order, each read zero-copy from its shared-memory file."""
        n_chunks = -(-self.events // self.chunk)
        try:
            for i in range(n_chunks):
                msg = self._get(self.queues[i % self.processes])
                if msg is None or msg[0] == "error":
                    detail = "ended early" if msg is None else msg[1]
                    raise RuntimeError(f"nexmark generator process {i % self.processes}: "
                                       f"{detail}")
                yield _read_chunk(*msg)
        finally:
            self.stop.set()

    def _get(self, q) -> Any:
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if self.stop.is_set():
                    raise RuntimeError("nexmark generator processes were stopped") from None


def _read_chunk(path: str, start: int, count: int, ranges: list) -> NexmarkBatch:
    mm = pa.memory_map(path, "r")
    try:
        os.unlink(path)  # the mapping stays until its last buffer is gone
        whole = mm.read_buffer()
    finally:
        mm.close()
    parts = {}
    for kind, (off, length) in zip(_KINDS, ranges):
        parts[kind] = pa.ipc.open_stream(whole.slice(off, length)).read_next_batch()
    return NexmarkBatch(start_event=start, count=count, **parts)


def _write_chunk(batch: NexmarkBatch, path: str) -> list:
    ranges = []
    with pa.OSFile(path + ".tmp", "wb") as f:
        for kind in _KINDS:
            rb = getattr(batch, kind)
            off = f.tell()
            with pa.ipc.new_stream(f, rb.schema) as w:
                w.write_batch(rb)
            ranges.append((off, f.tell() - off))
    os.rename(path + ".tmp", path)
    return ranges


def _produce(ch: GeneratorChannel, p: int) -> None:
    """Body of generator process ``p``."""
    q = ch.queues[p]
    ready = False
    try:
        gen = NexmarkGenerator(seed=ch.seed)
        ch.ready.release()
        ready = True
        while not ch.go.wait(_POLL_S):
            if ch.stop.is_set():
                return
        step = ch.chunk * ch.processes
        for lo in range(p * ch.chunk, ch.events, step):
            if ch.stop.is_set():
                return
            count = min(ch.chunk, ch.events - lo)
            path = os.path.join(ch.directory, f"chunk-{lo}")
            ranges = _write_chunk(gen.generate(lo, count), path)
            if not _put(ch, q, (path, lo, count, ranges)):
                return
        _put(ch, q, None)
    except BaseException:
        _put(ch, q, ("error", traceback.format_exc()))
        if not ready:  # the consumer then reads the error instead of waiting
            ch.ready.release()


def _put(ch: GeneratorChannel, q, msg) -> bool:
    while not ch.stop.is_set():
        try:
            q.put(msg, timeout=_POLL_S)
            return True
        except queue.Full:
            continue
    return False


class GeneratorProcesses:
    """Start ``processes`` Nexmark generator processes for ``events`` events in chunks of
    ``chunk``; :attr:`channel` is what the consumer needs (pass it to another process, or
    iterate :meth:`GeneratorChannel.batches` here). Close (or leave the ``with`` block) to stop
    the processes and remove the shared-memory files."""

    def __init__(self, events: int, chunk: int, *, seed: int = 0, processes: int = 1,
                 depth: int = 2, mp_context: Optional[mp.context.BaseContext] = None,
                 directory: Optional[str] = None) -> None:
        if events <= 0 or chunk <= 0:
            raise ValueError(f"GeneratorProcesses needs events > 0 and chunk > 0, got "
                             f"events={events}, chunk={chunk}")
        if processes <= 0 or depth <= 0:
            raise ValueError(f"GeneratorProcesses needs processes > 0 and depth > 0, got "
                             f"processes={processes}, depth={depth}")
        ctx = mp_context or mp.get_context()
        self._dir = tempfile.mkdtemp(prefix="dbsp-nexmark-gen-",
                                     dir=directory or shared_memory_dir())
        self.channel = GeneratorChannel(
            events=events, chunk=chunk, seed=seed, directory=self._dir,
            queues=[ctx.Queue(maxsize=depth) for _ in range(processes)],
            ready=ctx.Semaphore(0), go=ctx.Event(), stop=ctx.Event())
        self._procs = [ctx.Process(target=_produce, args=(self.channel, p), daemon=True,
                                   name=f"nexmark-generator-{p}") for p in range(processes)]
        for proc in self._procs:
            proc.start()

    def close(self) -> None:
        self.channel.stop.set()
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for q in self.channel.queues:
            q.close()
            q.join_thread()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> "GeneratorProcesses":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

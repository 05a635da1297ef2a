"""The step journal: what a step changed in every spine, so that a failed step can be undone.

A step of a circuit is atomic: when any operator on any worker fails, every piece of state must
be as it was before the step (:mod:`dbsp.circuit.scheduler` opens a journal around each top-level
step and the runtime commits or rolls it back once every worker has answered).

Design
------
A spine's state is the *sum* of its batches and changes only by ``insert``, ``clear`` and the
watermark GC hooks (see :mod:`dbsp.trace.spine`). Batches are immutable, so the journal keeps
references, not copies:

* ``insert(b)`` is undone by inserting ``-b`` (Z-set addition is commutative, so it does not
  matter which merges ran in between: the sum is right at once, and the merges cancel the rows);
* ``clear()`` is undone by inserting the batches the spine held just before (the journal keeps
  the snapshot tuple the spine already caches).

* ``truncate_keys_below(bound)`` (watermark GC) is undone by putting the old bound back. The
  rows below the new bound are still there to come back: a spine's merges free rows only below
  its *committed* bound, which :meth:`StepJournal.commit` moves up when the step stands; until
  then readers already cut at the new bound (see :meth:`dbsp.trace.spine.Spine.truncate_keys_below`).
  The watermark itself is operator state, restored by its savepoint
  (:meth:`dbsp.circuit.operator.Operator.savepoint`).

Cost on the fast path: one list append per insert or bound change, and nothing else; the
references are dropped when the step commits.

The journal is per thread (each worker steps its replica in one thread); a spine touched
outside a step (a driver-side keyed input) is not journalled.
"""
from __future__ import annotations

import contextvars
from typing import Any, Optional

__all__ = ["StepJournal", "use_journal", "current_journal"]

#: the journal of the step running here: a context variable, so that each of the workers a
#: thread runs one at a time (greenlets, :mod:`dbsp.runtime.threads`) has its own
_journal: contextvars.ContextVar = contextvars.ContextVar("dbsp_journal", default=None)


class StepJournal:
    """The spine changes of one step on one worker, in order."""

    __slots__ = ("entries",)

    def __init__(self) -> None:
        self.entries: list[tuple[str, Any, Any]] = []

    def inserted(self, spine: Any, batch: Any) -> None:
        self.entries.append(("insert", spine, batch))

    def cleared(self, spine: Any, batches: tuple) -> None:
        self.entries.append(("clear", spine, batches))

    def bound_raised(self, spine: Any, old_bound: Any) -> None:
        self.entries.append(("bound", spine, old_bound))

    def commit(self) -> None:
        """The step stands: let the spines' merges free the rows behind raised bounds."""
        entries, self.entries = self.entries, []
        for kind, spine, _ in entries:
            if kind == "bound":
                spine.commit_key_bound()

    def rollback(self) -> None:
        """Undo every change, newest first (outside any journal: the undo is not recorded)."""
        entries, self.entries = self.entries, []
        with use_journal(None):
            for kind, spine, x in reversed(entries):
                if kind == "insert":
                    spine.insert(x.neg())
                elif kind == "bound":
                    spine.restore_key_bound(x)
                else:
                    for b in x:
                        spine.insert(b)

    def __len__(self) -> int:
        return len(self.entries)


def current_journal() -> Optional[StepJournal]:
    """The journal of the step running in this thread, or None."""
    return _journal.get()


class use_journal:
    """Record spine changes made in this thread into ``journal`` (None: record nothing), as a
    context manager (a class, not a generator: it is entered on every step)."""

    __slots__ = ("journal", "prev")

    def __init__(self, journal: Optional[StepJournal]) -> None:
        self.journal = journal

    def __enter__(self) -> None:
        self.prev = _journal.set(self.journal)

    def __exit__(self, *exc: Any) -> None:
        _journal.reset(self.prev)

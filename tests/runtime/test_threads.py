"""Threads runtime (src/dbsp/runtime/threads.py): the in-process transport's mailboxes taken by
turns (one barrier an exchange) hand every worker exactly what each other worker sent it in that
exchange, however the threads race; the thread pool steps worker 0 inline and the others on
their threads (a small step: every worker in the caller's thread, one greenlet each, one at a
time), and reports a worker's error."""
from __future__ import annotations

import random
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.circuit.exchange import TransportAborted
from dbsp.runtime.threads import Gate, InProcTransport, ThreadPool
from dbsp.trace.journal import StepJournal, current_journal, use_journal


def _race(workers: int, rounds: int, seed: int, gather_every: int = 0) -> list:
    """Every worker exchanges ``rounds`` times, sleeping at random between exchanges; returns
    per worker what it received each round."""
    t = InProcTransport(workers)
    got: list = [[] for _ in range(workers)]
    errors: list = []

    def run(w: int) -> None:
        rng = random.Random(seed * 31 + w)
        try:
            for r in range(rounds):
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 2e-4)
                if gather_every and r % gather_every == 0:
                    got[w].append(t.all_gather(w, (r, w)))
                else:
                    got[w].append(t.exchange(w, [(r, w, dst) for dst in range(workers)]))
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    assert not errors, errors
    return got


def _expected(workers: int, rounds: int, gather_every: int = 0) -> list:
    """What a worker receives, computed without threads (the reference)."""
    out = []
    for w in range(workers):
        mine = []
        for r in range(rounds):
            if gather_every and r % gather_every == 0:
                mine.append([(r, src) for src in range(workers)])
            else:
                mine.append([(r, src, w) for src in range(workers)])
        out.append(mine)
    return out


@settings(max_examples=20, deadline=None)
@given(workers=st.integers(2, 4), rounds=st.integers(1, 60), seed=st.integers(0, 10**6),
       gather_every=st.sampled_from([0, 3]))
def test_exchanges_deliver_each_round_parts_whatever_the_race(workers, rounds, seed,
                                                              gather_every):
    assert _race(workers, rounds, seed, gather_every) == _expected(workers, rounds,
                                                                   gather_every)


def _woken_by_abort(block, aborted: type, ids, abort) -> list:
    """The ``ids`` whose thread, blocked in ``block(id)``, raised ``aborted`` once ``abort()``
    ran 50 ms after they started (sorted)."""
    seen: list = []

    def wait(i: int) -> None:
        try:
            block(i)
        except aborted:
            seen.append(i)

    ths = [threading.Thread(target=wait, args=(i,)) for i in ids]
    for th in ths:
        th.start()
    time.sleep(0.05)
    abort()
    for th in ths:
        th.join(5)
    return sorted(seen)


def test_an_aborted_exchange_wakes_the_others_and_reset_makes_it_usable():
    t = InProcTransport(3)
    assert _woken_by_abort(lambda w: t.exchange(w, [w] * 3), TransportAborted, (1, 2),
                           t.abort) == [1, 2]
    t.reset()
    assert _race(3, 5, 1) == _expected(3, 5)


class _Replica:
    """A stand-in for a scheduler: records the threads it stepped on; fails when told."""

    def __init__(self, fail: bool = False):
        self.threads: list = []
        self.fail = fail
        self.fed = None
        self.rolled_back = 0

    def feed(self, inp) -> None:
        self.fed = inp

    def step(self) -> None:
        self.threads.append(threading.current_thread().name)
        if self.fail:
            raise ValueError("worker failed")

    def take_outputs(self) -> dict:
        return {"fed": self.fed}

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        self.rolled_back += 1

    def close(self) -> None:
        pass


@pytest.mark.parametrize("serial_rows,on_threads", [(0, True), (1000, False)])
def test_pool_steps_worker_zero_inline_and_the_others_on_their_threads(serial_rows, on_threads):
    """Large steps: worker i > 0 on its own thread; small ones (fewer than ``serial_rows``
    rows a worker: these feed none) every worker in the caller's thread."""
    reps = [_Replica() for _ in range(3)]
    pool = ThreadPool(reps, InProcTransport(3), serial_rows=serial_rows)
    try:
        for s in range(5):
            outs = pool.step([s, s + 10, s + 20])
            assert outs == [{"fed": s}, {"fed": s + 10}, {"fed": s + 20}]
    finally:
        pool.close()
    me = threading.current_thread().name
    assert reps[0].threads == [me] * 5
    if on_threads:
        assert reps[1].threads == ["dbsp-worker-1"] * 5
        assert reps[2].threads == ["dbsp-worker-2"] * 5
    else:
        assert reps[1].threads == reps[2].threads == [me] * 5


@pytest.mark.parametrize("bad", [0, 1])
def test_pool_reports_a_worker_error_and_rolls_every_worker_back(bad):
    reps = [_Replica(fail=(i == bad)) for i in range(2)]
    pool = ThreadPool(reps, InProcTransport(2))
    try:
        with pytest.raises(ValueError, match="worker failed"):
            pool.step([1, 2])
        assert [r.rolled_back for r in reps] == [1, 1]
        reps[bad].fail = False
        assert pool.step([3, 4]) == [{"fed": 3}, {"fed": 4}]
    finally:
        pool.close()


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 4), rounds=st.integers(1, 80), seed=st.integers(0, 10**6))
def test_gate_lets_no_thread_into_a_round_before_every_thread_left_the_one_before(n, rounds,
                                                                                 seed):
    """Each thread records its round before and after every wait: no thread may finish waiting
    in round r while another has not yet arrived in round r (the reference: a round is over
    only when all n arrived)."""
    gate = Gate(n)
    arrived = [0] * n
    errors: list = []

    def run(me: int) -> None:
        rng = random.Random(seed * 7 + me)
        try:
            for r in range(rounds):
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 1e-4)
                arrived[me] = r + 1
                gate.wait(me)
                if min(arrived) < r + 1:
                    errors.append((me, r, list(arrived)))
        except BaseException as e:  # reported below
            errors.append(e)

    ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(30)
    assert not errors, errors[:3]


def test_an_aborted_gate_wakes_its_waiters_and_refuses_later_waits():
    gate = Gate(3)
    assert _woken_by_abort(gate.wait, threading.BrokenBarrierError, (0, 1), gate.abort) == [0, 1]
    with pytest.raises(threading.BrokenBarrierError):
        gate.wait(2)


class _Exchanging:
    """A stand-in for a scheduler whose step is ``segments`` stretches of work (a sleep, which
    releases the GIL as a native kernel does), each ended by an exchange; records how many
    workers were inside a stretch at once."""

    def __init__(self, w: int, transport, seen: dict, segments: int = 3):
        self.w, self.transport, self.seen, self.segments = w, transport, seen, segments

    def feed(self, inp) -> None:
        pass

    def step(self) -> None:
        seen = self.seen
        for s in range(self.segments):
            with seen["lock"]:
                seen["now"] += 1
                seen["most"] = max(seen["most"], seen["now"])
            time.sleep(0.01)
            with seen["lock"]:
                seen["now"] -= 1
            got = self.transport.exchange(self.w, [(s, self.w)] * self.transport.workers)
            assert got == [(s, src) for src in range(self.transport.workers)]

    def take_outputs(self) -> dict:
        return {}

    def commit(self) -> None:
        pass

    def rollback(self) -> None:
        pass

    def close(self) -> None:
        pass


class _Rows:
    """An input part of ``n`` rows (the pool counts them to choose how a step runs)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("rows,serial_rows,one_at_a_time", [
    (100, 1000, True),     # a small step: one worker at a time, as greenlets
    (5000, 1000, False),   # a large one runs side by side
    (100, 0, False),       # serial steps switched off
])
def test_pool_runs_the_workers_of_a_small_step_one_at_a_time(workers, rows, serial_rows,
                                                             one_at_a_time):
    t = InProcTransport(workers)
    seen = {"lock": threading.Lock(), "now": 0, "most": 0}
    reps = [_Exchanging(w, t, seen) for w in range(workers)]
    pool = ThreadPool(reps, t, serial_rows=serial_rows)
    try:
        for _ in range(3):
            pool.step([{"in": _Rows(rows)} for _ in range(workers)])
    finally:
        pool.close()
    assert (seen["most"] == 1) == one_at_a_time, seen


def test_pool_of_a_small_step_reports_an_error_in_an_exchange_and_steps_again():
    t = InProcTransport(2)
    seen = {"lock": threading.Lock(), "now": 0, "most": 0}
    reps = [_Exchanging(w, t, seen) for w in range(2)]
    pool = ThreadPool(reps, t, serial_rows=1000)
    reps[1].step = lambda: (_ for _ in ()).throw(ValueError("worker 1 failed"))
    try:
        with pytest.raises(ValueError, match="worker 1 failed"):
            pool.step([{"in": _Rows(10)}] * 2)
        del reps[1].step  # the class's step again
        pool.step([{"in": _Rows(10)}] * 2)
    finally:
        pool.close()
    assert seen["most"] == 1


class _Journaled(_Exchanging):
    """A worker whose step records into its own journal, as a scheduler's does, and checks
    after every exchange that the journal current is still its own."""

    def __init__(self, w: int, transport, seen: dict, segments: int = 3):
        super().__init__(w, transport, seen, segments)
        self.journal = StepJournal()

    def step(self) -> None:
        with use_journal(self.journal):
            for s in range(self.segments):
                if current_journal() is not self.journal:
                    self.seen.setdefault("wrong", []).append((self.w, s))
                self.transport.exchange(self.w, [s] * self.transport.workers)
            if current_journal() is not self.journal:
                self.seen.setdefault("wrong", []).append((self.w, self.segments))


@pytest.mark.parametrize("workers", [2, 3])
@pytest.mark.parametrize("rows", [10, 5000])
def test_each_worker_records_into_its_own_journal_across_exchanges(workers, rows):
    """The journal a step's spine changes go to is the worker's own after every exchange,
    whether the workers run on threads or take turns in one thread (where a thread-local
    journal would be the last one a worker set: a rollback would then miss changes)."""
    t = InProcTransport(workers)
    seen: dict = {"lock": threading.Lock(), "now": 0, "most": 0}
    reps = [_Journaled(w, t, seen, segments=4) for w in range(workers)]
    pool = ThreadPool(reps, t, serial_rows=1000)
    try:
        for _ in range(3):
            pool.step([{"in": _Rows(rows)} for _ in range(workers)])
    finally:
        pool.close()
    assert "wrong" not in seen, seen["wrong"][:5]
    assert current_journal() is None


def _small_pool(workers: int = 2):
    """A pool whose steps of :func:`_small_step` run as greenlets, its exchanging workers and
    what they saw."""
    t = InProcTransport(workers)
    seen = {"lock": threading.Lock(), "now": 0, "most": 0}
    reps = [_Exchanging(w, t, seen) for w in range(workers)]
    return ThreadPool(reps, t, serial_rows=1000), reps, seen


def _small_step(pool, n: int = 1) -> None:
    for _ in range(n):
        pool.step([{"in": _Rows(10)}] * len(pool.replicas))


def test_small_steps_reuse_the_workers_greenlets_and_make_new_ones_for_another_thread():
    """A small step's workers are greenlets kept from step to step (a new greenlet costs
    CPython a frame stack: an mmap and page faults a worker and step); stepping the pool from
    another thread gives that thread greenlets of its own (a greenlet runs only in the thread
    that made it), and every step still exchanges right."""
    pool, reps, seen = _small_pool()
    try:
        _small_step(pool)
        first = list(pool._gls)
        _small_step(pool, 3)
        assert all(a is b for a, b in zip(first, pool._gls))
        errs: list = []

        def other():
            try:
                _small_step(pool, 2)
            except BaseException as e:  # checked below
                errs.append(e)

        th = threading.Thread(target=other)
        th.start()
        th.join(timeout=30)
        assert not errs, errs
        assert not any(a is b for a, b in zip(first, pool._gls))
        _small_step(pool)  # back in this thread
    finally:
        pool.close()
    assert seen["most"] == 1


def test_a_small_step_after_a_failed_one_reuses_the_greenlets_and_rolls_back_cleanly():
    """A worker whose step raised is reported, the step rolled back, and the next small steps
    run on the same greenlets (the failed worker's greenlet did not end)."""
    pool, reps, seen = _small_pool()
    try:
        _small_step(pool)
        first = list(pool._gls)
        reps[0].step = lambda: (_ for _ in ()).throw(ValueError("worker 0 failed"))
        with pytest.raises(ValueError, match="worker 0 failed"):
            _small_step(pool)
        del reps[0].step
        _small_step(pool, 2)
        assert all(a is b for a, b in zip(first, pool._gls))
    finally:
        pool.close()
    assert seen["most"] == 1

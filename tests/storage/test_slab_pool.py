"""Slab pool: pinning, exhaustion, statistics against reference models of each policy.

Mirrors ``src/_native/slab_pool.pyx``."""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np
import pytest
from dbsp._native.slab_pool import HIT, LOADING, RESERVED, PoolExhaustedError, SlabPool
from hypothesis import given, settings
from hypothesis import strategies as st
from storage_helpers import in_threads

SLOT = 4096


class S3FifoModel:
    """S3-FIFO exactly as the pool runs it (Yang et al. SOSP'23, freq > 1 to promote)."""

    def __init__(self, n, small_fraction=0.1):
        self.n = n
        self.small_target = max(1, int(n * small_fraction))
        self.gcap = max(1, n - self.small_target)
        self.S: OrderedDict = OrderedDict()   # last item = head (newest)
        self.M: OrderedDict = OrderedDict()
        self.freq: dict = {}
        self.ring = [None] * self.gcap
        self.gpos = 0
        self.ghost: dict = {}
        self.hits = self.misses = self.evictions = 0

    def _ghost_add(self, k):
        old = self.ring[self.gpos]
        if old is not None:
            del self.ghost[old]
        self.ring[self.gpos] = k
        self.ghost[k] = self.gpos
        self.gpos = (self.gpos + 1) % self.gcap

    def _evict(self):
        while True:
            if self.S and (len(self.S) >= self.small_target or not self.M):
                t, _ = self.S.popitem(last=False)
                if self.freq[t] > 1:
                    self.M[t] = None
                    self.freq[t] = 0
                    continue
                self._ghost_add(t)
            else:
                t = next(iter(self.M))
                if self.freq[t] > 0:
                    self.freq[t] -= 1
                    self.M.move_to_end(t)
                    continue
                del self.M[t]
            del self.freq[t]
            self.evictions += 1
            return

    def access(self, k):
        if k in self.freq:
            self.freq[k] = min(self.freq[k] + 1, 3)
            self.hits += 1
            return
        self.misses += 1
        if len(self.freq) >= self.n:
            self._evict()
        self.freq[k] = 0
        if k in self.ghost:
            g = self.ghost.pop(k)
            self.ring[g] = None
            self.M[k] = None
        else:
            self.S[k] = None

    def resident(self):
        return sorted(self.freq)


class LruModel:
    def __init__(self, n):
        self.n, self.d = n, OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def access(self, k):
        if k in self.d:
            self.d.move_to_end(k)
            self.hits += 1
            return
        self.misses += 1
        if len(self.d) >= self.n:
            self.d.popitem(last=False)
            self.evictions += 1
        self.d[k] = None

    def resident(self):
        return sorted(self.d)


class ClockModel:
    """CLOCK over slot numbers: free slots are handed out from the highest number down (the
    pool's free list), the hand starts at slot 0."""

    def __init__(self, n):
        self.n = n
        self.slot_of: dict = {}
        self.key = [None] * n
        self.ref = [0] * n
        self.free = list(range(n))        # pop() -> n-1 first
        self.hand = 0
        self.hits = self.misses = self.evictions = 0

    def access(self, k):
        if k in self.slot_of:
            self.ref[self.slot_of[k]] = 1
            self.hits += 1
            return
        self.misses += 1
        if self.free:
            s = self.free.pop()
        else:
            while True:
                s = self.hand
                self.hand = (self.hand + 1) % self.n
                if self.ref[s]:
                    self.ref[s] = 0
                    continue
                break
            del self.slot_of[self.key[s]]
            self.evictions += 1
        self.key[s] = k
        self.ref[s] = 0
        self.slot_of[k] = s

    def resident(self):
        return sorted(self.slot_of)


MODELS = {"s3fifo": S3FifoModel, "lru": LruModel, "clock": ClockModel}


@pytest.mark.parametrize("policy", sorted(MODELS))
@settings(max_examples=40, deadline=None)
@given(nslots=st.integers(1, 40), trace=st.lists(st.integers(0, 60), max_size=400),
       file_split=st.booleans())
def test_statistics_match_the_model(policy, nslots, trace, file_split):
    pool = SlabPool(nslots * SLOT, SLOT, policy)
    model = MODELS[policy](nslots)
    files = np.array([1 + (k % 2 if file_split else 0) for k in trace], dtype=np.uint64)
    blocks = np.array(trace, dtype=np.uint64)
    hits = pool.simulate(files, blocks)
    for f, b in zip(files, blocks):
        model.access((int(f), int(b)))
    s = pool.stats()
    assert (hits, s["hits"], s["misses"], s["evictions"]) == \
        (model.hits, model.hits, model.misses, model.evictions)
    assert pool.resident() == model.resident()
    assert s["used"] == len(model.resident())


@pytest.mark.parametrize("policy", ["s3fifo", "clock", "lru"])
def test_pinned_blocks_are_never_evicted(policy):
    pool = SlabPool(8 * SLOT, SLOT, policy)
    f = pool.register_file()
    held = []
    for b in range(5):
        st_, slot = pool.acquire(f, b)
        assert st_ == RESERVED
        mv = pool.slot_view(slot)
        mv[:8] = b.to_bytes(8, "little")
        mv.release()
        held.append(pool.complete(slot, SLOT))
    rng = np.random.default_rng(0)
    for b in rng.integers(100, 10_000, 5000):
        st_, x = pool.acquire(f, int(b))
        if st_ == RESERVED:
            pool.complete(x, SLOT)      # dropped at once: unpinned
        del x                           # a hit's BlockRef: unpin
        assert pool.stats()["pinned"] == 5
    for b, ref in enumerate(held):
        assert pool.contains(f, b)
        assert int.from_bytes(bytes(memoryview(ref)[:8]), "little") == b
    # views made from a ref keep the pin after the ref object itself is gone
    arr = np.frombuffer(held[0], dtype=np.uint8)
    del held, ref
    assert pool.pinned() == [(f, 0)]
    del arr
    assert pool.pinned() == []


def test_all_pinned_raises_naming_the_pool_size():
    pool = SlabPool(3 * SLOT, SLOT)
    f = pool.register_file()
    refs = [pool.complete(pool.acquire(f, b)[1], SLOT) for b in range(3)]
    with pytest.raises(PoolExhaustedError, match=r"all 3 slots of 4 KiB"):
        pool.acquire(f, 99)
    with pytest.raises(PoolExhaustedError):
        pool.acquire_many(f, np.array([7, 8], dtype=np.uint64))
    assert pool.stats()["pinned"] == 3      # a failed acquire_many undoes its pins
    del refs[0]
    st_, slot = pool.acquire(f, 99)
    assert st_ == RESERVED


def test_acquire_many_wait_and_fail():
    pool = SlabPool(16 * SLOT, SLOT)
    f = pool.register_file()
    refs, status, slots = pool.acquire_many(f, np.array([1, 2, 1], dtype=np.uint64))
    assert list(status) == [RESERVED, RESERVED, LOADING]
    done = []

    def waiter():
        done.append(pool.wait(f, 1, int(slots[2])))
    t = threading.Thread(target=waiter)
    t.start()
    r1 = pool.complete(int(slots[0]), 100)
    t.join(5)
    assert done and done[0] is not None and len(done[0]) == 100
    pool.fail(int(slots[1]))
    assert not pool.contains(f, 2)
    assert pool.stats()["failed"] == 1
    st_, ref = pool.acquire(f, 1)
    assert st_ == HIT and ref.slot == r1.slot


def test_release_and_exports():
    pool = SlabPool(4 * SLOT, SLOT)
    f = pool.register_file()
    ref = pool.complete(pool.acquire(f, 0)[1], 10)
    mv = memoryview(ref)
    with pytest.raises(BufferError):
        ref.release()
    mv.release()
    ref.release()
    assert pool.stats()["pinned"] == 0
    with pytest.raises(BufferError):
        memoryview(ref)
    a = np.frombuffer(pool.lookup(f, 0), np.uint8)      # views are read-only
    with pytest.raises(ValueError, match="read-only"):
        a[0] = 1


def test_drop_file_frees_unpinned_and_orphans_pinned():
    pool = SlabPool(8 * SLOT, SLOT)
    f, g = pool.register_file(), pool.register_file()
    keep = pool.complete(pool.acquire(f, 1)[1], SLOT)
    pool.complete(pool.acquire(f, 2)[1], SLOT)
    pool.complete(pool.acquire(g, 2)[1], SLOT)
    assert pool.drop_file(f) == 2
    assert pool.resident() == [(g, 2)]
    assert pool.stats()["used"] == 2        # the pinned orphan still holds its slot
    del keep
    assert pool.stats()["used"] == 1


def test_threads_share_the_pool():
    pool = SlabPool(64 * SLOT, SLOT)
    f = pool.register_file()

    def work(seed):
        rng = np.random.default_rng(seed)
        for b in rng.integers(0, 200, 3000):
            st_, x = pool.acquire(f, int(b))
            if st_ == RESERVED:
                mv = pool.slot_view(x)
                mv[:8] = int(b).to_bytes(8, "little")
                mv.release()
                x = pool.complete(x, SLOT)
            elif st_ == LOADING:
                x = pool.wait(f, int(b), x)
                if x is None:
                    continue
            assert int.from_bytes(bytes(memoryview(x)[:8]), "little") == b
    errors = in_threads(work)
    assert not errors, errors[:1]
    s = pool.stats()
    assert s["pinned"] == 0 and s["hits"] + s["misses"] >= 12000 - s["waits"]


def test_budget_and_validation():
    p = SlabPool(10 * 65536 + 5, 65536)
    assert len(p) == 10 and p.budget == 10 * 65536
    with pytest.raises(ValueError, match="smaller than one slot"):
        SlabPool(100, 4096)
    with pytest.raises(ValueError, match="multiple of 4096"):
        SlabPool(1 << 20, 1000)
    with pytest.raises(ValueError, match="policy"):
        SlabPool(1 << 20, 4096, "random")
    assert p.address(0) % 4096 == 0 and p.address(1) - p.address(0) == 65536


# -- acquire_extents / complete_reads: the pooled read path's two native calls ------------------

@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=60), st.integers(0, 2**32 - 1),
       st.sampled_from(["s3fifo", "clock", "lru"]))
def test_extents_calls_match_acquire_and_complete_many(blocks, seed, policy):
    """Two pools fed the same batches, one through acquire_many + complete_many (the reference
    twin), one through acquire_extents + complete_reads: the same statuses, slots, refs,
    published blocks, slow list (failed reads and flagged blocks) and statistics."""
    rng = np.random.default_rng(seed)
    a, b = SlabPool(24 * SLOT, SLOT, policy), SlabPool(24 * SLOT, SLOT, policy)
    fa, fb = a.register_file(), b.register_file()
    keep_a, keep_b = [], []
    for rnd in range(3):
        bl = np.array(blocks, dtype=np.uint64)[rng.permutation(len(blocks))][:20]
        ext = np.ascontiguousarray(np.stack([bl.astype(np.int64) << 12,
                                             np.full(len(bl), SLOT, np.int64)], axis=1))
        refs, st_a, sl_a = a.acquire_many(fa, bl)
        out = [None] * len(bl)
        st_b, sl_b, nres = b.acquire_extents(fb, ext, out)
        assert list(st_a) == list(st_b) and list(sl_a) == list(sl_b)
        assert nres == int(np.count_nonzero(st_a == RESERVED))
        assert [r is None for r in refs] == [r is None for r in out]
        miss = np.flatnonzero(st_a == RESERVED)
        results = np.where(rng.random(len(miss)) < 0.2, -5, SLOT).astype(np.int32)
        lz4 = rng.random(len(miss)) < 0.2
        for pool, sl in ((a, sl_a), (b, sl_b)):
            mem = np.frombuffer(pool, np.uint8)
            for k, s in enumerate(sl[miss]):
                mem[int(s) * SLOT + 9] = 1 if lz4[k] else 0
        # reference: the failed and flagged reads are the slow ones, the rest completed
        slow_ref = np.flatnonzero((results != SLOT) | lz4)
        fast = np.setdiff1d(np.arange(len(miss)), slow_ref)
        for r, i in zip(a.complete_many(sl_a[miss][fast], np.full(len(fast), SLOT, np.uint32)),
                        miss[fast]):
            refs[i] = r
        slow = b.complete_reads(np.ascontiguousarray(sl_b[miss]), ext, results,
                                miss if len(miss) < len(bl) else np.empty(0, np.int64), out,
                                9, 1)
        assert list(slow) == list(slow_ref)
        for pool, sl in ((a, sl_a), (b, sl_b)):
            for k in slow_ref:
                pool.fail(int(sl[miss][k]))
        for r, i in zip(refs, range(len(bl))):
            assert (r is None) == (out[i] is None)
            if r is not None:
                assert (r.slot, r.block_no, len(r)) == (out[i].slot, out[i].block_no, len(out[i]))
        for k in np.flatnonzero(st_a == LOADING):
            assert refs[k] is None and out[k] is None
        keep_a.append(refs)
        keep_b.append(out)
        if rnd == 1:
            keep_a.clear()
            keep_b.clear()
        assert a.resident() == b.resident() and a.pinned() == b.pinned()
        sa, sb = a.stats(), b.stats()
        assert sa == sb


def test_extents_calls_reject_bad_input():
    pool = SlabPool(4 * SLOT, SLOT)
    f = pool.register_file()
    ext = np.array([[0, SLOT], [SLOT, SLOT]], dtype=np.int64)
    with pytest.raises(ValueError, match="out has 1 items for 2 extents"):
        pool.acquire_extents(f, ext, [None])
    with pytest.raises(ValueError, match="extent 1 has a negative offset"):
        pool.acquire_extents(f, np.array([[0, SLOT], [-SLOT, SLOT]], np.int64), [None, None])
    out = [None, None]
    st_, slots, n = pool.acquire_extents(f, ext, out)
    assert n == 2 and pool.stats()["pinned"] == 2
    with pytest.raises(ValueError, match=r"length 8192 does not fit the slot size 4096"):
        pool.complete_reads(slots, np.array([[0, 2 * SLOT], [SLOT, SLOT]], np.int64),
                            np.array([SLOT, SLOT], np.int32), np.empty(0, np.int64), out)
    with pytest.raises(IndexError, match="index 5 of read 0"):
        pool.complete_reads(slots, ext, np.array([SLOT, SLOT], np.int32),
                            np.array([5, 1], np.int64), out)
    assert list(pool.complete_reads(slots, ext, np.array([SLOT, SLOT], np.int32),
                                    np.empty(0, np.int64), out)) == []
    assert [len(r) for r in out] == [SLOT, SLOT]

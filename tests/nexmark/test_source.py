"""Tests of ``dbsp.nexmark.source``: generator processes handing chunks over shared memory."""
from __future__ import annotations

import doctest
import gc
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dbsp.nexmark.source as S
from dbsp.nexmark.generator import NexmarkGenerator, collect_tables
from dbsp.nexmark.source import GeneratorProcesses

GEN = NexmarkGenerator(seed=3)


def test_docstring_example():
    res = doctest.testmod(S)
    assert res.failed == 0 and res.attempted > 0


def _collect(events, chunk, processes, depth=2):
    with GeneratorProcesses(events=events, chunk=chunk, seed=3, processes=processes,
                            depth=depth) as gp:
        gp.channel.wait_ready()
        batches = list(gp.channel.batches())
        left = os.listdir(gp._dir)
    return batches, left


@settings(max_examples=6, deadline=None)
@given(events=st.integers(1, 3_000), chunk=st.integers(1, 1_200), processes=st.integers(1, 3),
       depth=st.integers(1, 3))
def test_same_events_as_the_generator_in_order(events, chunk, processes, depth):
    batches, left = _collect(events, chunk, processes, depth)
    assert [b.start_event for b in batches] == list(range(0, events, chunk))
    assert sum(b.count for b in batches) == events
    got, want = collect_tables(batches), GEN.tables(events)
    for kind in ("person", "auction", "bid"):
        assert got[kind].equals(want[kind]), kind
    assert left == []  # every file was unlinked once mapped


def test_batches_outlive_their_files_and_are_not_copied():
    batches, _ = _collect(2_000, 500, 2)
    gc.collect()
    ref = GEN.generate(1_500, 500)
    assert batches[3].bid.equals(ref.bid)
    # the buffers point into the mapping, not into a copy made by the reader
    buf = batches[3].bid.column("extra").buffers()[2]
    assert not buf.is_mutable


def test_error_in_a_process_reaches_the_consumer():
    with GeneratorProcesses(events=1_000, chunk=100, seed="not a seed") as gp:
        gp.channel.wait_ready(timeout=60)
        with pytest.raises(RuntimeError, match="(?s)generator process 0.*ValueError"):
            list(gp.channel.batches())


def test_consumer_stopping_early_stops_the_processes():
    with GeneratorProcesses(events=100_000, chunk=1_000, processes=2, depth=1) as gp:
        gp.channel.wait_ready()
        it = gp.channel.batches()
        assert next(it).start_event == 0
        it.close()  # the consumer gives up: stop is set
        assert gp.channel.stop.is_set()
    for proc in gp._procs:
        assert not proc.is_alive()
    assert not os.path.exists(gp._dir)


@pytest.mark.parametrize("kw", [dict(events=0, chunk=10), dict(events=10, chunk=0),
                                dict(events=10, chunk=10, processes=0),
                                dict(events=10, chunk=10, depth=0)])
def test_bad_arguments(kw):
    with pytest.raises(ValueError, match="GeneratorProcesses needs"):
        GeneratorProcesses(**kw)

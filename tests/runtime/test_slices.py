"""Inputs the workers read themselves (``dbsp.runtime.slices``, ``dbsp.connectors.slices``):
Parquet / Arrow IPC files cut into pieces, dealt to the workers by index; the output equals the
driver-fed path, embedded and on the launcher with 2 and 3 processes; the driver never holds a
row of a sliced input."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings, strategies as st

import dbsp
from dbsp.circuit.exchange import deal_batch
from dbsp.algebra.schema import InputError
from dbsp.connectors.slices import FileSlices
from dbsp.runtime.launcher import build_outputs, launch
from dbsp.runtime.placement import plan
from dbsp.runtime.slices import (SLICES, LocalSource, SliceError, SliceMismatch, SliceRead,
                                 SliceReader, deal_pieces, gather_report)
from dbsp.testing import pipelines as P
from dbsp.testing import reference as R


def _table(schema, rows, weights) -> pa.Table:
    return P._table(schema, rows, weights)


bids_files, _pushed, _sliced_views = P.bids_files, P.views_pushed, P.views_sliced


# -- the file source -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_file_slices_cut_files_into_units(tmp_path, fmt):
    steps = P.sample_steps(3)
    src = bids_files(tmp_path, steps, fmt, group=60)
    assert src.format == fmt and len(src.files) == 3 and src.step_count() == 3
    for s, stp in enumerate(steps):
        pieces = src.pieces(s)
        n = len(stp["bids"][0])
        assert [p["start"] for p in pieces] == list(range(0, n, 60))
        assert pieces[-1]["end"] == n
        t = pa.concat_tables([src.read(p) for p in pieces])
        assert t.to_pydict() == _table(P.BIDS, *stp["bids"]).to_pydict()
    assert src.pieces(3) is None and src.pieces(-1) is None
    # consecutive units across files
    src2 = FileSlices(src.files, units_per_step=2)
    assert len(src2.pieces(0)) == 2 and src2.step_count() == -(-len(src.units) // 2)
    src3 = FileSlices(src.files, steps=lambda k: [k, k + 3] if k < 2 else None)
    assert src3.pieces(1) == [src.units[1], src.units[4]]
    assert src3.pieces(2) is None


def test_file_slices_name_a_missing_or_unreadable_input(tmp_path):
    """A path that does not exist, a directory without a file of the format, and a file that
    is not what its name says: each an error naming the input and what is wrong."""
    with pytest.raises(FileNotFoundError, match="not found.*/no/such/dir"):
        FileSlices(str(tmp_path / "no" / "such" / "dir"))
    good = tmp_path / "a.parquet"
    pq.write_table(pa.table({"k": [1, 2]}), good)
    with pytest.raises(FileNotFoundError, match=r"1 of 2 inputs.*b\.parquet"):
        FileSlices([str(good), str(tmp_path / "b.parquet")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no arrow files in"):
        FileSlices(str(tmp_path / "empty"), format="arrow")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match="bad.parquet cannot be read as parquet"):
        FileSlices(str(bad))


def test_file_reader_refuses_a_changed_file(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"k": [1, 2, 3]}), p)
    src = FileSlices(p)
    piece = src.pieces(0)[0]
    pq.write_table(pa.table({"k": [1, 2]}), p)
    with pytest.raises(ValueError, match="changed since it was listed"):
        src.read(piece)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_file_reader_reads_a_rewritten_file_afresh(tmp_path, fmt):
    """The reader keeps files open between pieces: one rewritten under the same name with
    as many rows (another inode, size or time) is read again, not from the old open file."""
    p = str(tmp_path / f"a.{fmt}")

    def write(vals):
        t = pa.table({"k": pa.array(vals, pa.int64())})
        if fmt == "parquet":
            pq.write_table(t, p, row_group_size=2)
        else:
            with pa.OSFile(p, "wb") as f, pa.ipc.new_file(f, t.schema) as w:
                for b in t.to_batches(max_chunksize=2):
                    w.write_batch(b)

    write([1, 2, 3, 4])
    src = FileSlices(p)
    pieces = src.pieces(0)
    assert [src.read(x).column("k").to_pylist() for x in pieces] == [[1, 2], [3, 4]]
    assert src.read(pieces[1]).column("k").to_pylist() == [3, 4]  # the open file, again
    os.replace(_rewritten(tmp_path, write, p, [5, 6, 7, 8]), p)
    assert [src.read(x).column("k").to_pylist() for x in pieces] == [[5, 6], [7, 8]]


def _rewritten(tmp_path, write, p, vals) -> str:
    """``vals`` written as ``p`` would be, to another name (then moved over ``p``)."""
    os.replace(p, p + ".old")
    write(vals)
    os.replace(p, p + ".new")
    os.replace(p + ".old", p)
    return p + ".new"


def test_deal_and_gather_by_index():
    assert deal_pieces(list("abcde"), 2) == [[0, 2, 4], [1, 3]]
    assert deal_pieces(list("ab"), 3) == [[0], [1], []]
    assert gather_report([[(1, 10), (3, 30)], [(2, 20)]], 3, 2) == [(1, 10), (2, 20), (3, 30)]


def test_reader_checks_what_a_replay_reads(tmp_path):
    p = tmp_path / "e.parquet"
    pq.write_table(_table(P.EVENTS, [(1, 2), (3, 4)], [1, 1]), p)
    src = FileSlices(p)
    piece = src.pieces(0)[0]
    reader = SliceReader({0: ("events", P.EVENTS)}, {"mine": src})
    feed = {SLICES: {0: SliceRead("events", src.reader(), (piece,))}}
    rep = reader.resolve(feed)
    assert SLICES not in feed and len(feed[0]) == 2
    rows, crc = rep[0][0]
    assert rows == 2
    # a local source by name, expected as logged: fine
    ok = {SLICES: {0: SliceRead("events", LocalSource("mine"), (piece,), ((rows, crc),))}}
    reader.resolve(ok)
    bad = {SLICES: {0: SliceRead("events", src.reader(), (piece,), ((rows, crc ^ 1),))}}
    with pytest.raises(SliceMismatch, match="input 'events'.*source changed under the log"):
        reader.resolve(bad)
    class Nothing:
        def read(self, piece):
            return pa.table({})
    empty = {SLICES: {0: SliceRead("events", Nothing(), ("x",))}}
    assert reader.resolve(empty) == {0: [(0, reader.resolve(
        {SLICES: {0: SliceRead("events", Nothing(), ("y",))}})[0][0][1])]} and 0 not in empty
    gone = {SLICES: {0: SliceRead("events", src.reader(), ({**piece, "file": "/nope"},))}}
    with pytest.raises(SliceError, match="input 'events': reading"):
        reader.resolve(gone)


def _ipc_step(path, batches):
    with pa.OSFile(str(path), "wb") as f:
        with pa.ipc.new_file(f, P.EVENTS) as w:
            for b in batches:
                w.write_batch(b)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_null_in_a_not_null_column_of_a_piece_names_the_piece(tmp_path, workers):
    """Pieces of exactly the input's schema are taken as read and their nulls checked
    together; a null in a column declared not null (Arrow writes one) still refuses the step,
    naming the input, column, piece and its row, and nothing of it is applied."""
    def batch(ks, vs):
        return pa.RecordBatch.from_arrays([pa.array(ks, pa.int64()), pa.array(vs, pa.int64())],
                                          schema=P.EVENTS)
    d = tmp_path / "ev"
    d.mkdir()
    _ipc_step(d / "ev-000.arrow", [batch([1, 2], [10, 20]), batch([3], [30])])
    _ipc_step(d / "ev-001.arrow", [batch([1, 2], [1, 2]), batch([4, 5, 6], [4, None, 6]),
                                   batch([7], [7])])
    _ipc_step(d / "ev-002.arrow", [batch([8], [80])])
    src = FileSlices(d, format="arrow")
    with dbsp.Circuit(workers=workers) as c:
        outs = build_outputs(c, P.keyed_count)
        c.slice_inputs("events")
        c.read_slices("events", src, 0)
        c.step()
        before = outs["counts"].view_dict()
        c.read_slices("events", src, 1)
        with pytest.raises(InputError) as e:
            c.step()
        msg = str(e.value)
        assert "input 'events', column 'v', row 1: null in a column that is not nullable" in msg
        assert "ev-001.arrow" in msg and "'group': 1" in msg, msg
        assert outs["counts"].view_dict() == before
        c.read_slices("events", src, 2)
        c.step()
        assert before == {(1, 1, 10): 1, (2, 1, 20): 1, (3, 1, 30): 1}
        assert outs["counts"].view_dict() == {**before, (8, 1, 80): 1}


def test_sliced_inputs_are_dealt_by_the_workers_not_the_driver():
    c = dbsp.Circuit(workers=2)
    build_outputs(c, P.keyed_count)
    node = c.inputs["events"].node
    placed = plan(c.nodes, 2)
    assert node in placed.input_keys and placed.local_exchanges
    assert node not in placed.local_exchanges
    c.slice_inputs("events")
    assert c.unplaced() == {node}
    free = plan(c.nodes, 2, c.unplaced())
    # the driver deals none of its rows; the workers deal them (the input is named among the
    # local nodes), and the same exchanges are local
    assert node not in free.input_keys
    assert free.local_exchanges == placed.local_exchanges | {node}
    with pytest.raises(KeyError):
        c.slice_inputs("nope")
    c.close()


def test_read_slices_needs_a_named_input(tmp_path):
    src = bids_files(tmp_path, P.sample_steps(1))
    with dbsp.Circuit(workers=2) as c:
        build_outputs(c, P.join_agg_closure)
        with pytest.raises(ValueError, match="slice_inputs"):
            c.read_slices("bids", src, 0)
        c.slice_inputs("bids")
        assert c.read_slices("bids", src, 5) == 0  # no such step: nothing pending
        assert not c.slices_pending


# -- same output as the driver-fed path --------------------------------------------------------------

@pytest.mark.parametrize("runtime,workers", [("threads", 1), ("threads", 2), ("processes", 2)])
def test_embedded_sliced_equals_pushed(tmp_path, runtime, workers):
    steps = P.sample_steps(4)
    want = _pushed(steps)
    assert all(want[0][k] for k in ("join", "agg"))
    src = bids_files(tmp_path, steps)
    with dbsp.Circuit(workers=workers, runtime=runtime) as c:
        outs = build_outputs(c, P.join_agg_closure)
        c.slice_inputs("bids")
        got = _sliced_views(c, outs, steps, src)
        assert [r for r, _ in c.last_slices["bids"]["report"]] == \
            [p["end"] - p["start"] for p in src.pieces(3)]
    assert got == want


@pytest.mark.parametrize("workers", [2, 3])
def test_sliced_rows_are_dealt_by_key_at_the_input(tmp_path, workers):
    """Each worker reads pieces wherever they lie; its input then holds exactly the rows the
    driver would have dealt it by the key of the join's exchange (which passes its input
    through), whichever worker read them."""
    steps = P.sample_steps(4)
    src = bids_files(tmp_path, steps, group=13)
    with dbsp.Circuit(workers=workers) as c:
        outs = build_outputs(c, P.join_agg_closure)
        c.slice_inputs("bids")
        node = c.inputs["bids"].node
        _sliced_views(c, outs, steps[:1], src)   # (the replicas exist from the first step)
        ops = [r.ops[node] for r in c._replicas]
        key = ops[0].deal_key
        assert key is not None and key[0] == ("auction",)
        assert all(op.deal_key == key for op in ops)
        ex = [i for i in c._placement.local_exchanges if i != node]
        assert ex and all(r.ops[i].local for r in c._replicas for i in ex)
        seen: list = [[] for _ in range(workers)]
        for w, op in enumerate(ops):
            deal = op._deal
            op._deal = lambda z, w=w, deal=deal: seen[w].append(deal(z)) or seen[w][-1]
        for s in range(1, len(steps)):
            c.read_slices("bids", src, s)
            c.step()
            rows, weights = steps[s]["bids"]
            data = pa.RecordBatch.from_pylist([{"auction": a, "price": p} for a, p in rows],
                                              schema=P.BIDS)
            want = deal_batch(data, np.array(weights, np.int64), key, c.layout)
            for w in range(workers):
                z = seen[w][-1]
                got = sorted(zip(z.data.to_pylist(), z.weights.tolist()),
                             key=lambda r: (sorted(r[0].items()), r[1]))
                exp = [] if want[w] is None else sorted(
                    zip(want[w][0].to_pylist(), want[w][1].tolist()),
                    key=lambda r: (sorted(r[0].items()), r[1]))
                assert got == exp, (s, w)
    # (the views themselves: test_embedded_sliced_equals_pushed)


@pytest.mark.slow
@pytest.mark.parametrize("procs", [2, 3])
def test_launcher_workers_read_their_own_slices(tmp_path, procs):
    steps = P.sample_steps(5)
    want = _pushed(steps)
    src = bids_files(tmp_path / "bids", steps, "arrow" if procs == 3 else "parquet")
    with launch(P.join_agg_closure, workers=procs, sliced=["bids"]) as job:
        sent = []  # every step request the driver sends: no bid row among them
        send = job.coordinator._send
        job.coordinator._send = lambda msgs: (sent.append(msgs), send(msgs))[1]
        got = _sliced_views(job, job.outputs, steps, src)
    bids = job.circuit.inputs["bids"].node
    reqs = [m[1] for msgs in sent for m in msgs.values() if m[0] == "step"]
    assert len(reqs) == procs * len(steps)
    assert not any(bids in r for r in reqs)
    assert sum(len(r[SLICES][bids].pieces) for r in reqs if SLICES in r) == \
        sum(len(src.pieces(s)) for s in range(len(steps)))
    assert got == want
    with launch(P.join_agg_closure, workers=procs) as job:
        fed = []
        for stp in steps:
            P.push_step(job.inputs, stp)
            job.step()
            fed.append({k: o.to_dict() for k, o in job.outputs.items()})
    assert fed == want


# -- against the reference ---------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 6), st.integers(-5, 5),
                                   st.sampled_from([1, 1, 2, -1])), max_size=40),
                min_size=1, max_size=4),
       st.integers(1, 9), st.integers(1, 3))
def test_sliced_keyed_count_matches_reference(tmp_path_factory, steps, group, workers):
    """Random steps written as files of ``group``-row units, read by the workers of an embedded
    circuit: the aggregate equals the reference recomputed from scratch every step."""
    d = tmp_path_factory.mktemp("ev")
    for s, rows in enumerate(steps):
        t = _table(P.EVENTS, [(k, v) for k, v, _ in rows], [w for _, _, w in rows])
        pq.write_table(t, d / f"ev-{s:03d}.parquet", row_group_size=group)
    src = FileSlices(d)
    seen = R.zset({})
    with dbsp.Circuit(workers=workers) as c:
        outs = build_outputs(c, P.keyed_count)
        c.slice_inputs("events")
        for s, rows in enumerate(steps):
            c.read_slices("events", src, s)
            c.step()
            seen = R.add(seen, R.zset([((k, v), w) for k, v, w in rows]))
            want = R.aggregate(seen, [0], [("count", None), ("sum", 0)])
            assert outs["counts"].view_dict() == want, s

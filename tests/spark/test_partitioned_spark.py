"""A DataFrame as a durable Spark job's own input (``durable(partitioned=..., partitions=P)``)
while the job changes its worker count and while its tasks are killed.

The DataFrame is cut into P partitions once for the job's life; step ``k`` is rows ``[k n, (k +
1) n)`` of each, and task ``w`` of W reads partitions ``p % W == w`` (its own partition when
P == W, else the batches of its partitions routed to it). The reference is one embedded
worker fed, step by step, the same rows read on the driver from the same cut
(:func:`dbsp.spark.cut_frame`):
the output log must equal it step for step (a layout change moves state, never input), and
the crash checker must find every event exactly once."""
from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
import pytest

pytest.importorskip("pyspark", reason="pip install dbsp[spark]")  # CI installs it

from dbsp.runtime.circuit import Circuit  # noqa: E402
from dbsp.runtime.launcher import build_outputs  # noqa: E402
from dbsp.runtime.slices import SourceStep  # noqa: E402
from dbsp.spark import (PartitionReader, RoutedPartitionReader, _TAG_DDL,  # noqa: E402
                        _tag_partition, cut_frame, durable)
from dbsp.testing import crash  # noqa: E402
from dbsp.testing import pipelines as P  # noqa: E402
from _spark import CLUSTER, check_changes, executor_of  # noqa: E402


# -- the readers, without Spark ------------------------------------------------------------------

def _tagged(parts: dict[int, list[pa.RecordBatch]]) -> dict[int, list[tuple]]:
    """What :func:`_tag_partition` makes of each partition's batches, as the routed RDD's
    records ``(partition, start, rows, ipc)``."""
    out = {}
    for p, batches in parts.items():
        rows = []
        for b in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, b.schema) as wr:
                wr.write_batch(b)
            n = rows[-1][1] + rows[-1][2] if rows else 0
            rows.append((p, n, b.num_rows, sink.getvalue().to_pybytes()))
        n = rows[-1][1] + rows[-1][2] if rows else 0
        rows.append((p, n, -1, b""))
        out[p] = rows
    return out


def _interleave(streams: list[list], rng: random.Random) -> list:
    """The records of several partitions in a random order between partitions, each
    partition's own order kept (as a shuffle read delivers them)."""
    its = [list(s) for s in streams if s]
    out = []
    while its:
        i = rng.randrange(len(its))
        out.append(its[i].pop(0))
        if not its[i]:
            its.pop(i)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_routed_reader_reads_each_partition_in_order_whatever_the_arrival(seed):
    rng = random.Random(seed)
    parts = {}
    for p in (1, 4, 7):  # task 1 of W = 3 holds partitions 1, 4, 7 of P = 9
        n, batches = 0, []
        while n < 23 + p:
            m = rng.randint(1, 6)
            batches.append(pa.record_batch({"k": list(range(100 * p + n, 100 * p + n + m))}))
            n += m
        parts[p] = batches
    want = {p: pa.Table.from_batches(b).column("k").to_pylist() for p, b in parts.items()}
    recs = _interleave(list(_tagged(parts).values()), rng)
    r = RoutedPartitionReader(iter(recs))
    n = 4
    first = 2  # a replay that starts at step 2: rows before it are skipped, not buffered
    for k in range(first, 10):
        for p in parts:
            t = r.read({"partition": p, "start": k * n, "end": (k + 1) * n})
            got = t.column("k").to_pylist() if t.num_rows else []
            assert got == want[p][k * n:(k + 1) * n], (p, k)
        if k == 4:  # a rolled-back step reads its pieces again
            for p in parts:
                t = r.read({"partition": p, "start": k * n, "end": (k + 1) * n})
                assert t.column("k").to_pylist() == want[p][k * n:(k + 1) * n]
        for q in r._parts.values():  # nothing before this step's start stays buffered long
            assert q.lo + sum(b.num_rows for b in q.buf[:1]) > k * n or not q.buf
    assert all(q.done for q in r._parts.values())  # every partition's end row was met
    with pytest.raises(ValueError, match="let go"):
        r.read({"partition": 1, "start": 0, "end": n})


def test_routed_reader_refuses_batches_out_of_order_and_short_partitions():
    parts = _tagged({0: [pa.record_batch({"k": [1, 2]}), pa.record_batch({"k": [3]})]})[0]
    r = RoutedPartitionReader(iter([parts[1], parts[0], parts[2]]))
    with pytest.raises(RuntimeError, match="out of order"):
        r.read({"partition": 0, "start": 0, "end": 5})
    r = RoutedPartitionReader(iter(parts[:2]))  # the end row never came
    with pytest.raises(RuntimeError, match="ended before"):
        r.read({"partition": 0, "start": 0, "end": 5})


def test_direct_reader_is_the_one_partition_case():
    b = [pa.record_batch({"k": [0, 1, 2]}), pa.record_batch({"k": [3, 4]})]
    r = PartitionReader(iter(b))
    assert r.read({"partition": 0, "start": 2, "end": 4}).column("k").to_pylist() == [2, 3]
    assert r.read({"partition": 0, "start": 4, "end": 8}).column("k").to_pylist() == [4]
    assert r.done


# -- on Spark -----------------------------------------------------------------------------------

EVENTS, ROWS = 300, 5


def _frame(spark):
    return spark.createDataFrame(crash.events_table(0, EVENTS))


def _reference_steps(df, parts: int, rows: int) -> dict[int, dict[str, Counter]]:
    """Every step's changes on one embedded worker fed, on the driver, rows ``[k n, (k + 1) n)``
    of each of the ``parts`` partitions of ``cut_frame(df, parts)`` (read through the same
    tagging the tasks' input goes through), step 0 also ``dims``."""
    t = cut_frame(df, parts).mapInArrow(_tag_partition, _TAG_DDL).toArrow()
    by: dict[int, list] = {}
    for p, start, n, ipc in sorted(zip(*[t.column(c).to_pylist() for c in t.column_names]),
                                   key=lambda r: (r[0], r[1])):
        if n > 0:
            by.setdefault(p, []).append(pa.ipc.open_stream(ipc).read_next_batch())
    tables = {p: pa.Table.from_batches(bs) for p, bs in by.items()}
    got = {}
    with Circuit(workers=1) as c:
        outs = build_outputs(c, P.crash_views)
        k = 0
        while True:
            pieces = [tables[p].slice(k * rows, rows) for p in sorted(tables)]
            if k == 0:
                c.inputs["dims"].put_pending(*crash.step_input(0, EVENTS, 10)["dims"])
            ev = pa.concat_tables(pieces).combine_chunks()
            if ev.num_rows:
                c.inputs["ev"].push(ev)
            c.step()
            rows_ = {name: crash._rows(o.delta().to_arrow()) for name, o in outs.items()}
            got[k] = {name: r for name, r in rows_.items() if r}
            k += 1
            if all(x.num_rows < rows for x in pieces):  # the tasks' source ends here too
                break
    return got


def _step(job, k: int) -> None:
    d = job.durable
    if k == 0:
        d.circuit.inputs["dims"].put_pending(*crash.step_input(0, EVENTS, 10)["dims"])
    d.step(slices={"ev": k})


@pytest.mark.slow
def test_partitioned_durable_job_scales_1_2_3_2_exactly_once(spark4, tmp_path):
    """P = 6 partitions of the crash stream's events, 5 rows of each a step; 1 -> 2 -> 3 -> 2
    tasks: every change checkpoints, moves only reassigned shards' state and restarts the
    barrier job, whose tasks read the pieces of their partitions from the checkpoint's step
    on. The output log equals one embedded worker's run step for step."""
    df = _frame(spark4)
    want = _reference_steps(df, 6, ROWS)
    changes = []
    with durable(spark4, P.crash_views, storage=tmp_path, workers=1, checkpoint_every=2,
                 timeout=600, partitioned=("ev", df, ROWS), partitions=6) as job:
        job.open()
        k = 0
        for W, n in [(None, 3), (2, 3), (3, 2), (2, None)]:
            if W is not None:
                ch = job.relayout(W)
                assert ch["step"] == k and len(job.pids()) == W
                changes.append(ch)
            while (n is None or n > 0) and not job.partition_ended:
                _step(job, k)
                k += 1
                n = None if n is None else n - 1
        assert job.partition_ended and job.durable.step_no == k
        pieces = job.durable.circuit.last_slices["ev"]["pieces"]
        assert [p["partition"] for p in pieces] == list(range(6))
    check_changes(changes, "Spark local[4], DataFrame input over P = 6 partitions")
    assert crash.logged_steps(str(tmp_path)) == want
    res = crash.check(str(tmp_path), EVENTS, retract=False)
    assert res["ok"] > 0 and (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0)


def _killed(spark, tmp_path, seed: int, parts: int, pick=None) -> None:
    """A durable job of 2 tasks reading ``parts`` partitions of the crash stream's events,
    killed twice at random steps (``pick``: the process to kill instead of the task's Python
    worker), checked against the reference and by the crash checker."""
    df = _frame(spark)
    # 20 full steps, then one that reads (nearly) nothing: room for two kills, each after a
    # checkpoint and a step beyond it
    rows = EVENTS // (parts * 20)
    want = _reference_steps(df, parts, rows)
    steps = len(want)

    def read(step, token):
        if step >= steps:
            return None
        out = {"ev": SourceStep(step)}
        if step == 0:
            out["dims"] = crash.step_input(0, EVENTS, 10)["dims"]
        return out

    with durable(spark, P.crash_views, storage=tmp_path, workers=2, checkpoint_every=3,
                 timeout=600, max_restarts=10, partitioned=("ev", df, rows),
                 partitions=parts) as job:
        kills = crash.run_killed(job, read, steps, 2, seed, pick)
        assert len(kills) >= 1 and job.restarts >= len(kills), kills
        # each recovery reloaded a checkpoint and its tasks read again, and checked, the
        # logged piece of every partition for each step after it
        recs = crash.check_recoveries(job, kills, pieces_per_step=parts,
                                      checkpoint_every=3)
        assert any(r["replayed_pieces"] > 0 for r in recs), recs
        print(f"\nP = {parts}: kills (generation, worker, step, pid, checkpoint) {kills}, "
              f"recoveries {recs}")
    assert crash.logged_steps(str(tmp_path)) == want
    res = crash.check(str(tmp_path), EVENTS, retract=False)
    assert (res["lost"], res["duplicated"], res["unexpected"]) == (0, 0, 0), (res, kills)
    assert res["ok"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed,parts", [(1, 4), (2, 2)])
def test_killed_tasks_of_a_partitioned_durable_job_recover_exactly_once(spark, tmp_path, seed,
                                                                        parts):
    """kill -9 of a task's Python worker at random steps (twice) while its 2 tasks read a
    DataFrame's partitions themselves, routed (P = 4) and direct (P = 2): Spark aborts the
    barrier job, the next generation's tasks read their partitions again, skip the rows before
    the checkpoint and replay the logged pieces (checked against their logged checksums); the
    crash checker finds every event exactly once, and the log equals the reference step for
    step."""
    _killed(spark, tmp_path, seed, parts)


@pytest.mark.slow
def test_killed_executors_of_a_partitioned_durable_job_recover_exactly_once(sessions, tmp_path):
    """kill -9 of a whole executor JVM (``local-cluster``: the standalone worker starts a new
    one) twice at random steps while the tasks read 4 routed partitions: the shuffle that
    routed them is lost with the executor, the next generation cuts and routes them again
    with another number of executors and another shuffle fetch order, and must read the same
    rows at the logged positions."""
    _killed(sessions.get(CLUSTER), tmp_path, random.randrange(1 << 30), 4,
            executor_of)

"""Every Nexmark query of ``dbsp.nexmark.queries`` on the engine, at a small size, checked
against DuckDB computing it from scratch (``dbsp.nexmark.reference``), with 1 and 2 workers.

The engine's integrated view is compared after the last step *and* after an intermediate one
(a view must be right after any prefix of the stream, not only at the end).
"""
from __future__ import annotations

import pyarrow as pa
import pytest

pytest.importorskip("duckdb")

import dbsp
from dbsp.api import StreamContext
from dbsp.nexmark.generator import (AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA, SIDE_INPUT_SCHEMA,
                                    NexmarkGenerator, side_input)
from dbsp.nexmark.queries import QUERIES, VARIANTS, QueryEnv, count_char_row, \
    count_char_vectorised
from dbsp.nexmark.reference import compare_results, reference_results, step_proc_times
from dbsp.operators.proc_time import StepClock

EVENTS, CHUNK, CHECK_AT = 12_000, 3_000, 2  # 4 steps; the view is also checked after step 2
SEED = 5
CLOCK = StepClock(1_436_918_400_000, 3_000)  # several steps share a 10 s processing-time window
_SCHEMAS = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}


def _reference(events: int) -> dict[str, pa.Table]:
    gen = NexmarkGenerator(seed=SEED)
    tables = gen.tables(events, chunk=CHUNK)
    tables["side_input"] = side_input()
    tables["bid_proc_time"] = step_proc_times(events, CHUNK, CLOCK, gen)
    return reference_results(tables)


@pytest.fixture(scope="module")
def references() -> dict[int, dict[str, pa.Table]]:
    return {CHECK_AT * CHUNK: _reference(CHECK_AT * CHUNK), EVENTS: _reference(EVENTS)}


def _run(name: str, workers: int, tmp_path, check) -> None:
    ctx = StreamContext(workers=workers)
    streams = {k: ctx.stream(s, name=k, time="date_time") for k, s in _SCHEMAS.items()}
    streams["side_input"] = ctx.stream(SIDE_INPUT_SCHEMA, name="side_input")
    built = {**QUERIES, **VARIANTS}[name](streams, QueryEnv(out_dir=str(tmp_path), clock=CLOCK))
    view = (lambda: built.read()) if not hasattr(built, "collect") else \
        (lambda h=built.collect(name): h.view())
    streams["side_input"].push(side_input())
    for i, batch in enumerate(NexmarkGenerator(seed=SEED).iter_batches(EVENTS, CHUNK)):
        for kind, rb in batch.as_dict().items():
            if rb.num_rows:
                streams[kind].push(rb)
        ctx.step()
        if i + 1 in (CHECK_AT, EVENTS // CHUNK):
            check((i + 1) * CHUNK, view())
    assert ctx.late_rows == {} or sum(ctx.late_rows.values()) == 0


@pytest.mark.parametrize("name", list(QUERIES) + list(VARIANTS))
def test_query_matches_duckdb(name, workers, tmp_path, references):
    ref_name = name.split("_", 1)[0]
    checked = []

    def check(events, view):
        expected = references[events][ref_name]
        assert expected.num_rows > 0, f"{ref_name} is empty at {events} events: a vacuous test"
        diffs = compare_results(expected, view, actual_weight=dbsp.WEIGHT)
        assert not diffs, f"{name} after {events} events:\n" + "\n".join(diffs)
        checked.append(events)

    _run(name, workers, tmp_path, check)
    assert checked == [CHECK_AT * CHUNK, EVENTS]


def test_q10_files_are_partitioned_by_day_and_minute(tmp_path):
    ctx = StreamContext()
    streams = {k: ctx.stream(s, name=k, time="date_time") for k, s in _SCHEMAS.items()}
    sink = QUERIES["q10"](streams, QueryEnv(out_dir=str(tmp_path)))
    for batch in NexmarkGenerator(seed=SEED).iter_batches(8_000, 4_000):
        streams["bid"].push(batch.bid)
        ctx.step()
    days = sorted(p.name for p in (tmp_path / "q10").iterdir())
    assert days and all(d.startswith("dt=") for d in days)
    files = list((tmp_path / "q10").rglob("*.parquet"))
    assert files and all(f.parent.name.startswith("hm=") for f in files)
    assert sink.read().num_rows == sink.rows_written > 0


def test_q14_user_function_vectorised_equals_per_row():
    extra = pa.array(["", "c", "abcabc", "cccx", "ccc"])
    assert count_char_vectorised(extra).to_pylist() == [count_char_row(s) for s in
                                                        extra.to_pylist()]

"""``dbsp.operators.proc_time``: rows stamped with their step's clock reading, against the
model ``{row ++ (clock(step),): weight}`` integrated over the steps; 1 and 2 workers."""
from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp.api import StreamContext, col
from dbsp.operators.proc_time import StepClock, WallClock

SCHEMA = pa.schema([("x", pa.int64())])


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _ms(ts: datetime) -> int:
    # exact integer arithmetic: timestamp() * 1000 rounds 8.049 s down to 8048 ms
    return (ts.replace(tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)


@settings(max_examples=25)
@given(steps=st.lists(st.lists(st.integers(0, 5), max_size=6), min_size=1, max_size=6),
       start=st.integers(0, 10**12), tick=st.integers(0, 5000))
def test_stamps_match_the_step_clock(workers, steps, start, tick):
    ctx = StreamContext(workers=workers)
    t = ctx.stream(SCHEMA, name="t")
    out = t.filter(col("x") >= 0).with_processing_time("p", StepClock(start, tick)).collect()
    model: Counter = Counter()
    for s, rows in enumerate(steps):
        if rows:
            t.insert([(x,) for x in rows])
        ctx.step()
        for x in rows:
            model[(x, start + s * tick)] += 1
        got = {(r[0], _ms(r[1])): w for r, w in out.view_dict().items()}
        assert got == dict(model)


def test_wall_clock_stamps_the_step_time():
    ctx = StreamContext()
    t = ctx.stream(SCHEMA, name="t")
    out = t.with_processing_time().collect()
    before = WallClock().now_ms(0)
    t.insert([(1,), (2,)])
    ctx.step()
    after = WallClock().now_ms(0)
    stamps = {_ms(r[1]) for r in out.view_dict()}
    assert len(stamps) == 1 and before <= stamps.pop() <= after
    assert out.schema.field("p_time").type == pa.timestamp("ms")


def test_bad_arguments():
    ctx = StreamContext()
    t = ctx.stream(SCHEMA, name="t")
    with pytest.raises(ValueError, match="already has a column 'x'"):
        t.with_processing_time("x")
    with pytest.raises(TypeError, match="now_ms"):
        t.with_processing_time("p", clock=lambda: 0)
    with pytest.raises(ValueError, match="tick_ms"):
        StepClock(0, -1)

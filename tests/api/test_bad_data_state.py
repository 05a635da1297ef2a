"""A pipeline that survives bad data (issue 11, part B): state the earlier part left out. Watermark
GC undone by a rollback, nested and dictionary columns in state that spills, weights that would
wrap inside spine merges, the error stream as a circuit stream, per-input policies at run time."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest

from dbsp import RowError, StreamContext, col, count, sum_
from dbsp.api import tumbling

SEC = dt.timedelta(seconds=1)
E = pa.schema([("ts", pa.timestamp("ms")), ("k", pa.string()), ("x", pa.int64())])


def ts(s: float) -> dt.datetime:
    return dt.datetime(2024, 1, 1) + dt.timedelta(seconds=s)


# -- a rollback undoes watermark GC ---------------------------------------------------------------

@pytest.mark.parametrize("keyed", [False, True])
def test_rollback_brings_back_rows_dropped_behind_the_watermark(workers, keyed):
    """A failed step that moved the watermark (closing windows, whose state the window operator
    truncates) is undone: the closed windows' rows are there again, so a row on time by the
    restored watermark updates its window exactly as in a run without the failed step."""
    runs = []
    for fail in (False, True):
        ctx = StreamContext(workers=workers)
        s = ctx.stream(E, name="ev", time="ts", lateness=10 * SEC)
        g = s.group_by("k") if keyed else s
        w = g.window(tumbling(10 * SEC)).agg(n=count(), total=sum_("x")).collect()
        bad = s.select(y=col("x") * 2 ** 62).collect()   # built after the window: fails later
        s.insert([(ts(1), "a", 1), (ts(3), "a", 1), (ts(12), "b", 1)])
        ctx.step()
        if fail:
            s.insert([(ts(31), "a", 1), (ts(35), "b", 2)])  # watermark 25 closes [0, 10), [10, 20)
            with pytest.raises(RowError, match="overflow"):
                ctx.step()
            assert s.watermark == ts(2)
        s.insert([(ts(5), "a", 1)])          # on time by the watermark 2 the rollback restored
        ctx.step()
        s.insert([(ts(14), "b", 1)])
        ctx.step()
        runs.append((w.view_dict(), w.delta_dict(), bad.view_dict(), s.watermark))
        ctx.close()
    assert runs[0] == runs[1]
    view = runs[1][0]
    if keyed:
        assert view == {("a", ts(0), ts(10), 3, 3): 1, ("b", ts(10), ts(20), 2, 2): 1}
    else:
        assert view == {(ts(0), ts(10), 3, 3): 1, (ts(10), ts(20), 2, 2): 1}

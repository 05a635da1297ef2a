"""Nexmark as a launcher / Spark pipeline (``build(circuit) -> {name: output}``), for running
the same queries on every runtime (``tests/spark/test_runtimes.py``).

* :func:`nexmark_views`: Nexmark q4 (a join and two aggregates), q7 (a tumbling-window top
  price) and a per-auction tumbling window (count, max price);
* :func:`nexmark_steps`: the generator's events cut into steps for it.
"""
from __future__ import annotations

from ..api import StreamContext, count, max_, tumbling
from .generator import AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA, NexmarkGenerator
from .queries import WINDOW, q4, q7

NEXMARK = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}


def nexmark_views(c) -> dict:
    """See the module doc; inputs ``person``, ``auction``, ``bid`` (event time ``date_time``)."""
    ctx = StreamContext(circuit=c)
    s = {k: ctx.stream(schema, name=k, time="date_time") for k, schema in NEXMARK.items()}
    window = s["bid"].select("auction", "price", "date_time").group_by("auction") \
        .window(tumbling(WINDOW)).agg(n=count(), top=max_("price"))
    return {"q4": q4(s).collect("q4").handle, "q7": q7(s).collect("q7").handle,
            "window": window.collect("window").handle}


def nexmark_steps(events: int, chunk: int, seed: int = 5) -> list[dict]:
    """Per step, ``{input: RecordBatch}`` of the Nexmark generator for :func:`nexmark_views`."""
    return [{k: rb for k, rb in b.as_dict().items() if rb.num_rows}
            for b in NexmarkGenerator(seed=seed).iter_batches(events, chunk)]



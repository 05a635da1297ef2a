"""Reference results of the Nexmark queries, computed from scratch with DuckDB, and a comparator.

An incremental engine keeps each query's *view* up to date as events arrive; after any prefix
of the event stream, its integrated output (the consolidated Z-set) must equal the query
evaluated from scratch over all the events seen so far.  This module is that from-scratch
evaluation, written independently in SQL for DuckDB (an optional dependency:
``pip install dbsp[verify]``), and :func:`compare_results`, which checks an engine's output
against it row by row, multiplicities included.

Every query is the standard Nexmark query (Flink/Beam suites) **adapted to a view over all
events so far**, DBSP/Feldera style: windows are all the windows that contain at least one
event (the most recent ones are still open and may change), "winning bids" are the current
leaders, and results are multisets of rows (row order is meaningless).

Conventions
-----------
* ``t`` is an event's ``date_time`` in epoch milliseconds.  ``floor(x, w) = x - ((x mod w) + w)
  mod w`` (flooring, also for negative ``x``).  A tumbling window of ``w`` ms containing ``t``
  starts at ``floor(t, w)``.  Timestamps in results are ``timestamp[ms]``.
* Integer arithmetic is exact (``int64``); ``//`` is integer division (prices are positive, so
  it floors).  Averages are ``float64``: the exact ``int64`` sum divided by the count in
  floating point (``float64(sum) / count``), which vectorised Arrow/numpy code reproduces bit
  for bit; :func:`compare_results` still allows a relative error of 1e-9 on float columns.
* Strings compare and sort byte-wise.
* **Winning bid** (shared by q4, q6, q9): for auction ``A``, the *qualifying* bids are the bids
  ``B`` with ``B.auction = A.id``, ``A.date_time <= B.date_time <= A.expires`` and
  ``B.price >= A.reserve`` (Beam's reserve rule, Flink's inclusive time range).  The winning
  bid is the first qualifying bid in the order ``price DESC, date_time ASC, bidder ASC,
  extra ASC, channel ASC, url ASC`` (bids equal in all these columns are interchangeable).
  An auction without a qualifying bid has no winner.

Queries (result columns and types)
----------------------------------
q0 ``auction, bidder, price: int64, channel, url: string, date_time: ts, extra: string``
    Pass-through: every bid.
q1 ``auction, bidder, price: int64, date_time: ts, extra: string``
    Currency conversion: every bid with ``price = price * 908 // 1000`` (dollars to euros,
    0.908, kept integer and exact).
q2 ``auction, price: int64``
    Selection: the bids with ``auction % 123 = 0``.
q3 ``name, city, state: string, id: int64``
    Local item suggestion: ``A JOIN P ON A.seller = P.id`` where ``A.category = 10`` and
    ``P.state IN ('OR', 'ID', 'CA')``; ``id`` is the auction id.
q4 ``category: int64, avg_price: float64``
    Average closing price per category: the average of the winning bid prices of the
    category's auctions (auctions with a winner only).
q5 ``auction, num: int64, starttime, endtime: ts``
    Hot items: hopping windows of 10 s sliding by 2 s (``[s, s + 10 s)`` for every
    ``s = k * 2 s``); per window, the auction(s) with the most bids (all ties), ``num`` their
    bid count.  Only windows with at least one bid exist.
q6 ``seller: int64, avg_price: float64``
    Average selling price by seller: per seller, the average winning price of the seller's
    last 10 won auctions, "last" meaning the greatest ``(expires, id)``.
q7 ``auction, price, bidder: int64, date_time: ts, extra: string``
    Highest bid: per tumbling 10 s window, every bid whose price equals the window's maximum.
q8 ``id: int64, name: string, starttime: ts``
    Monitor new users: distinct ``(P.id, P.name, w)`` such that person ``P`` was created in the
    tumbling 10 s window starting at ``w`` and at least one auction with ``seller = P.id`` was
    created in the same window; ``starttime = w``.
q9 ``id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
    extra`` (the auction) ``, auction, bidder, price, bid_date_time, bid_extra`` (its bid)
    Winning bids: every auction that has a winner, with the winning bid.
q11 ``bidder, bid_count: int64, starttime, endtime: ts``
    User sessions: per bidder, bids sorted by time are split into sessions wherever two
    consecutive bids are more than 10 s apart (a gap of exactly 10 s stays in the session);
    ``starttime`` is the first bid's time, ``endtime`` the last bid's time + 10 s.
q14 ``auction, bidder, price: int64, bid_time_type: string, date_time: ts, extra: string,
    c_counts: int64``
    Calculation: bids with ``1_000_000 < price * 908 // 1000 < 50_000_000``, ``price`` converted
    as in q1, ``bid_time_type`` from the UTC hour ``h = floor(t, 3600000) / 3600000 mod 24``:
    ``'dayTime'`` if 8 <= h <= 18, ``'nightTime'`` if h <= 6 or h >= 20, else ``'otherTime'``;
    ``c_counts`` the number of ``'c'`` characters in ``extra``.
q15 ``day: string, total_bids, rank1_bids, rank2_bids, rank3_bids, total_bidders,
    rank1_bidders, rank2_bidders, rank3_bidders, total_auctions, rank1_auctions,
    rank2_auctions, rank3_auctions: int64``
    Bidding statistics per UTC day (``'YYYY-MM-DD'``): bid counts and distinct bidder /
    auction counts, overall and per price rank (rank1: price < 10_000, rank2: 10_000 <= price
    < 1_000_000, rank3: price >= 1_000_000).
q16 ``channel, day, minute: string`` + the twelve counts of q15
    Channel statistics per (channel, day); ``minute`` is the latest ``'HH:MM'`` of the group.
q17 ``auction: int64, day: string, total_bids, rank1_bids, rank2_bids, rank3_bids,
    min_price, max_price: int64, avg_price: float64, sum_price: int64``
    Auction statistics per (auction, day).
q18 the columns of q0
    Last bid per (bidder, auction): the first in the order ``date_time DESC, price DESC,
    channel, url, extra``.
q19 the columns of q0 + ``rank_number: int64``
    Top 10 bids per auction in the order ``price DESC, date_time, bidder, channel, url,
    extra``; ``rank_number`` is the 1-based position.
q20 ``auction, bidder, price: int64, channel, url: string, date_time: ts, extra, item_name,
    description: string, initial_bid, reserve: int64, auction_date_time, expires: ts,
    seller, category: int64, auction_extra: string``
    Expand bids with their auction, for auctions of category 10.
q21 ``auction, bidder, price: int64, channel, channel_id: string``
    Channel id: ``'0'``/``'1'``/``'2'``/``'3'`` for channels Apple/Google/Facebook/Baidu (case
    insensitive), otherwise the value of the ``channel_id`` URL parameter (regex
    ``(&|^)channel_id=([^&]*)``, group 2); bids with neither are dropped.
q22 ``auction, bidder, price: int64, channel, dir1, dir2, dir3: string``
    URL split: ``dir1..dir3`` are the 4th..6th ``'/'``-separated parts of the URL (null when
    the URL has fewer parts).

q10 ``auction, bidder, price: int64, date_time: ts, extra, dt, hm: string``
    Log to file system: every bid with ``dt = 'YYYY-MM-DD'`` and ``hm = 'HH:MM'`` of its time
    (the engine writes it as Parquet files partitioned by ``dt``/``hm``).
q12 ``bidder, bid_count: int64, starttime, endtime: ts``
    Processing-time windows: bids per bidder per tumbling 10 s window of *processing* time.
    Processing time is not in the events: the reference takes it as the extra table
    ``bid_proc_time`` (one ``p_time`` per bid, in bid order; see :func:`step_proc_times`).
q13 ``auction, bidder, price: int64, date_time: ts, value: string``
    Bounded side input join: ``bid B JOIN side_input S ON B.auction % 10000 = S.key``
    (``side_input``: :func:`dbsp.nexmark.generator.side_input`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .generator import (AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA, SIDE_INPUT_SCHEMA,
                        NexmarkGenerator)

__all__ = ["QUERIES", "QUERY_SCHEMAS", "QUERY_SQL", "compare_results", "reference_results",
           "step_proc_times"]

_TS = pa.timestamp("ms")
_I = pa.int64()
_S = pa.string()
_F = pa.float64()


def _schema(*cols: tuple[str, pa.DataType]) -> pa.Schema:
    return pa.schema(list(cols))


_BID_COLS = tuple((f.name, f.type) for f in BID_SCHEMA)
_COUNTS = tuple(
    (f"{what}_{unit}", _I)
    for unit in ("bids", "bidders", "auctions")
    for what in ("total", "rank1", "rank2", "rank3")
)

#: Result schema of every query (column order, names and types are part of the definition).
QUERY_SCHEMAS: dict[str, pa.Schema] = {
    "q0": BID_SCHEMA,
    "q1": _schema(
        ("auction", _I), ("bidder", _I), ("price", _I), ("date_time", _TS), ("extra", _S)
    ),
    "q2": _schema(("auction", _I), ("price", _I)),
    "q3": _schema(("name", _S), ("city", _S), ("state", _S), ("id", _I)),
    "q4": _schema(("category", _I), ("avg_price", _F)),
    "q5": _schema(("auction", _I), ("num", _I), ("starttime", _TS), ("endtime", _TS)),
    "q6": _schema(("seller", _I), ("avg_price", _F)),
    "q7": _schema(
        ("auction", _I), ("price", _I), ("bidder", _I), ("date_time", _TS), ("extra", _S)
    ),
    "q8": _schema(("id", _I), ("name", _S), ("starttime", _TS)),
    "q9": pa.schema(
        list(AUCTION_SCHEMA)
        + [
            pa.field("auction", _I),
            pa.field("bidder", _I),
            pa.field("price", _I),
            pa.field("bid_date_time", _TS),
            pa.field("bid_extra", _S),
        ]
    ),
    "q10": _schema(
        ("auction", _I), ("bidder", _I), ("price", _I), ("date_time", _TS), ("extra", _S),
        ("dt", _S), ("hm", _S),
    ),
    "q11": _schema(("bidder", _I), ("bid_count", _I), ("starttime", _TS), ("endtime", _TS)),
    "q12": _schema(("bidder", _I), ("bid_count", _I), ("starttime", _TS), ("endtime", _TS)),
    "q13": _schema(
        ("auction", _I), ("bidder", _I), ("price", _I), ("date_time", _TS), ("value", _S)
    ),
    "q14": _schema(
        ("auction", _I), ("bidder", _I), ("price", _I), ("bid_time_type", _S),
        ("date_time", _TS), ("extra", _S), ("c_counts", _I),
    ),
    "q15": _schema(("day", _S), *_COUNTS),
    "q16": _schema(("channel", _S), ("day", _S), ("minute", _S), *_COUNTS),
    "q17": _schema(
        ("auction", _I), ("day", _S), ("total_bids", _I), ("rank1_bids", _I),
        ("rank2_bids", _I), ("rank3_bids", _I), ("min_price", _I), ("max_price", _I),
        ("avg_price", _F), ("sum_price", _I),
    ),
    "q18": BID_SCHEMA,
    "q19": _schema(*_BID_COLS, ("rank_number", _I)),
    "q20": _schema(
        *_BID_COLS,
        ("item_name", _S), ("description", _S), ("initial_bid", _I), ("reserve", _I),
        ("auction_date_time", _TS), ("expires", _TS), ("seller", _I), ("category", _I),
        ("auction_extra", _S),
    ),
    "q21": _schema(
        ("auction", _I), ("bidder", _I), ("price", _I), ("channel", _S), ("channel_id", _S)
    ),
    "q22": _schema(
        ("auction", _I), ("bidder", _I), ("price", _I), ("channel", _S),
        ("dir1", _S), ("dir2", _S), ("dir3", _S),
    ),
}

#: Names of the queries this module defines, in order.
QUERIES: tuple[str, ...] = tuple(QUERY_SCHEMAS)

# --- SQL ------------------------------------------------------------------------------------
# Helpers (DuckDB macros, created per connection):
#   fl(x, w)  floor of x to a multiple of w;  ms(ts)  epoch milliseconds of a timestamp.
# (the cast: DuckDB 2.0 fails "Unimplemented type for cast (INT64 -> INT64)" on epoch_ms of a
# TIMESTAMP_MS column, the type Arrow's timestamp[ms] maps to)

_MACROS = (
    "CREATE OR REPLACE TEMP MACRO fl(x, w) AS x - (((x % w) + w) % w)",
    "CREATE OR REPLACE TEMP MACRO ms(ts) AS epoch_ms(CAST(ts AS TIMESTAMP))",
)

_WINNERS = """
winners AS (
    SELECT * FROM (
        SELECT A.id, A.item_name, A.description, A.initial_bid, A.reserve, A.date_time,
               A.expires, A.seller, A.category, A.extra,
               B.auction, B.bidder, B.price, B.date_time AS bid_date_time, B.extra AS bid_extra,
               ROW_NUMBER() OVER (
                   PARTITION BY A.id
                   ORDER BY B.price DESC, B.date_time ASC, B.bidder ASC, B.extra ASC,
                            B.channel ASC, B.url ASC
               ) AS rn
        FROM auction A JOIN bid B ON B.auction = A.id
        WHERE B.date_time >= A.date_time AND B.date_time <= A.expires AND B.price >= A.reserve
    ) WHERE rn = 1
)"""


def _rank_counts(cond: dict[str, str]) -> str:
    parts = []
    units = (("bids", "*"), ("bidders", "DISTINCT bidder"), ("auctions", "DISTINCT auction"))
    for unit, expr in units:
        for what in ("total", "rank1", "rank2", "rank3"):
            filt = "" if what == "total" else f" FILTER (WHERE {cond[what]})"
            parts.append(f"COUNT({expr}){filt} AS {what}_{unit}")
    return ",\n    ".join(parts)


_RANKS = {
    "rank1": "price < 10000",
    "rank2": "price >= 10000 AND price < 1000000",
    "rank3": "price >= 1000000",
}

#: The DuckDB SQL of every query, over tables ``person``, ``auction`` and ``bid``.
QUERY_SQL: dict[str, str] = {
    "q0": "SELECT auction, bidder, price, channel, url, date_time, extra FROM bid",
    "q1": "SELECT auction, bidder, (price * 908) // 1000 AS price, date_time, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE auction % 123 = 0",
    "q3": """
SELECT P.name, P.city, P.state, A.id
FROM auction A JOIN person P ON A.seller = P.id
WHERE A.category = 10 AND P.state IN ('OR', 'ID', 'CA')""",
    "q4": f"""
WITH {_WINNERS}
SELECT category, CAST(SUM(price) AS DOUBLE) / COUNT(*) AS avg_price
FROM winners GROUP BY category""",
    "q5": """
WITH hop AS (
    SELECT auction, fl(ms(date_time), 2000) - 2000 * k AS ws
    FROM bid CROSS JOIN range(5) r(k)
),
counts AS (SELECT auction, ws, COUNT(*) AS num FROM hop GROUP BY auction, ws),
top AS (SELECT ws, MAX(num) AS maxn FROM counts GROUP BY ws)
SELECT c.auction, c.num, epoch_ms(c.ws) AS starttime, epoch_ms(c.ws + 10000) AS endtime
FROM counts c JOIN top t ON c.ws = t.ws AND c.num = t.maxn""",
    "q6": f"""
WITH {_WINNERS},
ranked AS (
    SELECT seller, price,
           ROW_NUMBER() OVER (PARTITION BY seller ORDER BY expires DESC, id DESC) AS k
    FROM winners
)
SELECT seller, CAST(SUM(price) AS DOUBLE) / COUNT(*) AS avg_price
FROM ranked WHERE k <= 10 GROUP BY seller""",
    "q7": """
WITH b AS (SELECT *, fl(ms(date_time), 10000) AS w FROM bid),
top AS (SELECT w, MAX(price) AS maxprice FROM b GROUP BY w)
SELECT b.auction, b.price, b.bidder, b.date_time, b.extra
FROM b JOIN top ON b.w = top.w AND b.price = top.maxprice""",
    "q8": """
WITH p AS (SELECT DISTINCT id, name, fl(ms(date_time), 10000) AS w FROM person),
a AS (SELECT DISTINCT seller, fl(ms(date_time), 10000) AS w FROM auction)
SELECT p.id, p.name, epoch_ms(p.w) AS starttime
FROM p JOIN a ON p.id = a.seller AND p.w = a.w""",
    "q9": f"""
WITH {_WINNERS}
SELECT id, item_name, description, initial_bid, reserve, date_time, expires, seller, category,
       extra, auction, bidder, price, bid_date_time, bid_extra
FROM winners""",
    "q10": """
SELECT auction, bidder, price, date_time, extra, strftime(date_time, '%Y-%m-%d') AS dt,
       strftime(date_time, '%H:%M') AS hm
FROM bid""",
    "q11": """
WITH b AS (SELECT bidder, ms(date_time) AS t FROM bid),
s AS (
    SELECT bidder, t,
           CASE WHEN t - LAG(t) OVER (PARTITION BY bidder ORDER BY t) <= 10000
                THEN 0 ELSE 1 END AS new_session
    FROM b
),
g AS (
    SELECT bidder, t,
           SUM(new_session) OVER (PARTITION BY bidder ORDER BY t ROWS UNBOUNDED PRECEDING) AS sid
    FROM s
)
SELECT bidder, COUNT(*) AS bid_count, epoch_ms(MIN(t)) AS starttime,
       epoch_ms(MAX(t) + 10000) AS endtime
FROM g GROUP BY bidder, sid""",
    "q12": """
WITH b AS (
    SELECT bidder, fl(ms(p_time), 10000) AS w FROM bid POSITIONAL JOIN bid_proc_time
)
SELECT bidder, COUNT(*) AS bid_count, epoch_ms(w) AS starttime, epoch_ms(w + 10000) AS endtime
FROM b GROUP BY bidder, w""",
    "q13": """
SELECT B.auction, B.bidder, B.price, B.date_time, S.value
FROM bid B JOIN side_input S ON B.auction % 10000 = S.key""",
    "q14": """
WITH b AS (
    SELECT *, (price * 908) // 1000 AS eur,
           (fl(ms(date_time), 3600000) // 3600000 % 24 + 24) % 24 AS h
    FROM bid
)
SELECT auction, bidder, eur AS price,
       CASE WHEN h >= 8 AND h <= 18 THEN 'dayTime'
            WHEN h <= 6 OR h >= 20 THEN 'nightTime'
            ELSE 'otherTime' END AS bid_time_type,
       date_time, extra,
       length(extra) - length(replace(extra, 'c', '')) AS c_counts
FROM b WHERE eur > 1000000 AND eur < 50000000""",
    "q15": f"""
SELECT strftime(date_time, '%Y-%m-%d') AS day,
    {_rank_counts(_RANKS)}
FROM bid GROUP BY 1""",
    "q16": f"""
SELECT channel, strftime(date_time, '%Y-%m-%d') AS day,
    MAX(strftime(date_time, '%H:%M')) AS minute,
    {_rank_counts(_RANKS)}
FROM bid GROUP BY 1, 2""",
    "q17": f"""
SELECT auction, strftime(date_time, '%Y-%m-%d') AS day,
    COUNT(*) AS total_bids,
    COUNT(*) FILTER (WHERE {_RANKS['rank1']}) AS rank1_bids,
    COUNT(*) FILTER (WHERE {_RANKS['rank2']}) AS rank2_bids,
    COUNT(*) FILTER (WHERE {_RANKS['rank3']}) AS rank3_bids,
    MIN(price) AS min_price, MAX(price) AS max_price,
    CAST(SUM(price) AS DOUBLE) / COUNT(*) AS avg_price,
    CAST(SUM(price) AS BIGINT) AS sum_price
FROM bid GROUP BY 1, 2""",
    "q18": """
SELECT auction, bidder, price, channel, url, date_time, extra FROM (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY bidder, auction
        ORDER BY date_time DESC, price DESC, channel, url, extra
    ) AS rn
    FROM bid
) WHERE rn = 1""",
    "q19": """
SELECT auction, bidder, price, channel, url, date_time, extra, rank_number FROM (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY auction
        ORDER BY price DESC, date_time, bidder, channel, url, extra
    ) AS rank_number
    FROM bid
) WHERE rank_number <= 10""",
    "q20": """
SELECT B.auction, B.bidder, B.price, B.channel, B.url, B.date_time, B.extra,
       A.item_name, A.description, A.initial_bid, A.reserve, A.date_time AS auction_date_time,
       A.expires, A.seller, A.category, A.extra AS auction_extra
FROM bid B JOIN auction A ON B.auction = A.id
WHERE A.category = 10""",
    "q21": """
SELECT auction, bidder, price, channel,
       CASE lower(channel) WHEN 'apple' THEN '0' WHEN 'google' THEN '1'
            WHEN 'facebook' THEN '2' WHEN 'baidu' THEN '3'
            ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
FROM bid
WHERE regexp_matches(url, '(&|^)channel_id=([^&]*)')
   OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
    "q22": """
SELECT auction, bidder, price, channel,
       string_split(url, '/')[4] AS dir1,
       string_split(url, '/')[5] AS dir2,
       string_split(url, '/')[6] AS dir3
FROM bid""",
}

_INPUT_SCHEMAS = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA,
                  "side_input": SIDE_INPUT_SCHEMA,
                  "bid_proc_time": pa.schema([pa.field("p_time", _TS, nullable=False)])}
#: tables a query reads beyond person/auction/bid; they must be given for it
_NEEDS = {"q12": ("bid_proc_time",), "q13": ("side_input",)}


def step_proc_times(total_events: int, chunk: int, clock: Any,
                    generator: NexmarkGenerator | None = None) -> pa.Table:
    """The ``bid_proc_time`` table of q12 for a run that pushes events in steps of ``chunk``
    events from event 0: bid ``k`` gets ``clock.now_ms(step of its event)``."""
    gen = generator or NexmarkGenerator()
    n = np.arange(total_events, dtype=np.int64)
    steps = n[gen.event_kind(n) == 2] // chunk
    uniq, inv = np.unique(steps, return_inverse=True)
    stamps = np.array([clock.now_ms(int(s)) for s in uniq], dtype=np.int64)[inv] \
        if len(uniq) else np.zeros(0, np.int64)
    return pa.table([pa.array(stamps).cast(_TS)], schema=_INPUT_SCHEMAS["bid_proc_time"])


def _to_table(data: pa.Table | pa.RecordBatch) -> pa.Table:
    return pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data


def _fetch(relation: Any) -> pa.Table:
    for name in ("to_arrow_table", "fetch_arrow_table", "arrow"):
        method = getattr(relation, name, None)
        if method is not None:
            result = method()
            return result.read_all() if isinstance(result, pa.RecordBatchReader) else result
    raise RuntimeError("this duckdb version cannot return Arrow tables")  # pragma: no cover


def reference_results(
    events: Mapping[str, pa.Table | pa.RecordBatch],
    queries: Iterable[str] | str | None = None,
) -> dict[str, pa.Table]:
    """Evaluate Nexmark queries from scratch over all ``events`` with DuckDB.

    ``events`` maps ``"person"``, ``"auction"`` and ``"bid"`` to tables with the generator's
    schemas (a missing kind is an empty table).  ``queries`` is a query name, several, or
    ``None`` for all of :data:`QUERIES`.  Each result has exactly the schema in
    :data:`QUERY_SCHEMAS`, rows sorted by all columns (the order carries no meaning).
    """
    try:
        import duckdb
    except ImportError as exc:  # pragma: no cover - exercised only without duckdb
        raise ImportError(
            "dbsp.nexmark.reference needs DuckDB as an independent reference engine: "
            "pip install dbsp[verify]"
        ) from exc

    if queries is None:  # every query whose tables are given
        names = [q for q in QUERIES if all(t in events for t in _NEEDS.get(q, ()))]
    elif isinstance(queries, str):
        names = [queries]
    else:
        names = list(queries)
    unknown = [q for q in names if q not in QUERY_SQL]
    if unknown:
        raise ValueError(f"unknown Nexmark queries {unknown}; known: {', '.join(QUERIES)}")
    extra_kinds = set(events) - set(_INPUT_SCHEMAS)
    if extra_kinds:
        raise ValueError(f"unknown event kinds {sorted(extra_kinds)}; expected person/auction/"
                         f"bid (and side_input for q13, bid_proc_time for q12)")
    for q in names:
        missing = [t for t in _NEEDS.get(q, ()) if t not in events]
        if missing:
            raise ValueError(f"{q} needs the table(s) {missing} in events")

    con = duckdb.connect()
    try:
        for kind, schema in _INPUT_SCHEMAS.items():
            table = _to_table(events[kind]) if kind in events else schema.empty_table()
            if table.schema != schema:
                try:
                    table = table.select(schema.names).cast(schema)
                except (KeyError, ValueError, pa.ArrowInvalid) as exc:
                    raise ValueError(
                        f"events[{kind!r}] does not have the Nexmark {kind} schema:\n"
                        f"{table.schema}\nexpected:\n{schema}"
                    ) from exc
            con.register(kind, table)
        for macro in _MACROS:
            con.execute(macro)
        results = {}
        for q in names:
            table = _fetch(con.sql(f"SELECT * FROM ({QUERY_SQL[q]}) ORDER BY ALL"))
            results[q] = table.cast(QUERY_SCHEMAS[q])
        return results
    finally:
        con.close()


# --- comparison -----------------------------------------------------------------------------

_EXP = "__dbsp_expected_weight"
_ACT = "__dbsp_actual_weight"


def _weighted(table: pa.Table, weight: str | None, names: list[str]) -> tuple[pa.Table, pa.Array]:
    """The value columns of ``table`` and the multiplicity of each row (1 without weights)."""
    if weight is None:
        return table.select(names), pa.array(np.ones(table.num_rows, dtype=np.int64))
    return table.select(names), pc.cast(table.column(weight), _I).combine_chunks()


def _close(a: Any, b: Any, rel_tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=rel_tol, abs_tol=0.0)
    return bool(a == b)


def compare_results(
    expected: pa.Table | pa.RecordBatch,
    actual: pa.Table | pa.RecordBatch,
    *,
    max_shown: int = 10,
    rel_tol: float = 1e-9,
    expected_weight: str | None = None,
    actual_weight: str | None = None,
) -> list[str]:
    """Differences between two multisets of rows, as human-readable lines; ``[]`` if equal.

    Rows are compared as multisets: order does not matter, multiplicities do.  A table may
    carry its multiplicities in a weight column (``expected_weight`` / ``actual_weight``,
    e.g. the weight column of a consolidated Z-set); otherwise every row counts once.  Column
    names must match (in any order) and the types should: a type difference is reported and
    the values are compared after casting.  Float columns match within ``rel_tol``; NaN
    matches NaN and null matches null.  At most ``max_shown`` differing rows are listed.
    """
    exp = _to_table(expected)
    act = _to_table(actual)
    names = [n for n in exp.column_names if n != expected_weight]
    act_names = [n for n in act.column_names if n != actual_weight]
    problems: list[str] = []
    if sorted(names) != sorted(act_names):
        missing = [n for n in names if n not in act_names]
        extra = [n for n in act_names if n not in names]
        return [f"columns differ: missing {missing}, unexpected {extra}"]
    exp_rows, exp_w = _weighted(exp, expected_weight, names)
    act_rows, act_w = _weighted(act, actual_weight, names)
    for name in names:
        et, at = exp_rows.schema.field(name).type, act_rows.schema.field(name).type
        if et != at:
            problems.append(f"column {name!r} has type {at}, expected {et}")
    # nullability is not part of the comparison: compare under one all-nullable schema
    common = pa.schema([exp_rows.schema.field(n).with_nullable(True) for n in names])
    exp_rows = exp_rows.select(names).cast(common)
    try:
        act_rows = act_rows.select(names).cast(common)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return problems + [f"cannot compare values: {exc}"]

    zeros_e = pa.array(np.zeros(exp_rows.num_rows, dtype=np.int64))
    zeros_a = pa.array(np.zeros(act_rows.num_rows, dtype=np.int64))
    both = pa.concat_tables(
        [
            exp_rows.append_column(_EXP, exp_w).append_column(_ACT, zeros_e),
            act_rows.append_column(_EXP, zeros_a).append_column(_ACT, act_w),
        ]
    )
    grouped = both.group_by(names, use_threads=False).aggregate([(_EXP, "sum"), (_ACT, "sum")])
    e_sum, a_sum = grouped.column(f"{_EXP}_sum"), grouped.column(f"{_ACT}_sum")
    diff = grouped.filter(pc.not_equal(e_sum, a_sum))
    if diff.num_rows == 0:
        return problems

    # (row values, expected multiplicity, actual multiplicity) of every differing row
    rows = diff.select(names).to_pylist()
    counts = list(
        zip(diff.column(f"{_EXP}_sum").to_pylist(), diff.column(f"{_ACT}_sum").to_pylist(),
            strict=True)
    )
    float_cols = [n for n in names if pa.types.is_floating(exp_rows.schema.field(n).type)]
    surplus = [e - a for e, a in counts]  # > 0: missing from actual, < 0: extra in actual
    if float_cols:
        _match_within_tolerance(rows, surplus, names, float_cols, rel_tol)

    missing = [(r, s, c) for r, s, c in zip(rows, surplus, counts, strict=True) if s > 0]
    extra = [(r, -s, c) for r, s, c in zip(rows, surplus, counts, strict=True) if s < 0]
    if not missing and not extra:
        return problems
    problems.append(
        f"{sum(s for _, s, _ in missing)} row(s) missing from actual ({len(missing)} distinct), "
        f"{sum(s for _, s, _ in extra)} unexpected row(s) in actual ({len(extra)} distinct); "
        f"expected {pc.sum(exp_w).as_py() or 0} rows, actual {pc.sum(act_w).as_py() or 0}"
    )
    shown = 0
    for label, items in (("missing", missing), ("unexpected", extra)):
        for row, n, (e, a) in items:
            if shown == max_shown:
                break
            problems.append(f"{label} x{n} (expected multiplicity {e}, actual {a}): {_show(row)}")
            shown += 1
    hidden = len(missing) + len(extra) - shown
    if hidden > 0:
        problems.append(f"... and {hidden} more differing row(s)")
    return problems


def _show(row: dict[str, Any]) -> str:
    """A row as ``{column: value}`` with timestamps in ISO form."""
    shown = {k: v.isoformat(sep=" ", timespec="milliseconds") if isinstance(v, datetime) else v
             for k, v in row.items()}
    return repr(shown)


def _float_key(value: Any) -> tuple[int, float]:
    if value is None:
        return (0, 0.0)
    if isinstance(value, float) and math.isnan(value):
        return (2, 0.0)
    return (1, float(value))


def _match_within_tolerance(
    rows: list[dict[str, Any]],
    surplus: list[int],
    names: list[str],
    float_cols: list[str],
    rel_tol: float,
) -> None:
    """Cancel missing against unexpected rows whose floats agree within ``rel_tol`` (in place).

    Rows are grouped by their exact (non-float) columns; inside a group, the missing and the
    unexpected rows are sorted by their float columns and matched by a merge-like sweep.
    """
    exact_cols = [n for n in names if n not in float_cols]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(tuple(row[n] for n in exact_cols), []).append(i)

    def key(i: int) -> tuple[tuple[int, float], ...]:
        return tuple(_float_key(rows[i][c]) for c in float_cols)

    for members in groups.values():
        pos = sorted((i for i in members if surplus[i] > 0), key=key)
        neg = sorted((i for i in members if surplus[i] < 0), key=key)
        a = b = 0
        while a < len(pos) and b < len(neg):
            i, j = pos[a], neg[b]
            if all(_close(rows[i][c], rows[j][c], rel_tol) for c in float_cols):
                k = min(surplus[i], -surplus[j])
                surplus[i] -= k
                surplus[j] += k
                a += surplus[i] == 0
                b += surplus[j] == 0
            elif key(i) < key(j):
                a += 1
            else:
                b += 1

"""Nexmark queries q0–q9 written against dbsp's circuit API, as a user would write them.

Each query is a function ``build(circuit, inputs) -> OutputHandle`` where ``inputs`` maps
``"person"``, ``"auction"`` and ``"bid"`` to the circuit's input streams. The definitions (result
columns, window rules, the winning-bid rule) are those of :mod:`dbsp.nexmark.reference`, whose
DuckDB SQL recomputes every result from scratch for ``dbsp nexmark --verify``.

Everything is vectorised: maps and filters are ``pyarrow.compute`` expressions over whole
batches; the stateful parts are dbsp's incremental operators (join, aggregate, top-k, distinct),
so each step does work proportional to its new events. Projections come first, so operator state
holds only the columns a query needs.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .reference import QUERY_SCHEMAS

_TS = pa.timestamp("ms")
_I = pa.int64()
WINDOW_MS = 10_000
HOP_MS = 2_000


def _f(name: str, t: pa.DataType) -> pa.Field:
    return pa.field(name, t, nullable=False)


def _ms(ts: pa.Array) -> pa.Array:
    """Epoch milliseconds of a timestamp[ms] column (zero-copy view as int64)."""
    return ts.cast(_I)


def _window_start(ts: pa.Array, width: int) -> pa.Array:
    ms = np.asarray(_ms(ts).to_numpy(zero_copy_only=False))
    return pa.array(ms - ms % width, _I).cast(_TS)


def _out(stream, name: str):
    return stream.output(name)


# -- q0..q2: stateless -----------------------------------------------------------------------

def q0(c, inp):
    """Pass-through."""
    return _out(inp["bid"], "q0")


def q1(c, inp):
    """Currency conversion: ``price * 908 // 1000``."""
    schema = QUERY_SCHEMAS["q1"]
    return _out(inp["bid"].map(lambda b: pa.RecordBatch.from_arrays(
        [b["auction"], b["bidder"], pc.divide(pc.multiply(b["price"], 908), 1000),
         b["date_time"], b["extra"]], schema=schema), schema), "q1")


def q2(c, inp):
    """Selection: bids on auctions whose id is a multiple of 123."""
    schema = QUERY_SCHEMAS["q2"]
    sel = inp["bid"].filter(lambda b: pc.equal(_mod(b["auction"], 123), 0))
    return _out(sel.map(lambda b: b.select(["auction", "price"]), schema), "q2")


def _mod(a: pa.Array, m: int) -> pa.Array:
    return pc.subtract(a, pc.multiply(pc.divide(a, m), m))


# -- q3: join ---------------------------------------------------------------------------------

_Q3_STATES = pa.array(["OR", "ID", "CA"])


def q3(c, inp):
    """Local item suggestion: category-10 auctions of sellers in OR, ID or CA."""
    schema = QUERY_SCHEMAS["q3"]
    auctions = inp["auction"].filter(lambda b: pc.equal(b["category"], 10)).map(
        lambda b: pa.RecordBatch.from_arrays([b["seller"], b["id"]],
                                             schema=pa.schema([_f("seller", _I), _f("id", _I)])))
    persons = inp["person"].filter(lambda b: pc.is_in(b["state"], value_set=_Q3_STATES)).map(
        lambda b: pa.RecordBatch.from_arrays(
            [b["id"], b["name"], b["city"], b["state"]],
            schema=pa.schema([_f("seller", _I), _f("name", pa.string()),
                              _f("city", pa.string()), _f("state", pa.string())])))

    def project(keys, avals, pvals):
        return pa.RecordBatch.from_arrays(
            [pvals["name"], pvals["city"], pvals["state"], avals["id"]], schema=schema)

    return _out(auctions.index_by(["seller"]).join(persons.index_by(["seller"]), project, schema),
                "q3")


# -- winning bids (q4, q6, q9) ----------------------------------------------------------------

def _qualifying_bids(inp, auction_cols: list[str]):
    """Bids that qualify for their auction: in ``[date_time, expires]`` and ``>= reserve``.

    Rows: ``auction, price`` + the requested auction columns (bid columns are suffixed
    ``bid_`` where they clash).
    """
    bids = inp["bid"].map(lambda b: b.select(["auction", "price", "date_time"]),
                          pa.schema([_f("auction", _I), _f("price", _I),
                                     _f("date_time", _TS)]))
    acols = ["id", "date_time", "expires", "reserve"] + [
        x for x in auction_cols if x not in ("id", "date_time", "expires", "reserve")]
    aschema = pa.schema([_f("auction", _I)] + [inp["auction"].schema.field(x).with_name(
        "a_" + x) for x in acols[1:]])
    auctions = inp["auction"].map(lambda b: pa.RecordBatch.from_arrays(
        [b[x] for x in acols], schema=aschema), aschema)
    out_schema = pa.schema([_f("auction", _I), _f("price", _I)] + [
        aschema.field("a_" + x).with_name(x) for x in auction_cols])
    pairs = bids.index_by(["auction"]).join(auctions.index_by(["auction"]))

    def qualify(b: pa.RecordBatch):
        t = b["date_time"]
        return pc.and_(pc.and_(pc.greater_equal(t, b["a_date_time"]),
                               pc.less_equal(t, b["a_expires"])),
                       pc.greater_equal(b["price"], b["a_reserve"]))

    return pairs.filter(qualify).map(lambda b: pa.RecordBatch.from_arrays(
        [b["auction"], b["price"]] + [b["a_" + x] for x in auction_cols], schema=out_schema),
        out_schema)


def q4(c, inp):
    """Average closing price per category (closing price = the winning bid's price)."""
    winners = _qualifying_bids(inp, ["category"]).index_by(["auction", "category"]) \
        .aggregate({"final": ("max", "price")})
    avg = winners.index_by(["category"]).aggregate({"avg_price": ("avg", "final")})
    return _out(avg, "q4")


def q6(c, inp):
    """Average selling price of each seller's last 10 won auctions (by ``expires, id``)."""
    winners = _qualifying_bids(inp, ["seller", "expires"]) \
        .index_by(["auction", "seller", "expires"]).aggregate({"final": ("max", "price")})
    last10 = winners.index_by(["seller"]).topk(10, ["expires", "auction"], descending=True)
    avg = last10.index_by(["seller"]).aggregate({"avg_price": ("avg", "final")})
    return _out(avg.map(lambda b: b.select(["seller", "avg_price"]), QUERY_SCHEMAS["q6"]), "q6")


# -- windows (q5, q7, q8) ---------------------------------------------------------------------

def q5(c, inp):
    """Hot items: per 10 s window sliding by 2 s, the auction(s) with the most bids."""
    k = WINDOW_MS // HOP_MS
    wschema = pa.schema([_f("auction", _I), _f("starttime", _TS)])

    def windows(b: pa.RecordBatch):
        ms = np.asarray(_ms(b["date_time"]).to_numpy(zero_copy_only=False))
        last = ms - ms % HOP_MS
        n = len(ms)
        starts = (last[:, None] - HOP_MS * np.arange(k)[None, :]).reshape(-1)
        parent = np.repeat(np.arange(n, dtype=np.int64), k)
        out = pa.RecordBatch.from_arrays(
            [b["auction"].take(pa.array(parent)), pa.array(starts, _I).cast(_TS)], schema=wschema)
        return out, parent

    per_window = inp["bid"].flat_map(windows, wschema)
    counts = per_window.index_by(["starttime", "auction"]).aggregate({"num": ("count", None)})
    top = counts.index_by(["starttime"]).aggregate({"num": ("max", "num")})
    hot = counts.index_by(["starttime", "num"]).semijoin(top.index_by(["starttime", "num"]))
    schema = QUERY_SCHEMAS["q5"]
    return _out(hot.map(lambda b: pa.RecordBatch.from_arrays(
        [b["auction"], b["num"], b["starttime"],
         pa.array(_ms(b["starttime"]).to_numpy(zero_copy_only=False) + WINDOW_MS, _I).cast(_TS)],
        schema=schema), schema), "q5")


def q7(c, inp):
    """Highest bid: every bid whose price is its tumbling 10 s window's maximum."""
    wschema = pa.schema([_f("window", _TS), _f("auction", _I), _f("price", _I),
                         _f("bidder", _I), _f("date_time", _TS), _f("extra", pa.string())])
    bids = inp["bid"].map(lambda b: pa.RecordBatch.from_arrays(
        [_window_start(b["date_time"], WINDOW_MS), b["auction"], b["price"], b["bidder"],
         b["date_time"], b["extra"]], schema=wschema), wschema)
    pschema = pa.schema([_f("window", _TS), _f("price", _I)])
    maxes = bids.map(lambda b: b.select(["window", "price"]), pschema) \
        .index_by(["window"]).aggregate({"price": ("max", "price")})
    best = bids.index_by(["window", "price"]).semijoin(maxes.index_by(["window", "price"]))
    schema = QUERY_SCHEMAS["q7"]
    return _out(best.map(lambda b: b.select(schema.names), schema), "q7")


def q8(c, inp):
    """New users: persons who opened an auction in the tumbling 10 s window they joined in."""
    pschema = pa.schema([_f("id", _I), _f("starttime", _TS), _f("name", pa.string())])
    aschema = pa.schema([_f("id", _I), _f("starttime", _TS)])
    persons = inp["person"].map(lambda b: pa.RecordBatch.from_arrays(
        [b["id"], _window_start(b["date_time"], WINDOW_MS), b["name"]], schema=pschema), pschema)
    sellers = inp["auction"].map(lambda b: pa.RecordBatch.from_arrays(
        [b["seller"], _window_start(b["date_time"], WINDOW_MS)], schema=aschema), aschema)
    matched = persons.index_by(["id", "starttime"]).semijoin(
        sellers.index_by(["id", "starttime"]))
    schema = QUERY_SCHEMAS["q8"]
    return _out(matched.map(lambda b: b.select(schema.names), schema).distinct(), "q8")


def q9(c, inp):
    """Winning bids: every auction with a winner, joined with its winning bid."""
    # the winner is the first qualifying bid by (price desc, date_time, bidder, extra, channel,
    # url); top-1 per auction over a sort key with the price negated
    bschema = pa.schema([_f("auction", _I), _f("neg_price", _I), _f("bid_date_time", _TS),
                         _f("bidder", _I), _f("bid_extra", pa.string()),
                         _f("channel", pa.string()), _f("url", pa.string()), _f("price", _I)])
    bids = inp["bid"].map(lambda b: pa.RecordBatch.from_arrays(
        [b["auction"], pc.negate(b["price"]), b["date_time"], b["bidder"], b["extra"],
         b["channel"], b["url"], b["price"]], schema=bschema), bschema)
    auctions = inp["auction"]
    aschema = auctions.schema
    out_schema = QUERY_SCHEMAS["q9"]
    qschema = pa.schema(list(bschema) + [f.with_name("a_" + f.name) for f in aschema
                                         if f.name != "id"])

    def project(keys, bv, av):
        cols = [keys["auction"]] + [bv[n] for n in bschema.names[1:]] + \
               [av[f.name] for f in aschema if f.name != "id"]
        return pa.RecordBatch.from_arrays(cols, schema=qschema)

    def qualify(b: pa.RecordBatch):
        t = b["bid_date_time"]
        return pc.and_(pc.and_(pc.greater_equal(t, b["a_date_time"]),
                               pc.less_equal(t, b["a_expires"])),
                       pc.greater_equal(b["price"], b["a_reserve"]))

    a_by_id = auctions.map(lambda b: b.rename_columns(["auction"] + aschema.names[1:]),
                           pa.schema([aschema.field(0).with_name("auction")] + list(aschema)[1:]))
    q = bids.index_by(["auction"]).join(a_by_id.index_by(["auction"]), project, qschema) \
        .filter(qualify)
    win = q.index_by(["auction"]).topk(
        1, ["neg_price", "bid_date_time", "bidder", "bid_extra", "channel", "url"])

    def project(b: pa.RecordBatch):
        cols = [b["auction"]] + [b["a_" + f.name] for f in aschema if f.name != "id"] + \
               [b["auction"], b["bidder"], b["price"], b["bid_date_time"], b["bid_extra"]]
        return pa.RecordBatch.from_arrays(cols, schema=out_schema)

    return _out(win.map(project, out_schema), "q9")


QUERIES: dict[str, Callable] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8,
    "q9": q9,
}

__all__ = ["QUERIES"]

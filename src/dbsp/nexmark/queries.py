"""Nexmark queries q0–q9 written with dbsp's fluent API, as a user would write them.

Each query is a function ``build(streams) -> DataStream`` where ``streams`` maps ``"person"``,
``"auction"`` and ``"bid"`` to the :class:`~dbsp.api.StreamContext` input streams (event time
``date_time``). The definitions (result columns, window rules, the winning-bid rule) are those of
:mod:`dbsp.nexmark.reference`, whose DuckDB SQL recomputes every result from scratch for
``dbsp nexmark --verify``.

Everything is vectorised (column expressions compile to Arrow kernels) and every stateful
operator is incremental, so a step costs work proportional to its new events. Projections come
first, so operator state holds only the columns a query needs.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Callable

from ..api import avg, col, count, hopping, max_, tumbling

WINDOW = timedelta(seconds=10)
HOP = timedelta(seconds=2)


def q0(s):
    """Pass-through: every bid."""
    return s["bid"]


def q1(s):
    """Currency conversion: ``price * 908 // 1000`` (0.908, exact in integers)."""
    return s["bid"].select("auction", "bidder", (col("price") * 908 // 1000).alias("price"),
                           "date_time", "extra")


def q2(s):
    """Selection: bids on auctions whose id is a multiple of 123."""
    return s["bid"].filter(col("auction") % 123 == 0).select("auction", "price")


def q3(s):
    """Local item suggestion: category-10 auctions of sellers in OR, ID or CA."""
    auctions = s["auction"].filter(col("category") == 10).select("id", "seller")
    persons = s["person"].filter(col("state").is_in(["OR", "ID", "CA"])) \
        .select("id", "name", "city", "state")
    return auctions.join(persons, left_on="seller", right_on="id") \
        .select("name", "city", "state", "id")


def _qualifying_bids(s, *auction_cols: str):
    """Bids within their auction's ``[date_time, expires]`` and at least its reserve, with the
    requested auction columns."""
    bids = s["bid"].select("auction", "price", "date_time")
    auctions = s["auction"].select("id", "reserve", "expires",
                                   col("date_time").alias("opened"), *auction_cols)
    j = bids.join(auctions, left_on="auction", right_on="id")
    return j.filter(col("date_time").between(col("opened"), col("expires"))
                    & (col("price") >= col("reserve")))


def q4(s):
    """Average closing price per category (closing price: the winning bid's price)."""
    winners = _qualifying_bids(s, "category").group_by("auction", "category") \
        .agg(final=max_("price"))
    return winners.group_by("category").agg(avg_price=avg("final"))


def q5(s):
    """Hot items: per 10 s window sliding by 2 s, the auction(s) with the most bids."""
    counts = s["bid"].select("auction", "date_time").group_by("auction") \
        .window(hopping(WINDOW, HOP)).agg(num=count())
    top = counts.group_by("window_start").agg(num=max_("num"))
    hot = counts.join(top, on=["window_start", "num"], how="semi")
    return hot.select("auction", "num", col("window_start").alias("starttime"),
                      col("window_end").alias("endtime"))


def q6(s):
    """Average selling price of each seller's last 10 won auctions (last: greatest expires, id)."""
    winners = _qualifying_bids(s, "seller").group_by("auction", "seller", "expires") \
        .agg(final=max_("price"))
    last10 = winners.group_by("seller").topk(10, by=["expires", "auction"], descending=True)
    return last10.group_by("seller").agg(avg_price=avg("final"))


def q7(s):
    """Highest bid: every bid whose price is its tumbling 10 s window's maximum."""
    bids = s["bid"].select("auction", "price", "bidder", "date_time", "extra",
                           col("date_time").dt.floor(WINDOW).alias("window_start"))
    maxes = s["bid"].select("price", "date_time").window(tumbling(WINDOW)) \
        .agg(price=max_("price"))
    best = bids.join(maxes, on=["window_start", "price"], how="semi")
    return best.select("auction", "price", "bidder", "date_time", "extra")


def q8(s):
    """New users: persons who opened an auction in the tumbling 10 s window they joined in."""
    persons = s["person"].select("id", "name", col("date_time").dt.floor(WINDOW)
                                 .alias("starttime"))
    sellers = s["auction"].select("seller", col("date_time").dt.floor(WINDOW)
                                  .alias("starttime"))
    return persons.join(sellers, left_on=["id", "starttime"], right_on=["seller", "starttime"],
                        how="semi").distinct()


def q9(s):
    """Winning bids: every auction with a winner, with its winning bid (the first qualifying bid
    by price desc, then date_time, bidder, extra, channel, url)."""
    bids = s["bid"].select("auction", "bidder", "price", "channel", "url",
                           col("date_time").alias("bid_date_time"),
                           col("extra").alias("bid_extra"), (-col("price")).alias("neg_price"))
    auctions = s["auction"]
    j = bids.join(auctions, left_on="auction", right_on="id")
    ok = j.filter(col("bid_date_time").between(col("date_time"), col("expires"))
                  & (col("price") >= col("reserve")))
    win = ok.group_by("auction").topk(1, by=["neg_price", "bid_date_time", "bidder",
                                             "bid_extra", "channel", "url"])
    return win.select(col("auction").alias("id"), "item_name", "description", "initial_bid",
                      "reserve", "date_time", "expires", "seller", "category", "extra",
                      "auction", "bidder", "price", "bid_date_time", "bid_extra")


QUERIES: dict[str, Callable] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8,
    "q9": q9,
}

__all__ = ["QUERIES"]

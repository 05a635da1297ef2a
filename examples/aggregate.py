"""Incremental GROUP BY: linear aggregates (count/sum/avg: running partials) and general ones
(min/max/count_distinct: recomputed for the touched groups), plus a per-group top-k."""
import pyarrow as pa

import dbsp

with dbsp.Circuit(workers=2) as c:
    bids = c.add_input("bids", [("auction", pa.int64()), ("bidder", pa.string()),
                                ("price", pa.int64())])
    by_auction = bids.index_by(["auction"])
    stats = by_auction.aggregate({
        "n": ("count", None), "total": ("sum", "price"), "avg": ("avg", "price"),
        "best": ("max", "price"), "bidders": ("count_distinct", "bidder"),
    }).output()
    top2 = by_auction.topk(2, ["price"], descending=True, rank="place").output()

    bids.insert([(1, "ann", 10), (1, "bob", 30), (1, "ann", 20), (2, "cy", 5)])
    c.step()
    print(sorted(stats.to_dict()))     # (1, 3, 60, 20.0, 30, 2), (2, 1, 5, 5.0, 5, 1)
    print(sorted(top2.view_dict()))

    bids.delete([(1, "bob", 30)])       # only auction 1 is recomputed
    c.step()
    print(sorted(stats.to_dict().items()))   # -old row, +new row of auction 1
    print(sorted(top2.view_dict()))

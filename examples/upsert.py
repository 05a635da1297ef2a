"""Upsert: an input keyed by a column replaces the current row of a key instead of adding one."""
import pyarrow as pa

import dbsp

with dbsp.Circuit() as c:
    prices = c.add_input("prices", [("item", pa.string()), ("price", pa.int64())], key=["item"])
    cheap = prices.filter(lambda b: pa.compute.less(b["price"], 10)).output()

    prices.upsert([("apple", 3), ("pear", 12), ("apple", 4)])   # the last row of a key wins
    c.step()
    print(cheap.to_dict())             # {('apple', 4): 1}
    prices.upsert([("pear", 8), ("apple", 15)])                  # -old +new for each key
    c.step()
    print(sorted(cheap.to_dict().items()))   # apple leaves, pear enters

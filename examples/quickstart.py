"""Quickstart: a circuit, an input, a filter + map, and the output's delta and view."""
import pyarrow as pa
import pyarrow.compute as pc

import dbsp

with dbsp.Circuit() as c:
    orders = c.add_input("orders", [("id", pa.int64()), ("amount", pa.float64())])
    big = (orders.filter(lambda b: pc.greater(b["amount"], 100.0))
                 .map(lambda b: {"id": b["id"], "with_tax": pc.multiply(b["amount"], 1.2)}))
    out = big.output()

    orders.insert([(1, 50.0), (2, 150.0), (3, 500.0)])
    c.step()
    print("step 1 delta:", out.to_dict())      # {(2, 180.0): 1, (3, 600.0): 1}

    orders.delete([(3, 500.0)])                 # a retraction flows through as weight -1
    orders.insert([(4, 120.0)])
    c.step()
    print("step 2 delta:", out.to_dict())      # {(3, 600.0): -1, (4, 144.0): 1}
    print("view:", out.view_dict())            # {(2, 180.0): 1, (4, 144.0): 1}
    print(out.to_pandas())                     # the delta as a DataFrame with __weight

"""Incremental joins: inner, left outer and anti join of two indexed streams, on 2 workers."""
import pyarrow as pa

import dbsp

with dbsp.Circuit(workers=2) as c:
    emp = c.add_input("emp", [("name", pa.string()), ("dept", pa.int64())])
    dept = c.add_input("dept", [("id", pa.int64()), ("title", pa.string())])
    e, d = emp.index_by(["dept"]), dept.index_by(["id"])
    inner = e.join(d).output()               # rows: dept ++ name ++ title
    left = e.left_join(d).output()           # unmatched employees get title = None
    orphans = e.antijoin(d).output()         # employees of unknown departments

    emp.insert([("ann", 1), ("bob", 2), ("cy", 3)])
    dept.insert([(1, "sales"), (2, "ops")])
    c.step()
    print("inner:", sorted(inner.to_dict()))
    print("left:", sorted(left.to_dict(), key=str))
    print("orphans:", orphans.to_dict())     # {(3, 'cy'): 1}

    dept.insert([(3, "lab")])                # cy finds a department: the padded row is retracted
    dept.delete([(2, "ops")])                # bob loses his
    c.step()
    print("left delta:", sorted(left.to_dict().items(), key=str))
    print("orphans delta:", orphans.to_dict())

"""Recursion: the transitive closure of a graph, maintained under edge inserts and deletes."""
import pyarrow as pa

import dbsp

E = pa.schema([pa.field("src", pa.int64(), False), pa.field("dst", pa.int64(), False)])


def closure(paths, edges):
    """x = distinct(edges ∪ x∘edges): the body is built from ordinary stream operators."""
    longer = paths.index_by(["dst"]).join(
        edges.index_by(["src"]), lambda k, l, r: {"src": l["src"], "dst": r["dst"]}, E)
    return edges.plus(longer).distinct()


with dbsp.Circuit(workers=2) as c:
    edges = c.add_input("edges", E)
    reach = c.recursive(closure, edges).output()

    edges.insert([(1, 2), (2, 3), (3, 4)])
    c.step()
    print("closure:", sorted(reach.view_dict()))
    edges.insert([(4, 1)])                 # insert-only: seeded from the last fixed point
    c.step()
    print("new paths:", len(reach.to_dict()))
    edges.delete([(2, 3)])                 # a retraction: the fixed point is recomputed
    c.step()
    print("closure:", sorted(reach.view_dict()))

"""dbsp.algebra.identity: the caches by schema object in front of codec_for and empty_batch give
what the value-keyed caches give, for the same object and for an equal one."""
import gc

import pyarrow as pa

from dbsp.algebra.codes import codec_for
from dbsp.algebra.identity import IdentityCache
from dbsp.algebra.schema import empty_batch


def _schema():
    return pa.schema([pa.field("k", pa.int64(), False), pa.field("v", pa.float64())])


def test_identity_cache_keeps_by_object_and_extra():
    c = IdentityCache(cap=3)
    a, b = _schema(), _schema()  # equal, not the same object
    assert c.put(a, 1) == 1 and c.get(a) == 1
    assert c.get(b) is None and c.get(a, "x") is None
    c.put(a, 2, "x")
    assert c.get(a, "x") == 2 and c.get(a) == 1
    c.put(b, 3)
    c.put(pa.schema([]), 4)  # full: cleared, then kept
    assert c.get(a) is None and c.get(b) is None


def test_codec_and_empty_batch_by_object_match_by_value():
    a, b = _schema(), _schema()
    ca = codec_for(a)
    assert codec_for(a) is ca and codec_for(b) is ca  # one codec per schema value
    assert codec_for(a, ["k"]) is codec_for(b, ("k",)) is not ca
    assert codec_for(a, ["k"]).fields == [a.field("k")]
    ea = empty_batch(a)
    assert empty_batch(a) is ea and empty_batch(b) is ea
    assert ea.schema == a and ea.num_rows == 0


def test_a_dropped_schema_does_not_alias_a_new_one():
    """The cache holds the schema it was given, so a new object never gets its id (and a value
    of another schema)."""
    a = _schema()
    codec_for(a)
    del a
    gc.collect()
    other = pa.schema([pa.field("z", pa.int32(), False)])
    assert codec_for(other).fields == list(other)
    assert empty_batch(other).schema == other

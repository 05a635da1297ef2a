"""How the batches of the layers above storage cross a process boundary without pickle.

:mod:`dbsp.storage.wire` sends record batches, numpy arrays, code arrays and codecs by their
buffers, and objects of the layers above by the parts :func:`~dbsp.storage.wire.register`
names: a Z-set is its record batch and weights, an ordered batch adds its codes and codec, an
indexed batch its key and value layers; a keyed Z-set (an input's part sorted for its
``index_by``) its rows and key, its codes encoded again on arrival. What a batch only caches
in its own process (probe hits, Bloom filters, memos, a sorted part's source batch) stays
behind; a batch carrying a key filter is pickled as before (the filter is part of what a
spilled batch promises).

The receiving process finds these makers by their module (imported on first use), so a process
that never imported this module still reads what one that did sends.
"""
from __future__ import annotations

from ..algebra.codes import codec_for
from ..operators.output import SortedPart
from ..storage import wire
from ..trace.batch import DistinctZSet, KeyedZSet, OrdIndexedZSet, OrdZSet, ZSet


def make_zset(data, weights) -> ZSet:
    return ZSet(data, weights)


def make_distinct(data, weights) -> DistinctZSet:
    return DistinctZSet(data, weights)


def make_keyed(data, weights, key) -> KeyedZSet:
    """A :class:`KeyedZSet` travels as its rows, weights and key: its codes are encoded again
    here (for a part of 4,500 rows, 7 us; their 16 bytes a row through the socket, 11 us)."""
    key = list(key)
    vnames = [n for n in data.schema.names if n not in key]
    return KeyedZSet(data, weights, tuple(key),
                     codec_for(data.schema, key).encode_batch(data.select(key)),
                     codec_for(data.schema, vnames).encode_batch(data.select(vnames)))


def make_ord(data, weights, codes, codec) -> OrdZSet:
    return OrdZSet(data, weights, codes, codec)


def make_sorted_part(data, weights, codec, nkey) -> SortedPart:
    return SortedPart(data, weights, codec, nkey)


def make_indexed(keys, kcodes, offsets, vals, vcodes, weights, kcodec, vcodec) -> OrdIndexedZSet:
    return OrdIndexedZSet(keys, kcodes, offsets, vals, vcodes, weights, kcodec, vcodec)


def _ord_parts(z: OrdZSet):
    if z.key_filter is not None:
        return None
    return (z.data, z.weights, z.codes, z.codec)


wire.register(ZSet, lambda z: (z.data, z.weights), make_zset)
wire.register(DistinctZSet, lambda z: (z.data, z.weights), make_distinct)
wire.register(KeyedZSet, lambda z: (z.data, z.weights, z.key), make_keyed)
wire.register(OrdZSet, _ord_parts, make_ord)
wire.register(SortedPart, lambda z: (z.data, z.weights, z.codec, z.nkey), make_sorted_part)
wire.register(OrdIndexedZSet, lambda b: (b.keys, b.kcodes, b.offsets, b.vals, b.vcodes,
                                         b.weights, b.kcodec, b.vcodec), make_indexed)

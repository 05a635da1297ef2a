"""exchange: re-shard a stream so that every key (or row) lives on exactly one worker.

The operator side of :mod:`dbsp.circuit.exchange` (the sharding function and the transport
interface). Each worker splits its batch into one part per worker by
:func:`~dbsp.circuit.exchange.shard_rows` over the worker context's layout (``ctx.shards``, a
:class:`~dbsp.circuit.exchange.ShardMap`: the same in every process, and the one the driver's
input placement uses), and swaps parts through the circuit's transport. Received parts are sorted runs, so they are combined by one k-way merge.
With one worker, or when its input arrives already sharded by the same hash (an input the
driver dealt by this key, :mod:`dbsp.runtime.placement`), the operator passes its input through.
"""
from __future__ import annotations

from ..algebra import kernels as K
from ..algebra.schema import take
from ..circuit.exchange import shard_rows
from ..circuit.operator import Operator
from ..circuit.types import IndexedType
from ..trace.batch import OrdIndexedZSet, OrdZSet
from ._values import add, empty_of


class ExchangeOperator(Operator):
    name = "exchange"

    def __init__(self, ctx, type_):
        super().__init__(ctx)
        self.type = type_
        #: set by the replica when the input arrives already sharded by this exchange's hash
        #: (an input dealt by key at the driver, :mod:`dbsp.runtime.placement`)
        self.local = False

    @property
    def passes_empty(self) -> bool:  # type: ignore[override]
        """A pass-through (one worker, or input already sharded); with W > 1 every worker
        takes part in every exchange, empty or not."""
        return self.ctx.workers == 1 or self.local

    def eval(self, value):
        W = self.ctx.workers
        if W == 1 or self.local:
            return value if isinstance(self.type, IndexedType) else value.consolidate()
        if isinstance(self.type, IndexedType):
            parts = _split_indexed(value, self.ctx.shards)
        else:
            parts = _split_zset(value.consolidate(), self.ctx.shards)
        got = self.ctx.transport.exchange(self.ctx.worker, parts)
        got = [g for g in got if g is not None and len(g)]
        if not got:
            return empty_of(self.type)
        if len(got) == 1:
            return got[0]
        return (OrdIndexedZSet.merge(got) if isinstance(self.type, IndexedType)
                else OrdZSet.merge(got))


def _split_indexed(ix: OrdIndexedZSet, shards) -> list:
    """Per worker the keys of ``ix`` it owns with their values (None: no key), each worker's
    keys and rows found in one native pass (:func:`~dbsp.algebra.kernels.owner_key_rows`) and
    gathered once per layer."""
    W = shards.workers
    nk = ix.num_keys
    if nk == 0:
        return [None] * W
    if type(ix) is not OrdIndexedZSet:  # (a batch of another layout: its own selection)
        return [ix.select_keys(idx) if len(idx) else None
                for idx in shard_rows(ix.kcodes, shards)]
    korder, kb, rorder, rb, offs, vout, wout = K.owner_key_rows(
        ix.kcodes, ix.offsets, shards.owners, shards.bits, W, ix.vcodes, ix.weights)
    out: list = []
    for w in range(W):
        k0, k1 = int(kb[w]), int(kb[w + 1])
        if k0 == k1:
            out.append(None)
        elif k1 - k0 == nk:  # every key: the batch as it is
            out.append(ix)
        else:
            ki, r0, r1 = korder[k0:k1], int(rb[w]), int(rb[w + 1])
            ri = rorder[r0:r1]
            out.append(OrdIndexedZSet(take(ix.keys, ki), K.take(ix.kcodes, ki),
                                      offs[k0 + w:k1 + w + 1], take(ix.vals, ri),
                                      K.take(ix.vcodes, ri) if vout is None else vout[r0:r1],
                                      wout[r0:r1], ix.kcodec, ix.vcodec))
    return out


def _split_zset(z: OrdZSet, shards) -> list:
    if len(z) == 0:
        return [None] * shards.workers
    out = []
    for idx in shard_rows(z.codes, shards):
        out.append(OrdZSet(take(z.data, idx), z.weights[idx], K.take(z.codes, idx), z.codec)
                   if len(idx) else None)
    return out


class BroadcastOperator(Operator):
    """Every worker gets the whole of each step's change: the parts of all workers, summed
    (for a small side that every worker keeps whole, e.g. a lookup join's side input)."""

    name = "broadcast"

    def __init__(self, ctx, type_):
        super().__init__(ctx)
        self.type = type_

    @property
    def passes_empty(self) -> bool:  # type: ignore[override]
        return self.ctx.workers == 1  # with W > 1 every worker takes part in every gather

    def eval(self, value):
        if self.ctx.workers == 1:
            return value
        got = self.ctx.transport.all_gather(self.ctx.worker, value if len(value) else None)
        return add(self.type, got)


def broadcast(stream):
    """``stream`` with every worker seeing every worker's change (see
    :class:`BroadcastOperator`)."""
    return stream.circuit.add_node("broadcast", lambda ctx: BroadcastOperator(ctx, stream.type),
                                   [stream], stream.type)


def shard(stream):
    out = stream.circuit.add_node("exchange", lambda ctx: ExchangeOperator(ctx, stream.type),
                                  [stream], stream.type)
    stream.circuit.nodes[out.node].info["exchange"] = True
    return out


def sharded(stream):
    """``stream`` sharded by key (indexed) or row (Z-set) hash, unless it already comes straight
    out of an exchange (so chained operators do not re-shard): what every operator that needs a
    key's rows together puts in front of itself."""
    if stream.circuit.nodes[stream.node].info.get("exchange"):
        return stream
    return shard(stream)


__all__ = ["shard", "sharded", "broadcast", "ExchangeOperator", "BroadcastOperator"]

"""Input placement: deal each input's rows to the workers by the key its first exchange uses.

Every operator is correct whatever rows a worker holds; the ones that need keys together (join,
aggregate, distinct, top-k) put an exchange in front of themselves. The exchange is the costly
part of a multi-worker step: every worker splits its batch, serialises a part for every other
worker, waits for the slowest one, and merges what it received. When the rows of an input reach
an exchange only through ``index_by(key)``, the driver can instead deal the input's rows by the
hash of that same key when it splits the step's input (the codes and the hash are the very ones
the exchange computes: :func:`dbsp.circuit.exchange.deal`). Every key
then already lives on the worker the exchange would send it to, and that exchange passes its
input through: no split, no transfer, no wait.

:func:`plan` picks, for each input of the top-level circuit, the key used by the most exchanges
directly downstream of an ``index_by`` of it (ties: the first built), and names the exchanges
that this makes local (also through a join's ``recode_keys``, which only widens the key's
nullability: the driver then encodes with the widened schema). A *combiner* counts as such an
exchange: a linear aggregate right after ``index_by`` of an input sums each worker's rows per
key and swaps those partials by key hash; on an input dealt by that key each worker owns every
key it holds, so it skips the swap (``local``) and the step costs what it costs one worker on
its rows. Exchanges over other keys, over
streams derived further (a map, a join output), and inside nested circuits are unaffected.
With one worker there is nothing to place.

A *sliced* input (:mod:`dbsp.runtime.slices`: each worker reads its own pieces of the source,
no row passes through the driver) is placed the same way, but its rows are dealt by the
workers: in the input's step each worker deals the rows it read by the hash of the chosen key
and swaps them with the others in one exchange of raw rows
(:class:`~dbsp.operators.input.InputOperator`'s ``deal_key``). From there on the input is as
if the driver had dealt it, and the exchanges downstream are local. The alternative,
exchanging after ``index_by``, splits and merges sorted indexed batches, after every worker has
sorted rows it then sends away (join + average, 10K events a step, two workers: 2.15M
instructions a step for that exchange, 1.29M for the deal and its exchange).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from ..circuit.exchange import exchange_source


@dataclass(frozen=True)
class Placement:
    #: input node id -> ``(key column names, key schema at the exchange)`` the driver deals its
    #: rows by
    input_keys: dict = field(default_factory=dict)
    #: exchange (and combiner) node ids whose input arrives already sharded (they pass it
    #: through, or skip the swap of partials), and the sliced inputs whose rows the workers
    #: deal by the key of those exchanges (:class:`~dbsp.circuit.scheduler.Scheduler`)
    local_exchanges: frozenset = frozenset()


def plan(nodes: Sequence, workers: int, unplaced: frozenset = frozenset()) -> Placement:
    """The placement of the inputs of ``nodes`` (a frozen circuit's node list). ``unplaced``:
    input node ids whose rows the driver does not deal (the workers read them from a sliced
    source, :mod:`dbsp.runtime.slices`): the workers deal those rows by the chosen key among
    themselves, in the input's step (one exchange of the raw rows, before any ``index_by``
    sorts them), and the exchanges downstream are local as on a driver-dealt input."""
    if workers <= 1:
        return Placement()
    uses: dict = defaultdict(list)  # input id -> [((names, key schema), exchange id)]
    for e in nodes:
        got = exchange_source(nodes, e)
        if got is not None:
            uses[got[0]].append((got[1], e.id))
    keys: dict = {}
    local: set = set()
    for inp, us in uses.items():
        counts = Counter(k for k, _ in us)
        best = max(counts.values())
        key = next(k for k, _ in us if counts[k] == best)
        keys[inp] = key
        local.update(e for k, e in us if k == key)
    local.update(i for i in keys if i in unplaced)
    return Placement({i: k for i, k in keys.items() if i not in unplaced}, frozenset(local))


__all__ = ["Placement", "plan"]

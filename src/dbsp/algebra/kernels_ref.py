"""Reference kernels in numpy / pure Python: the specification of ``dbsp._native``.

Every function here has a native twin with the same signature and results (see
:mod:`dbsp.algebra.kernels`). They are slow but obviously right, and the native tests compare
against them. A *code array* is a ``uint64`` numpy array or a :class:`VarCodes`
(see :mod:`dbsp.algebra.codes`); both order rows by unsigned / ``memcmp`` comparison.

Conventions
-----------
* ``perm`` / ``idx`` arrays are ``int64``.
* "sorted" always means ascending by ``(kcodes, vcodes)`` (``vcodes`` may be ``None``).
* "consolidated" means sorted, no two rows with equal codes, no zero weight.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa

from .checked import mul_overflows
from .codes import CodeArray, Codes, VarCodes


def _keys(codes: CodeArray) -> list:
    return Codes.to_list(codes)


def take(codes: CodeArray, idx: np.ndarray) -> CodeArray:
    """Rows ``idx`` of a code array."""
    if Codes.is_u64(codes):
        return codes[idx]
    rows = codes.to_list()
    return VarCodes.from_list([rows[i] for i in idx])


def take_runs(parts: Sequence[CodeArray], idx: np.ndarray) -> CodeArray:
    """``np.concatenate(parts)[idx]``: rows ``idx`` of the concatenation of 1-d arrays of one
    fixed-width dtype, or of :class:`VarCodes` (positions outside it raise IndexError)."""
    if not parts:
        raise ValueError("take_runs of no arrays")
    if isinstance(parts[0], VarCodes):
        if not all(isinstance(q, VarCodes) for q in parts):
            raise TypeError("take_runs of u64 and var code arrays")
        o, d = take_var_runs([(q.offsets, q.data) for q in parts], idx)
        return VarCodes(o, d)
    parts = [np.asarray(q) for q in parts]
    allp = np.concatenate(parts)
    idx = np.asarray(idx, dtype=np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= len(allp)):
        raise IndexError(f"take_runs: index out of range for {len(allp)} rows")
    return allp[idx]


def take_var_runs(parts: Sequence[tuple], idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` of the concatenation of ``(offsets, data)`` runs in Arrow binary layout
    (offsets int32 or int64, one dtype for all): ``(offsets from 0 of that dtype, data)``."""
    if not parts:
        raise ValueError("take_var_runs of no runs")
    odt = np.asarray(parts[0][0]).dtype
    if odt not in (np.dtype(np.int32), np.dtype(np.int64)):
        raise TypeError(f"take_var_runs: offsets must be int32 or int64, not {odt}")
    rows: list[bytes] = []
    for o, d in parts:
        o = np.asarray(o)
        if o.dtype != odt:
            raise TypeError("take_var_runs: every run's offsets of one dtype")
        b = np.asarray(d, np.uint8).tobytes()
        rows.extend(b[o[i]:o[i + 1]] for i in range(len(o) - 1))
    idx = np.asarray(idx, dtype=np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= len(rows)):
        raise IndexError(f"take_var_runs: index out of range for {len(rows)} rows")
    got = [rows[i] for i in idx]
    lens = np.fromiter((len(r) for r in got), dtype=np.int64, count=len(got))
    offs = np.zeros(len(got) + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    if odt == np.int32 and offs[-1] > np.iinfo(np.int32).max:
        raise OverflowError("take_var_runs: more than 2**31 - 1 bytes for int32 offsets")
    return offs.astype(odt), np.frombuffer(b"".join(got), dtype=np.uint8)


def concat(parts: Sequence[CodeArray]) -> CodeArray:
    """Concatenate code arrays of the same kind."""
    if not parts:
        raise ValueError("concat of no code arrays")
    if Codes.is_u64(parts[0]):
        return np.concatenate(parts).astype(np.uint64, copy=False)
    rows: list[bytes] = []
    for p in parts:
        rows.extend(p.to_list())
    return VarCodes.from_list(rows)


def argsort(kcodes: CodeArray, vcodes: Optional[CodeArray] = None) -> np.ndarray:
    """Stable permutation that sorts rows by ``(kcodes, vcodes)``."""
    k = _keys(kcodes)
    v = _keys(vcodes) if vcodes is not None else None
    order = sorted(range(len(k)), key=(lambda i: (k[i], v[i])) if v is not None else k.__getitem__)
    return np.asarray(order, dtype=np.int64)


def sort_consolidate(kcodes: CodeArray, vcodes: Optional[CodeArray], weights: np.ndarray):
    """Sort rows by code and sum the weights of equal rows, dropping zero sums.

    Returns ``(perm, w)``: ``perm[i]`` is the first input row (stable order) of the ``i``-th
    distinct row and ``w[i]`` its summed weight; rows whose weights sum to zero are dropped.
    """
    order = argsort(kcodes, vcodes)
    k = _keys(kcodes)
    v = _keys(vcodes) if vcodes is not None else None
    perm: list[int] = []
    ws: list[int] = []
    prev = None
    for i in order:
        key = (k[i], v[i]) if v is not None else k[i]
        if perm and key == prev:
            ws[-1] += int(weights[i])
        else:
            perm.append(int(i))
            ws.append(int(weights[i]))
            prev = key
    keep = [j for j, w in enumerate(ws) if w != 0]
    return (np.asarray([perm[j] for j in keep], dtype=np.int64),
            np.asarray([ws[j] for j in keep], dtype=np.int64))


def merge_consolidate(runs: Sequence[tuple]):
    """k-way merge of consolidated runs ``(kcodes, vcodes_or_None, weights)``.

    Returns ``(gidx, w)`` where ``gidx`` indexes the virtual concatenation of the runs (run 0's rows
    first): the output row ``i`` is the input row ``gidx[i]`` (the first run holding it) with the
    summed weight ``w[i]``; zero sums are dropped. The output is consolidated.
    """
    if not runs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    k = concat([r[0] for r in runs])
    v = concat([r[1] for r in runs]) if runs[0][1] is not None else None
    w = np.concatenate([np.asarray(r[2], dtype=np.int64) for r in runs])
    return sort_consolidate(k, v, w)


def merge_indexed(runs: Sequence[tuple]):
    """The sum of consolidated indexed batches with u64 codes, regrouped by key.

    ``runs``: ``(kcodes, offsets, vcodes, weights)`` per batch. Returns ``(gidx, w, vcodes,
    kcodes, offsets, ksrc)``: the rows of :func:`merge_consolidate` over the batches' flat
    ``(key, value)`` rows (``gidx`` global value rows, ``w`` weights, ``vcodes`` their value
    codes), then their distinct keys (``kcodes``), where each key's rows start (``offsets``) and
    the global key row of the concatenated inputs each key was taken from (``ksrc``).
    """
    kflat = [np.repeat(np.asarray(kc, np.uint64), np.diff(off)) for kc, off, _, _ in runs]
    gidx, w = merge_consolidate([(kf, r[2], r[3]) for kf, r in zip(kflat, runs)])
    allk = np.concatenate(kflat) if kflat else np.zeros(0, np.uint64)
    allv = np.concatenate([np.asarray(r[2], np.uint64) for r in runs]) if runs else allk
    kbase = np.cumsum([0] + [len(r[0]) for r in runs])
    row_key = np.concatenate([np.repeat(np.arange(len(r[0]), dtype=np.int64) + kbase[i],
                                        np.diff(r[1])) for i, r in enumerate(runs)]) \
        if runs else np.zeros(0, np.int64)
    ks = allk[gidx]
    bounds = group_bounds(ks)
    first = bounds[:-1]
    return gidx, w, allv[gidx], ks[first], bounds, row_key[gidx[first]]


def merge_indexed_cols(runs: Sequence[tuple]):
    """:func:`merge_indexed` over ``(kcodes, offsets, vcodes, weights, cols)`` runs that returns
    the output's value columns instead of ``gidx``: ``cols`` holds 1-d numpy arrays of fixed-width
    values, one per value row, and output column j is the concatenation of the runs' column j
    taken at ``gidx``. Returns ``(cols, w, vcodes, kcodes, offsets, ksrc)``."""
    runs = list(runs)
    gidx, w, vc, kc, off, ksrc = merge_indexed([r[:4] for r in runs])
    ncols = len(runs[0][4]) if runs else 0
    cols = [np.concatenate([np.asarray(r[4][j]) for r in runs])[gidx] for j in range(ncols)]
    return cols, w, vc, kc, off, ksrc


def merge_indexed_batches(runs: Sequence[tuple], key_schema: pa.Schema, val_schema: pa.Schema,
                          views: Optional[list] = None):
    """:func:`merge_indexed` over ``(kcodes, offsets, vcodes, weights, keys, vals)`` runs
    (``keys`` / ``vals`` record batches of ``key_schema`` / ``val_schema``, or their
    :func:`export_batch`) that builds the merged batch's parts: ``(keys, kcodes, offsets, vals,
    vcodes, weights)``, the keys taken at ``ksrc`` and the values at ``gidx`` of the
    concatenated inputs. None when a key or value column is not fixed-width without nulls (or
    there is no key or no value column, or the codes are var codes). ``views``: see
    :func:`kept`."""
    runs = list(runs)
    if not key_schema.types or not val_schema.types \
            or not all(_fixed_width(t) for t in key_schema.types) \
            or not all(_fixed_width(t) for t in val_schema.types):
        return None
    for r in runs:
        if len(r) != 6:
            raise ValueError("a run is (kcodes, offsets, vcodes, weights, keys, vals)")
        if not (Codes.is_u64(r[0]) and Codes.is_u64(r[2])):
            return None
    live = [r for r in runs if len(r[2])]
    if any(c.null_count for r in live for c in list(r[4].columns) + list(r[5].columns)):
        return None
    gidx, w, vc, kc, off, ksrc = merge_indexed([r[:4] for r in runs])
    keys = pa.Table.from_batches([r[4] for r in runs], schema=key_schema).combine_chunks()
    vals = pa.Table.from_batches([r[5] for r in runs], schema=val_schema).combine_chunks()
    kb = keys.take(pa.array(ksrc, pa.int64())).to_batches()
    vb = vals.take(pa.array(gidx, pa.int64())).to_batches()
    kb = kb[0] if kb else pa.RecordBatch.from_pylist([], schema=key_schema)
    vb = vb[0] if vb else pa.RecordBatch.from_pylist([], schema=val_schema)
    kb = kept(kb, views)
    return kb, kc, off, kept(vb, views), vc, w


def kept(batch: pa.RecordBatch, views: Optional[list]) -> pa.RecordBatch:
    """``batch``, its :func:`export_batch` appended to ``views`` when that is a list: a kernel
    that builds record batches (``merge_indexed_batches``, ``index_rows``, ``group_rows``,
    ``pick_batch``) hands out, with ``views=[]``, the exports of what it built, made natively for
    free (``dbsp._native.arrow_c.import_kept``)."""
    if views is not None:
        views.append(export_batch(batch))
    return batch


def group_bounds(kcodes: CodeArray) -> np.ndarray:
    """Offsets (int64, g+1) of the runs of equal codes in a sorted code array."""
    k = _keys(kcodes)
    out = [0]
    for i in range(1, len(k)):
        if k[i] != k[i - 1]:
            out.append(i)
    if k:
        out.append(len(k))
    return np.asarray(out, dtype=np.int64)


def lower_bound(sorted_codes: CodeArray, probes: CodeArray) -> np.ndarray:
    """For each probe, the first position in ``sorted_codes`` whose code is ``>=`` the probe."""
    import bisect
    k = _keys(sorted_codes)
    return np.asarray([bisect.bisect_left(k, p) for p in _keys(probes)], dtype=np.int64)


def range_lower_bound(sorted_codes: CodeArray, lo: np.ndarray, hi: np.ndarray,
                      probes: CodeArray) -> np.ndarray:
    """For each ``i``: the first position in ``[lo[i], hi[i])`` of ``sorted_codes`` whose code
    is ``>=`` probe ``i`` (``hi[i]`` if none); each range sorted."""
    import bisect
    k = _keys(sorted_codes)
    return np.asarray([bisect.bisect_left(k, p, int(a), int(b))
                       for a, b, p in zip(lo, hi, _keys(probes))], dtype=np.int64)


def upper_bound(sorted_codes: CodeArray, probes: CodeArray) -> np.ndarray:
    """For each probe, the first position in ``sorted_codes`` whose code is ``>`` the probe."""
    import bisect
    k = _keys(sorted_codes)
    return np.asarray([bisect.bisect_right(k, p) for p in _keys(probes)], dtype=np.int64)


#: a code sample keeps every this many codes (see :func:`code_sample`)
SAMPLE_STRIDE = 16


def code_sample(codes: CodeArray):
    """Every ``SAMPLE_STRIDE``-th code of a sorted u64 code array, or None for var codes (an
    index :func:`intersect` may search first)."""
    if not isinstance(codes, np.ndarray):
        return None
    return np.ascontiguousarray(codes[::SAMPLE_STRIDE])


def code_runs(codes: CodeArray, max_runs: int = -1):
    """Positions where the runs of consecutive codes of a sorted distinct u64 code array start,
    then its length (int64), or None for var codes, no codes or more than ``max_runs`` runs
    (when not negative): an index :func:`intersect` may map codes to positions with."""
    if not isinstance(codes, np.ndarray) or len(codes) == 0:
        return None
    c = np.asarray(codes, dtype=np.uint64)
    brk = np.flatnonzero(c[1:] != c[:-1] + np.uint64(1)) + 1
    if 0 <= max_runs < len(brk) + 1:
        return None
    return np.concatenate([[0], brk, [len(c)]]).astype(np.int64)


def code_rank(codes: CodeArray, max_spread: int = 8):
    """The rank directory of sorted distinct u64 ``codes`` (see ``dbsp._native.search.code_rank``):
    uint64 ``[lo, nw, bitmap words, counts of codes below each word]``, or None for var codes,
    no codes, a code range at least ``max_spread`` times the number of codes, or every code of
    the range."""
    if not isinstance(codes, np.ndarray) or len(codes) == 0:
        return None
    c = np.asarray(codes, dtype=np.uint64)
    lo, span = int(c[0]), int(c[-1]) - int(c[0])
    if span // max(max_spread, 1) >= len(c) or span == len(c) - 1:
        return None
    nw = (span >> 6) + 1
    bits = [0] * nw
    for x in c.tolist():
        d = x - lo
        bits[d >> 6] |= 1 << (d & 63)
    counts = np.concatenate([[0], np.cumsum([bin(w).count("1") for w in bits])[:-1]])
    return np.array([lo, nw] + bits + [int(x) for x in counts], dtype=np.uint64)


def intersect(a: CodeArray, b: CodeArray, b_sample=None, b_runs=None, b_rank=None):
    """Positions of equal codes in two sorted arrays of *distinct* codes: ``(ai, bi)``, ascending.
    ``b_sample``: None or ``code_sample(b)``; ``b_runs``: None or ``code_runs(b)``; ``b_rank``:
    None or ``code_rank(b)`` (all checked here; they change no answer)."""
    if b_rank is not None:
        want = code_rank(b, 1 << 62)
        if want is None or not np.array_equal(np.asarray(b_rank), want):  # (a dense b: None)
            raise ValueError("intersect: b_rank is not the rank directory of b")
    if b_runs is not None:
        want = code_runs(b)
        if want is None or not np.array_equal(np.asarray(b_runs), want):
            raise ValueError("intersect: b_runs are not the runs of b")
    if b_sample is not None:
        if not isinstance(b, np.ndarray):
            raise TypeError("intersect: a code sample needs u64 codes")
        if not np.array_equal(np.asarray(b_sample), np.asarray(b)[::SAMPLE_STRIDE]):
            raise ValueError("intersect: b_sample is not every 16th code of b")
    ka, kb = _keys(a), _keys(b)
    pos = {c: j for j, c in enumerate(kb)}
    ai = [i for i, c in enumerate(ka) if c in pos]
    return np.asarray(ai, dtype=np.int64), np.asarray([pos[ka[i]] for i in ai], dtype=np.int64)


def intersect_batches(a: CodeArray, parts) -> list:
    """:func:`intersect` of ``a`` with each ``(b, b_sample, b_runs, b_rank)`` of ``parts``: the
    list of ``(part number, ai, bi)`` of the parts with matches, in order."""
    out = []
    for k, (b, b_sample, b_runs, b_rank) in enumerate(parts):
        ai, bi = intersect(a, b, b_sample, b_runs, b_rank)
        if len(ai):
            out.append((k, ai, bi))
    return out


def expand_pairs(a_offsets: np.ndarray, ai: np.ndarray, b_offsets: np.ndarray, bi: np.ndarray):
    """Cross product of the value ranges of matched keys.

    For each match ``m`` (key ``ai[m]`` of A with key ``bi[m]`` of B), emit every pair of value rows
    ``(x, y)`` with ``x`` in ``a_offsets[ai[m]]..a_offsets[ai[m]+1]`` and ``y`` likewise in B,
    ``x``-major. Returns ``(xs, ys)``.
    """
    xs: list[int] = []
    ys: list[int] = []
    for i, j in zip(ai.tolist(), bi.tolist()):
        for x in range(int(a_offsets[i]), int(a_offsets[i + 1])):
            for y in range(int(b_offsets[j]), int(b_offsets[j + 1])):
                xs.append(x)
                ys.append(y)
    return np.asarray(xs, dtype=np.int64), np.asarray(ys, dtype=np.int64)


_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    x = (x ^ (x >> 30)) * _M1 & _MASK
    x = (x ^ (x >> 27)) * _M2 & _MASK
    return x ^ (x >> 31)


def hash64(codes: CodeArray, seed: int = 0) -> np.ndarray:
    """64-bit hash of each code; equal codes hash equally in every process (the exchange uses it).

    u64 codes: ``splitmix64(code ^ seed)``. Var codes: FNV-1a-64 over the bytes starting from
    ``seed ^ 0xcbf29ce484222325`` then ``splitmix64`` of that.
    """
    out = np.empty(len(codes), dtype=np.uint64)
    if Codes.is_u64(codes):
        for i, c in enumerate(codes.tolist()):
            out[i] = _mix((c ^ seed) & _MASK)
        return out
    for i, row in enumerate(codes.to_list()):
        h = (0xCBF29CE484222325 ^ seed) & _MASK
        for byte in row:
            h = ((h ^ byte) * 0x100000001B3) & _MASK
        out[i] = _mix(h)
    return out


def shard(codes: CodeArray, nshards: int, seed: int = 0) -> np.ndarray:
    """Shard of each code in ``0..nshards-1`` (int64): ``hash64(codes, seed) % nshards``."""
    return (hash64(codes, seed) % np.uint64(nshards)).astype(np.int64)


def owner_rows(codes: CodeArray, owners: np.ndarray, bits: int,
               workers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)`` (int64): ``order[bounds[w]:bounds[w + 1]]`` are the rows (ascending)
    whose code belongs to worker ``w`` of the shard map ``owners`` (``2 ** bits`` entries):
    ``owners[hash64(code) >> (64 - bits)]`` (``owners[0]`` when ``bits`` is 0). An owner
    outside ``0..workers-1`` is refused whether or not a row maps to it."""
    owners = np.asarray(owners, np.int64)
    if not 0 <= bits <= 63 or len(owners) != 1 << bits:
        raise ValueError(f"owner_rows: {len(owners)} owners for {bits} bits")
    if workers < 1:
        raise ValueError("owner_rows: workers must be >= 1")
    bad = np.flatnonzero((owners < 0) | (owners >= workers))
    if len(bad):
        raise ValueError(f"owner_rows: owner {owners[bad[0]]} of shard {bad[0]} is not a "
                         f"worker in 0..{workers - 1}")
    h = hash64(codes)
    shard = [int(x) >> (64 - bits) if bits else 0 for x in h.tolist()]
    dest = np.array([int(owners[s]) for s in shard], np.int64)
    order = np.argsort(dest, kind="stable").astype(np.int64)
    bounds = np.zeros(workers + 1, np.int64)
    np.cumsum(np.bincount(dest, minlength=workers), out=bounds[1:])
    return order, bounds


def owner_key_rows(kcodes: CodeArray, offsets: np.ndarray, owners: np.ndarray, bits: int,
                   workers: int, vcodes: CodeArray, weights: np.ndarray) -> tuple:
    """:func:`owner_rows` of an indexed batch's keys with their value rows: ``(korder,
    kbounds, rorder, rbounds, offs, vout, wout)``; worker ``w``'s keys ``korder[kbounds[w]:
    kbounds[w + 1]]``, their rows (key ``g``'s: ``offsets[g]:offsets[g + 1]``, key after key)
    ``rorder[rbounds[w]:rbounds[w + 1]]``, their offsets in those rows ``offs[kbounds[w] +
    w:kbounds[w + 1] + w + 1]`` (from 0); ``vout`` / ``wout``: ``vcodes`` (u64 only) and
    ``weights`` at ``rorder`` (``vout`` None when ``vcodes`` are not u64)."""
    korder, kbounds = owner_rows(kcodes, owners, bits, workers)
    offsets = np.asarray(offsets, np.int64)
    if offsets.shape != (len(korder) + 1,):
        raise ValueError(f"owner_key_rows: {len(offsets)} offsets for {len(korder)} keys")
    if len(offsets) and (offsets[0] != 0 or (np.diff(offsets) < 0).any()):
        raise ValueError("owner_key_rows: offsets not from 0 and non-decreasing")
    n = int(offsets[-1])
    u64 = type(vcodes) is np.ndarray and vcodes.dtype == np.uint64 and vcodes.ndim == 1
    if u64 and len(vcodes) != n:
        raise ValueError(f"owner_key_rows: {len(vcodes)} value codes for {n} rows")
    if np.shape(weights) != (n,):
        raise ValueError(f"owner_key_rows: {np.size(weights)} weights for {n} rows")
    rows: list = []
    rbounds, offs = [0], []
    for w in range(workers):
        own = [0]
        for g in korder[kbounds[w]:kbounds[w + 1]].tolist():
            rows.extend(range(int(offsets[g]), int(offsets[g + 1])))
            own.append(own[-1] + int(offsets[g + 1] - offsets[g]))
        offs.extend(own)
        rbounds.append(len(rows))
    rorder = np.array(rows, np.int64)
    return (korder, kbounds, rorder, np.array(rbounds, np.int64), np.array(offs, np.int64),
            vcodes[rorder] if u64 else None,
            np.asarray(weights, np.int64)[rorder])


def _dealt_type(t: pa.DataType) -> bool:
    """Whether :func:`deal_batch` copies a column of type ``t`` (fixed-width numbers, dates,
    times, timestamps and durations; not bool, decimal or a dictionary)."""
    T = pa.types
    return (T.is_integer(t) or T.is_floating(t) or T.is_date(t) or T.is_time(t)
            or T.is_timestamp(t) or T.is_duration(t))


def deal_batch(batch: pa.RecordBatch, codes: Optional[CodeArray], weights: np.ndarray,
               owners: np.ndarray, bits: int, workers: int, key_cols: Optional[list] = None,
               plan: Optional[list] = None) -> Optional[list]:
    """The rows of ``batch`` and their ``weights`` dealt as :func:`owner_rows` deals ``codes``:
    per worker ``(record batch, weights)`` of its rows in their order in ``batch``, or None for
    a worker without rows; None when a column is not fixed-width without nulls (see
    :func:`_dealt_type`). ``codes`` None: the u64 codes of the columns ``key_cols`` by ``plan``
    (as ``KeyCodec._native_plan``; False when the columns could be copied but a key column is
    off its plan: the caller asks again with the codes)."""
    if codes is None:
        if key_cols is None or plan is None or not 0 < len(plan) == len(key_cols) <= 8:
            raise ValueError("deal_batch: no codes, and no key columns and plan to make them")
        if any(not 0 <= i < batch.num_columns for i in key_cols):
            raise ValueError(f"deal_batch: no key column among {key_cols}")
        if not batch.num_columns or not all(_dealt_type(f.type) and not c.null_count
                                            for f, c in zip(batch.schema, batch.columns)):
            owner_rows(np.zeros(0, np.uint64), owners, bits, workers)  # (the map's checks)
            return None
        codes = _plan_codes([batch.column(i) for i in key_cols], plan)
        if codes is None:
            owner_rows(np.zeros(0, np.uint64), owners, bits, workers)  # (the map's checks)
            return False
    weights = np.asarray(weights, np.int64)
    if batch.num_rows != len(codes) or weights.shape != (len(codes),):
        raise ValueError(f"deal_batch: {batch.num_rows} rows, {len(codes)} codes, "
                         f"{len(weights)} weights")
    order, bounds = owner_rows(codes, owners, bits, workers)
    if not batch.num_columns or not all(_dealt_type(f.type) and not c.null_count
                                        for f, c in zip(batch.schema, batch.columns)):
        return None
    out: list = []
    for w in range(workers):
        idx = order[bounds[w]:bounds[w + 1]]
        out.append((batch.take(pa.array(idx, pa.int64())), weights[idx]) if len(idx) else None)
    return out


def deal_sorted(batch: pa.RecordBatch, weights: np.ndarray, key_cols: list, key_plan: list,
                val_cols: list, val_plan: list, owners: np.ndarray, bits: int, workers: int,
                sort: Any, key_schema: pa.Schema) -> Optional[list]:
    """The rows of ``batch`` sorted and consolidated by the u64 codes of the columns
    ``key_cols`` / ``val_cols`` (by their plans, as ``KeyCodec._native_plan``), then dealt as
    :func:`owner_rows` deals their key codes: per worker ``(record batch, weights, key codes,
    value codes, key batch, distinct key codes, offsets)`` of its rows in that order (the last
    three: their key layer, each key's columns at its first row as a batch of ``key_schema``),
    or None for a worker without rows; None when a column is not fixed-width without nulls
    (see :func:`_dealt_type`) or off its plan. (``sort``: ignored, :func:`sort_consolidate`
    is used.)"""
    weights = np.asarray(weights, np.int64)
    n = batch.num_rows
    if weights.shape != (n,):
        raise ValueError(f"deal_sorted: {n} rows, {len(weights)} weights")
    for cols, plan in ((key_cols, key_plan), (val_cols, val_plan)):
        if not 0 < len(cols) == len(plan) <= 8:
            raise ValueError(f"deal_sorted: {len(cols)} columns for a plan of {len(plan)}")
        if any(not 0 <= i < batch.num_columns for i in cols):
            raise ValueError(f"deal_sorted: no column among {cols}")
    if not n or not all(_dealt_type(f.type) and not c.null_count
                        for f, c in zip(batch.schema, batch.columns)):
        return None
    kcodes = _plan_codes([batch.column(i) for i in key_cols], key_plan)
    vcodes = _plan_codes([batch.column(i) for i in val_cols], val_plan)
    if kcodes is None or vcodes is None:
        return None
    perm, w = sort_consolidate(kcodes, vcodes, weights)
    ks = np.asarray(kcodes, np.uint64)[perm]
    vs = np.asarray(vcodes, np.uint64)[perm]
    order, bounds = owner_rows(ks, owners, bits, workers)
    out: list = []
    for i in range(workers):
        idx = order[bounds[i]:bounds[i + 1]]
        if not len(idx):
            out.append(None)
            continue
        rows, kd = batch.take(pa.array(perm[idx], pa.int64())), ks[idx]
        offsets = group_bounds(kd)
        first = pa.array(offsets[:-1], pa.int64())
        keys = pa.RecordBatch.from_arrays([rows.column(c).take(first) for c in key_cols],
                                          schema=key_schema)
        out.append((rows, w[idx], kd, vs[idx], keys, kd[offsets[:-1]], offsets))
    return out


def merge_disjoint_runs(kruns: Sequence[np.ndarray]) -> Optional[np.ndarray]:
    """The order that merges W runs of u64 key codes, each non-decreasing (a key's rows
    together), whose keys are disjoint: positions (int64) into the concatenation of the runs,
    ascending by code and, within a key, in run order; None when some key is in two runs (the
    parts then share keys and must be summed)."""
    runs = [np.asarray(r, np.uint64) for r in kruns]
    for r in runs:
        if len(r) > 1 and (r[1:] < r[:-1]).any():
            raise ValueError("merge_disjoint_runs: a key run is not ascending")
    owner: dict = {}
    for w, r in enumerate(runs):
        for k in set(r.tolist()):
            if owner.setdefault(k, w) != w:
                return None
    flat = np.concatenate(runs) if runs else np.zeros(0, np.uint64)
    return np.argsort(flat, kind="stable").astype(np.int64)


def gather_disjoint(batches: Sequence[pa.RecordBatch], weights: Sequence[np.ndarray],
                    schema: pa.Schema, plan: list) -> Optional[tuple]:
    """W record batches (each with ``schema``'s column types) and their ``weights`` merged into
    one ``(record batch of schema, weights)`` in the order of :func:`merge_disjoint_runs` of
    the u64 key codes of their first ``len(plan)`` columns (``plan``: as
    ``KeyCodec._native_plan``); None when a key is in two batches, or a column is not
    fixed-width without nulls (see :func:`_dealt_type`), or a key column is off its plan."""
    if len(batches) != len(weights):
        raise ValueError(f"gather_disjoint: {len(batches)} batches, {len(weights)} weights")
    for b, w in zip(batches, weights):
        if len(w) != b.num_rows:
            raise ValueError(f"gather_disjoint: a batch has {b.num_rows} rows, {len(w)} "
                             f"weights")
    if not batches or not plan or not len(schema) or len(plan) > len(schema) or \
            not all(_dealt_type(f.type) for f in schema) or \
            any(c.null_count for b in batches for c in b.columns):
        return None
    kruns = [_plan_codes([b.column(i) for i in range(len(plan))], plan) for b in batches]
    if any(k is None for k in kruns):
        return None
    order = merge_disjoint_runs(kruns)
    if order is None:
        return None
    cols = [pa.concat_arrays([b.column(i) for b in batches]).take(pa.array(order, pa.int64()))
            for i in range(len(schema))]
    w = np.concatenate([np.asarray(x, np.int64) for x in weights])[order]
    return pa.RecordBatch.from_arrays(cols, schema=schema), w


def merge_sum_runs(kruns: Sequence[np.ndarray], cols: Sequence[Sequence[np.ndarray]],
                   is_int: Sequence[bool]) -> tuple:
    """The parts an exchange's combiner receives, summed per key: ``kruns`` are W runs of u64
    codes, each ascending and distinct; ``cols[c][w]`` is partial column ``c`` of run ``w``
    (int64 where ``is_int[c]``, else float64), aligned with ``kruns[w]``. Returns ``(keys,
    first, sums, over)``: the distinct codes ascending, the position of each one's first row in
    the concatenation of the runs, each column summed per key (int64 sums wrapped), and a bool
    mask of the keys some int64 sum of which is out of int64 (None when there is none)."""
    flat = [int(x) for r in kruns for x in np.asarray(r, np.uint64).tolist()]
    order = sorted(range(len(flat)), key=lambda i: (flat[i], i))
    keys, first, groups = [], [], []
    for i in order:
        if not keys or keys[-1] != flat[i]:
            keys.append(flat[i])
            first.append(i)
            groups.append([])
        groups[-1].append(i)
    sums, over = [], [False] * len(keys)
    for c, runs in enumerate(cols):
        vals = [v for r in runs for v in np.asarray(r).tolist()]
        if is_int[c]:
            out = []
            for g, rows in enumerate(groups):
                t = sum(int(vals[i]) for i in rows)
                if not -2 ** 63 <= t < 2 ** 63:
                    over[g] = True
                out.append((t + 2 ** 63) % 2 ** 64 - 2 ** 63)
            sums.append(np.array(out, np.int64))
        else:
            out = []
            for rows in groups:  # in run order, from the first value (as np.add.reduceat)
                t = float(vals[rows[0]])
                for i in rows[1:]:
                    t += float(vals[i])
                out.append(t)
            sums.append(np.array(out, np.float64))
    return (np.array(keys, np.uint64), np.array(first, np.int64), sums,
            np.array(over, bool) if any(over) else None)


def is_identity(idx: np.ndarray) -> bool:
    """Whether the integer array ``idx`` is ``0, 1, ..., len(idx) - 1``."""
    idx = np.asarray(idx)
    return bool(np.array_equal(idx, np.arange(len(idx))))


def mul_checked(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """``(a * b wrapped, None when no product leaves int64 else the bool mask of those that
    do)`` for int64 arrays of one length."""
    return mul_overflows(np.asarray(a, np.int64), np.asarray(b, np.int64))


def live_versions(kcodes: list, offsets: list, vcodes: list, weights: list, probes: np.ndarray):
    """The live version of each sorted distinct u64 probe code in batches of *versioned rows*
    (at most one live row per key; replacing a row adds ``(old, v, -1)``, ``(new, v', +1)`` with
    ``v' > v``, so a key's weights sum to 1 exactly when it has a live row, and that row is its
    largest version of positive weight).

    ``kcodes[b]`` (sorted distinct keys), ``offsets[b]``, ``vcodes[b]`` (versions) and
    ``weights[b]`` describe batch ``b``. ``None`` when some weight is not ±1, some key's weights
    do not sum to 0 or 1, or a live key has a retraction of a version at least as large as its
    largest added one (a rolled-back put re-inserts an older version after a newer one: the
    largest version of positive weight is then not known to be the live one; the caller
    consolidates); else ``(pos, version, batch, row, hits)``: per probe with a live row
    (ascending ``pos``) its version and the batch and value row holding it, and per batch the
    number of probes it matched.
    """
    q = [int(x) for x in np.asarray(probes, dtype=np.uint64)]
    best: dict = {}
    neg: dict = {}  # probe -> its largest retracted version
    tot = [0] * len(q)
    hits = np.zeros(len(kcodes), dtype=np.int64)
    for b, (k, off, v, w) in enumerate(zip(kcodes, offsets, vcodes, weights)):
        at = {int(c): j for j, c in enumerate(np.asarray(k, dtype=np.uint64))}
        for i, c in enumerate(q):
            j = at.get(c)
            if j is None:
                continue
            hits[b] += 1
            for r in range(int(off[j]), int(off[j + 1])):
                wr, vr = int(w[r]), int(v[r])
                if wr not in (1, -1):
                    return None
                tot[i] += wr
                if wr == 1 and (i not in best or vr > best[i][0]):
                    best[i] = (vr, b, r)
                if wr == -1:
                    neg[i] = max(neg.get(i, vr), vr)
    if any(t not in (0, 1) for t in tot):
        return None
    if any(tot[i] == 1 and i in best and i in neg and neg[i] >= best[i][0]
           for i in range(len(q))):
        return None
    pos = [i for i in range(len(q)) if tot[i] == 1 and i in best]
    return (np.asarray(pos, dtype=np.int64),
            np.asarray([best[i][0] for i in pos], dtype=np.uint64),
            np.asarray([best[i][1] for i in pos], dtype=np.int64),
            np.asarray([best[i][2] for i in pos], dtype=np.int64), hits)


def combine_partials(old: list, delta: list, has_old: np.ndarray, is_int: list,
                     positive: bool = False):
    """A linear aggregate's step on the touched keys' partial columns (column 0: the row
    count; int64 where ``is_int``, else float64): ``(new, changed, keep, emit_old, emit_new)``
    with ``new = old + delta``, ``changed`` = no old row or some column differs, ``keep`` = some
    new column non-zero, ``emit_old`` = keys (ascending) changed that had an old row of non-zero
    row count, ``emit_new`` = keys changed whose new row count is non-zero. None when an int64
    sum leaves int64 or, with ``positive``, a new row count is negative."""
    has_old = np.asarray(has_old, dtype=bool)
    new, changed, keep = [], ~has_old, np.zeros(len(has_old), dtype=bool)
    for o, d, i in zip(old, delta, is_int):
        if i:
            exact = [int(a) + int(b) for a, b in zip(np.asarray(o).tolist(), np.asarray(d).tolist())]
            if any(not -2 ** 63 <= x < 2 ** 63 for x in exact):
                return None
            n = np.asarray(exact, dtype=np.int64).reshape(-1)
        else:
            n = np.asarray(o, np.float64) + np.asarray(d, np.float64)
        changed = changed | ~(n == o)
        keep = keep | (n != 0)
        new.append(n)
    if positive and (new[0] < 0).any():
        return None
    o0 = np.asarray(old[0], np.int64)
    emit_old = np.flatnonzero(changed & has_old & (o0 != 0)).astype(np.int64)
    emit_new = np.flatnonzero(changed & (new[0] != 0)).astype(np.int64)
    return new, changed, keep, emit_old, emit_new


def _code_order(x) -> tuple:
    """A sort key of one finished output value in key-code order: null first, ``-0.0`` as
    ``0.0``, every NaN equal and after every number."""
    if x is None:
        return (0,)
    if isinstance(x, float) and x != x:
        return (2,)
    return (1, x + 0.0 if isinstance(x, float) else x)


def decode_u64(codes: np.ndarray, plan: Sequence) -> list:
    """The key columns of u64 key codes (the inverse of ``KeyCodec._encode_u64``): ``plan`` per
    column ``(byte width, signed, nullable)`` as ``KeyCodec._native_plan``, the columns packed
    most significant first, a nullable column's validity byte before its value, a signed
    value's sign bit flipped. Per column ``(values, null mask or None)``: values as the signed
    (else unsigned) integers of that width, 0 where null; the mask only for a nullable column
    with a null. Raises ValueError when the plan takes more than 64 bits."""
    bits = sum(8 * w + (8 if nullable else 0) for w, _, nullable in plan)
    if bits > 64 or any(w not in (1, 2, 4, 8) for w, _, _ in plan):
        raise ValueError(f"decode_u64: plan {list(plan)} is not a u64 code")
    out = []
    rest = [int(x) for x in np.asarray(codes, np.uint64).tolist()]
    for w, signed, nullable in reversed(list(plan)):
        vals, valid = [], []
        for i, c in enumerate(rest):
            v = c & ((1 << (8 * w)) - 1)
            c >>= 8 * w
            ok = True
            if nullable:
                ok = (c & 0xFF) != 0
                c >>= 8
            rest[i] = c
            if signed:
                v ^= 1 << (8 * w - 1)
                v = v - (1 << (8 * w)) if v >= 1 << (8 * w - 1) else v
            vals.append(v if ok else 0)
            valid.append(ok)
        dt = np.dtype(f"{'i' if signed else 'u'}{w}")
        mask = None if all(valid) else ~np.array(valid, dtype=bool)
        out.append((np.array(vals, dtype=dt), mask))
    return out[::-1]


def merge_sum_packed(parts: Sequence[np.ndarray], is_int: Sequence[bool]) -> tuple:
    """A combiner's packed parts merged and summed per key (see
    ``dbsp._native.linear.merge_sum_packed``): ``parts`` are 2-d ``uint64`` arrays of
    ``1 + C`` rows (key codes, then the bits of each partial column, int64 where ``is_int[c]``,
    else float64). ``(out, over)``: :func:`merge_sum_runs` of the rows, packed alike."""
    C = len(is_int)
    for w, p in enumerate(parts):
        if not isinstance(p, np.ndarray) or p.ndim != 2 or p.shape[0] != 1 + C \
                or p.dtype != np.uint64:
            raise ValueError(f"merge_sum_packed: part {w} is not a uint64 array of {1 + C} rows")
    if not parts:
        raise ValueError("merge_sum_packed: 0 parts (1 to 64), 0 columns (at most 64)")
    for p in parts:
        k = [int(x) for x in p[0].tolist()]
        if any(b <= a for a, b in zip(k, k[1:])):
            raise ValueError("merge_sum_packed: a key run is not ascending and distinct")
    kc, _, sums, over = merge_sum_runs(
        [p[0] for p in parts],
        [[p[1 + c].view(np.int64 if i else np.float64) for p in parts]
         for c, i in enumerate(is_int)], is_int)
    out = np.empty((1 + C, len(kc)), np.uint64)
    out[0] = kc
    for c, s in enumerate(sums):
        out[1 + c] = s.view(np.uint64)
    return out, over



def pack_parts(kcodes: np.ndarray, cols: Sequence[np.ndarray], order: np.ndarray,
               bounds: Sequence[int]) -> list:
    """A combiner's partials packed for each worker (see ``dbsp._native.linear.pack_parts``):
    per worker ``w`` None when ``bounds[w] == bounds[w + 1]``, else the 2-d ``uint64`` array
    of the codes ``kcodes[order[bounds[w]:bounds[w + 1]]]`` and the bits of each column at
    those rows."""
    kcodes = np.asarray(kcodes, np.uint64)
    order = np.asarray(order, np.int64)
    b = [int(x) for x in bounds]
    if len(b) < 2:
        raise ValueError("pack_parts: bounds need at least two entries")
    if b[0] != 0 or b[-1] != len(order) or any(y < x for x, y in zip(b, b[1:])):
        raise ValueError("pack_parts: bounds must run from 0 to the length of order")
    cols = [np.asarray(c) for c in cols]
    if any(c.ndim != 1 or len(c) != len(kcodes) or c.itemsize != 8 for c in cols):
        raise ValueError("pack_parts: a column is not one 8-byte item a code")
    if len(order) and (order.min() < 0 or order.max() >= len(kcodes)):
        raise IndexError("pack_parts: a row of order is out of range")
    out: list = []
    for w in range(len(b) - 1):
        rows = order[b[w]:b[w + 1]]
        if not len(rows):
            out.append(None)
            continue
        m = np.empty((1 + len(cols), len(rows)), np.uint64)
        m[0] = kcodes[rows]
        for c, x in enumerate(cols):
            m[1 + c] = x.view(np.uint64)[rows]
        out.append(m)
    return out


def sum_unpack(parts: Sequence[np.ndarray], is_int: Sequence[bool], plan: Sequence):
    """A combiner's packed parts summed per key and taken apart (see
    ``dbsp._native.linear.sum_unpack``): ``(codes, partial columns, key columns)``, or None
    when an int64 sum leaves int64."""
    if len(parts) == 1:
        m = np.ascontiguousarray(parts[0])
        if m.ndim != 2 or m.shape[0] != 1 + len(is_int) or m.dtype != np.uint64:
            raise ValueError("sum_unpack: the part is not a uint64 array of its columns")
    else:
        m, over = merge_sum_packed(parts, is_int)
        if over is not None:
            return None
    kc = np.ascontiguousarray(m[0])
    cols = [m[1 + c].view(np.int64 if i else np.float64) for c, i in enumerate(is_int)]
    return kc, cols, decode_u64(kc, plan)

def finish_emit(old: list, new: list, eo: np.ndarray, en: np.ndarray, plan: list,
                is_int: list):
    """A linear aggregate's output rows of a step, in row order and consolidated (see
    ``dbsp._native.linear.finish_emit``): ``(rows, weights, [(values, null mask or None)])``."""
    def row(cols, k):
        out = []
        for kind, c, s in plan:
            n = int(cols[c][k])
            if kind == 0:
                out.append(n)
            elif n == 0:
                out.append(None)
            elif kind == 1:
                out.append(int(cols[s][k]) if is_int[s] else float(cols[s][k]))
            else:
                out.append(float(cols[s][k]) / float(n))
        return out

    emitted = []  # (key, value order, weight, values)
    for k in np.asarray(eo, np.int64).tolist():
        r = row(old, k)
        emitted.append((k, [_code_order(x) for x in r], -1, r))
    for k in np.asarray(en, np.int64).tolist():
        r = row(new, k)
        emitted.append((k, [_code_order(x) for x in r], 1, r))
    emitted.sort(key=lambda e: (e[0], e[1]))
    kept = []
    for e in emitted:  # an old and a new row of one key with equal values cancel
        if kept and kept[-1][0] == e[0] and kept[-1][1] == e[1]:
            kept.pop()
        else:
            kept.append(e)
    rows = np.array([e[0] for e in kept], dtype=np.int64)
    w = np.array([e[2] for e in kept], dtype=np.int64)
    cols = []
    for j, (kind, c, s) in enumerate(plan):
        flt = kind == 2 or (kind == 1 and not is_int[s])
        vals = [e[3][j] for e in kept]
        mask = np.array([v is None for v in vals], dtype=bool)
        arr = np.array([0 if v is None else v for v in vals],
                       dtype=np.float64 if flt else np.int64)
        cols.append((arr, mask if mask.any() else None))
    return rows, w, cols


def delta_partials(bounds: np.ndarray, weights: np.ndarray, kinds: list, cols: list,
                   values: list, valids: list):
    """Partials of a delta grouped by key (see ``dbsp._native.linear.delta_partials``): per
    partial column ``j``, kind 0 ``Σ w``, 1 ``Σ w`` over valid rows of ``values[cols[j]]``, 2
    ``Σ w·x`` (int64, valid rows), 3 ``Σ w·x`` (float64, nulls as 0, summed from each group's
    first row); None when an int64 product or sum leaves int64."""
    b = np.asarray(bounds, np.int64).tolist()
    w = np.asarray(weights, np.int64).tolist()
    out = []
    for j, kind in enumerate(kinds):
        ok = None if kind == 0 or valids[cols[j]] is None else np.asarray(valids[cols[j]]).tolist()
        x = None if kind < 2 else np.asarray(values[cols[j]]).tolist()
        res = []
        for g in range(len(b) - 1):
            rows = range(b[g], b[g + 1])
            if kind == 3:
                acc = None
                for r in rows:
                    t = (x[r] if ok is None or ok[r] else 0.0) * float(w[r])
                    acc = t if acc is None else acc + t
                res.append(0.0 if acc is None else acc)
                continue
            acc = 0
            for r in rows:
                if ok is not None and not ok[r]:
                    continue
                p = x[r] * w[r] if kind == 2 else w[r]
                if not -2 ** 63 <= p < 2 ** 63:
                    return None
                acc += p
                if not -2 ** 63 <= acc < 2 ** 63:
                    return None
            res.append(acc)
        out.append(np.asarray(res, dtype=np.float64 if kind == 3 else np.int64).reshape(-1))
    return out


def join_matched_pairs(xo: np.ndarray, ai: np.ndarray, yo: np.ndarray, bi: np.ndarray,
                       xw: np.ndarray, yw: np.ndarray, x_unit: bool = False,
                       y_unit: bool = False):
    """Matched value pairs of two indexed batches: ``(kidx, xs, ys, w, over)`` (see
    :func:`expand_pairs` and :func:`mul_checked`; ``kidx``: the X key of each pair).
    ``x_unit`` / ``y_unit``: that side holds one value of weight 1 per key (checked here)."""
    for side, unit, o, w in (("X", x_unit, xo, xw), ("Y", y_unit, yo, yw)):
        if unit and not (len(o) == len(w) + 1 and np.array_equal(o, np.arange(len(o)))
                         and np.all(np.asarray(w) == 1)):
            raise ValueError(f"join_matched_pairs: side {side} does not hold one value of "
                             f"weight 1 per key")
    xs, ys = expand_pairs(xo, ai, yo, bi)
    counts = (np.asarray(xo)[ai + 1] - np.asarray(xo)[ai]) * (np.asarray(yo)[bi + 1] - np.asarray(yo)[bi])
    kidx = np.repeat(np.asarray(ai, np.int64), counts)
    w, over = mul_checked(np.asarray(xw)[xs], np.asarray(yw)[ys])
    return kidx, xs, ys, w, over


def gather_rows(pos, bno, row, sources: list, out: np.ndarray, fill=None) -> np.ndarray:
    """``out[pos[i]] = sources[bno[i]][row[i]]`` in place; a ``None`` source gives ``fill``."""
    pos, bno, row = (np.asarray(x, dtype=np.int64) for x in (pos, bno, row))
    for b, src in enumerate(sources):
        sel = np.flatnonzero(bno == b)
        if len(sel):
            out[pos[sel]] = fill if src is None else np.asarray(src)[row[sel]]
    return out


def versioned_pairs(rm, add, old_ver, next_version: int):
    """The rows of a put of versioned rows (see ``dbsp._native.state.versioned_pairs``)."""
    rm, add = np.asarray(rm, dtype=bool), np.asarray(add, dtype=bool)
    keys, off, g, old, ver, w = [], [0], [], [], [], []
    nxt = int(next_version)
    for i in range(len(rm)):
        if rm[i]:
            g.append(i), old.append(True), ver.append(int(old_ver[i])), w.append(-1)
        if add[i]:
            g.append(i), old.append(False), ver.append(nxt), w.append(1)
            nxt += 1
        if rm[i] or add[i]:
            keys.append(i)
            off.append(len(g))
    return (np.asarray(keys, dtype=np.int64), np.asarray(off, dtype=np.int64),
            np.asarray(g, dtype=np.int64), np.asarray(old, dtype=bool),
            np.asarray(ver, dtype=np.uint64), np.asarray(w, dtype=np.int64))


def pick_rows(g, is_old, old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """``old[g[r]] if is_old[r] else new[g[r]]`` per row ``r`` (``new``'s dtype)."""
    g = np.asarray(g, dtype=np.int64)
    is_old = np.asarray(is_old, dtype=bool)
    out = np.empty(len(g), dtype=new.dtype)
    out[is_old] = np.asarray(old).view(new.dtype)[g[is_old]]
    out[~is_old] = new[g[~is_old]]
    return out


class LiveTable:
    """Key code -> ``(version, one fixed-width value and one validity flag per column)``, a dict
    (see ``dbsp._native.state.LiveTable``: the same reads and writes over a flat hash table)."""

    def __init__(self, itemsizes):
        self.itemsizes = tuple(int(x) for x in itemsizes)
        for j, s in enumerate(self.itemsizes):
            if s not in (1, 2, 4, 8):
                raise ValueError(f"LiveTable: column {j} has items of {s} bytes "
                                 f"(1, 2, 4 or 8 expected)")
        self.rows: dict = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def nbytes(self) -> int:
        return len(self.rows) * (16 + sum(self.itemsizes) + len(self.itemsizes))

    def clear(self) -> None:
        self.rows.clear()

    def _check(self, cols: list, valids: list, G: int, what: str) -> None:
        if len(cols) != len(self.itemsizes) or len(valids) != len(self.itemsizes):
            raise ValueError(f"LiveTable.{what}: {len(cols)} columns and {len(valids)} "
                             f"validity arrays for a table of {len(self.itemsizes)} columns")
        for j, (c, s) in enumerate(zip(cols, self.itemsizes)):
            if c.ndim != 1 or len(c) != G or c.itemsize != s:
                raise ValueError(f"LiveTable.{what}: column {j} must be a contiguous 1-d array "
                                 f"of {G} items of {s} bytes")

    def get(self, kcodes, has: np.ndarray, ver: np.ndarray, cols: list, valids: list) -> int:
        """Fill ``has``, ``ver``, ``cols`` and ``valids`` in place for the keys with a row (a
        None validity array: not read back)."""
        self._check(cols, valids, len(kcodes), "get")
        found = 0
        for i, k in enumerate(np.asarray(kcodes, dtype=np.uint64).tolist()):
            row = self.rows.get(k)
            if row is None:
                continue
            found += 1
            has[i] = True
            ver[i] = row[0]
            for j, (x, ok) in enumerate(row[1]):
                cols[j][i:i + 1] = np.frombuffer(x, dtype=cols[j].dtype)
                if valids[j] is not None:
                    valids[j][i] = ok
        return found

    def read(self, kcodes, dtypes: list) -> tuple:
        """:meth:`get` into fresh arrays of ``dtypes``: ``(has, cols, versions)``."""
        if len(dtypes) != len(self.itemsizes):
            raise ValueError(f"LiveTable.read: {len(dtypes)} dtypes for a table of "
                             f"{len(self.itemsizes)} columns")
        G = len(kcodes)
        has, ver = np.zeros(G, bool), np.zeros(G, np.uint64)
        cols = [np.zeros(G, dt) for dt in dtypes]
        self.get(kcodes, has, ver, cols, [None] * len(cols))
        return has, cols, ver

    def put(self, kcodes, rm, add, versions, cols: list, valids: list) -> None:
        """Where ``add[i]``: key ``kcodes[i]``'s row becomes the row ``i`` of the arrays (a None
        validity array: all valid; a null value is stored as 0); else where ``rm[i]``: its row is deleted.
        ``versions`` may be an int ``v``: the added keys' versions are ``v, v + 1, ...`` in order."""
        self._check(cols, valids, len(kcodes), "put")
        if isinstance(versions, int):
            if not 0 <= versions < 1 << 64:
                raise OverflowError(f"LiveTable.put: version {versions} is not a u64")
            versions = [versions + c - 1 for c in np.cumsum(np.asarray(add, dtype=np.int64)).tolist()]
        for i, k in enumerate(np.asarray(kcodes, dtype=np.uint64).tolist()):
            if add[i]:
                row = []
                for j in range(len(cols)):
                    ok = True if valids[j] is None else bool(valids[j][i])
                    x = cols[j][i:i + 1] if ok else np.zeros(1, dtype=cols[j].dtype)
                    row.append((x.tobytes(), ok))  # a null is stored as 0
                self.rows[k] = (int(versions[i]), row)
            elif rm[i]:
                self.rows.pop(k, None)


def _fixed_width(t: pa.DataType) -> bool:
    """Whether ``take_batch`` gathers a column of type ``t`` (one values buffer of a fixed
    width)."""
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_date(t)
            or pa.types.is_time(t) or pa.types.is_timestamp(t) or pa.types.is_duration(t))


def take_batch(batch, idx: np.ndarray, extra: Optional[list] = None,
               schema: Optional[pa.Schema] = None, views: Optional[list] = None):
    """Rows ``idx`` of a record batch when every column is fixed-width (integers, floats,
    dates, times, timestamps, durations) without nulls, else None (see
    ``dbsp._native.arrow_c.take_batch``). An index outside ``0..num_rows-1`` raises
    IndexError. ``extra``: ``(numpy values, null mask or None)`` columns appended, of the
    fixed-width types that follow ``batch``'s in ``schema`` (``batch`` None: those alone).
    ``views``: see :func:`kept`."""
    if extra and schema is None:
        raise ValueError("take_batch: extra columns need the output schema")
    cols: list = []
    if batch is not None:
        if any(not _fixed_width(c.type) or c.null_count for c in batch.columns):
            return None
        if not extra and batch.num_columns == 0:
            return None
        idx = np.asarray(idx, dtype=np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= batch.num_rows):
            raise IndexError(f"take: row index out of range for {batch.num_rows} rows")
        got = batch.take(pa.array(idx, pa.int64()))
        if not extra:
            return kept(got, views)
        cols = list(got.columns)
    if extra:
        types = list(schema.types)[len(cols):]
        if len(types) != len(extra):
            raise ValueError("take_batch: the output schema does not match the columns")
        if not all(_fixed_width(t) for t in types):
            return None
        for (v, mask), t in zip(extra, types):
            v = np.asarray(v)
            if v.dtype.kind not in "iufmM":
                raise TypeError(f"take_batch: extra column holds {v.dtype}, not numbers")
            if v.dtype.itemsize * 8 != t.bit_width:
                raise ValueError("take_batch: an extra column's items differ from its type")
            storage = pa.from_numpy_dtype(np.dtype(f"i{v.dtype.itemsize}"))
            a = pa.array(v.view(storage.to_pandas_dtype()), storage,
                         mask=None if mask is None else np.asarray(mask, dtype=bool))
            cols.append(a.view(t))
    return kept(pa.RecordBatch.from_arrays(cols, schema=schema), views)


GROUP_ROWS_MAX = 1 << 16


def group_rows(batch, key_cols, plan: list, val_cols, weights, key_schema, val_schema,
               np_dtypes: Optional[list] = None, views: Optional[list] = None):
    """The rows of ``batch`` grouped by the u64 codes of its columns ``key_cols`` (see
    ``dbsp._native.arrow_c.group_rows``): ``(keys, codes, bounds, vals, weights)`` or None."""
    n = batch.num_rows
    if not key_cols or not val_cols or len(plan) != len(key_cols) or not 0 < n <= GROUP_ROWS_MAX:
        return None
    for c in list(key_cols) + list(val_cols):
        if not 0 <= c < batch.num_columns:
            raise IndexError(f"group_rows: no column {c}")
    cols = batch.columns
    if any(not _fixed_width(cols[c].type) or cols[c].null_count for c in val_cols):
        return None
    codes = _plan_codes([cols[c] for c in key_cols], plan)
    if codes is None:
        return None  # a key column off its plan, or not a u64 code
    perm = np.argsort(codes, kind="stable")
    sk = codes[perm]
    start = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]]))
    bounds = np.append(start, n).astype(np.int64)
    idx = pa.array(perm.astype(np.int64))
    keys = pa.RecordBatch.from_arrays([cols[c].take(pa.array(perm[start])) for c in key_cols],
                                      schema=key_schema)
    vals = pa.RecordBatch.from_arrays([cols[c].take(idx) for c in val_cols], schema=val_schema)
    out = kept(keys, views), sk[start], bounds, kept(vals, views), \
        np.asarray(weights, np.int64)[perm]
    if np_dtypes is None:
        return out
    nps = []
    for c, dt in zip(val_cols, np_dtypes):
        dt = np.dtype(dt)
        a = cols[c]
        if dt.itemsize * 8 != a.type.bit_width or dt.kind not in "iufmM":
            raise ValueError(f"group_rows: numpy dtype {dt} for a column of "
                             f"{a.type.bit_width // 8} bytes")
        raw = a.view(pa.from_numpy_dtype(np.dtype(f"u{dt.itemsize}"))).to_numpy()
        nps.append(np.ascontiguousarray(raw[perm]).view(dt))
    return out + (nps,)


#: most rows ``index_rows`` sorts itself (larger batches: by its ``sort``, or, without one, the
#: caller's general path)
INDEX_ROWS_MAX = 512


def _plan_codes(cols: list, plan: list) -> Optional[np.ndarray]:
    """The u64 codes of the integer / temporal columns ``cols`` per ``plan`` (``(byte width,
    signed, nullable)`` each, as ``KeyCodec._native_plan``), or None when a column has a null,
    is not of the plan's width or the codes would not fit in 64 bits."""
    if sum(w + bool(nullable) for w, _, nullable in plan) > 8:
        return None
    n = len(cols[0])
    codes = np.zeros(n, dtype=np.uint64)
    for a, (w, signed, nullable) in zip(cols, plan):
        if a.null_count or not _fixed_width(a.type) or a.type.bit_width != 8 * w:
            return None
        u = np.asarray(a.view(pa.from_numpy_dtype(np.dtype(f"u{w}"))).to_numpy(),
                       dtype=np.uint64)
        if signed:
            u = u ^ np.uint64(1 << (8 * w - 1))
        if nullable:
            codes = (codes << np.uint64(8)) | np.uint64(1)
        codes = (codes << np.uint64(8 * w)) | u if w < 8 else u
    return codes


def index_rows(batch, key_cols: list, key_plan: list, val_cols: list, val_plan: list, weights,
               key_schema, val_schema, views: Optional[list] = None, sort=None):
    """The rows of ``batch`` as a consolidated indexed Z-set ``(keys, kcodes, offsets, vals,
    vcodes, weights)`` by the u64 codes of ``key_cols`` and ``val_cols``, or None (see
    ``dbsp._native.arrow_c.index_rows``): :func:`sort_consolidate` of the codes, then the key
    columns at each key's first row and the value columns at each distinct row's first row.
    A batch of more than :data:`INDEX_ROWS_MAX` rows is indexed only when a ``sort`` is given
    (the native twin sorts it with that; the answer is the same)."""
    n = batch.num_rows
    if not key_cols or not val_cols or n == 0 or (n > INDEX_ROWS_MAX and sort is None) \
            or len(key_plan) != len(key_cols) or len(val_plan) != len(val_cols):
        return None
    for c in list(key_cols) + list(val_cols):
        if not 0 <= c < batch.num_columns:
            raise IndexError(f"index_rows: no column {c}")
    cols = batch.columns
    kc = _plan_codes([cols[c] for c in key_cols], key_plan)
    vc = _plan_codes([cols[c] for c in val_cols], val_plan)
    if kc is None or vc is None:
        return None
    w = np.asarray(weights, np.int64)
    order = np.lexsort((vc, kc))  # stable: equal rows' weights added in input order
    run = 0
    for j, i in enumerate(order):
        same = j and kc[i] == kc[order[j - 1]] and vc[i] == vc[order[j - 1]]
        run = run + int(w[i]) if same else int(w[i])
        if not -(1 << 63) <= run < (1 << 63):
            return None  # a partial weight sum leaves int64: the general path checks it
    perm, ws = sort_consolidate(kc, vc, w)
    sk = kc[perm]
    start = np.flatnonzero(np.concatenate([[True], sk[1:] != sk[:-1]])) if len(perm) else \
        np.zeros(0, np.int64)
    offsets = np.append(start, len(perm)).astype(np.int64)
    keys = pa.RecordBatch.from_arrays(
        [cols[c].take(pa.array(perm[start], pa.int64())) for c in key_cols], schema=key_schema)
    vals = pa.RecordBatch.from_arrays([cols[c].take(pa.array(perm, pa.int64()))
                                       for c in val_cols], schema=val_schema)
    return kept(keys, views), sk[start], offsets, kept(vals, views), vc[perm], ws


def pick_batch(g, is_old, olds: list, news: list, schema: pa.Schema,
               views: Optional[list] = None):
    """A record batch of ``schema``: column ``j`` row ``r`` is ``olds[j][g[r]]`` where
    ``is_old[r]``, else ``news[j][g[r]]``, the arrays' bits taken as the column's type (see
    ``dbsp._native.arrow_c.pick_batch``); None when a column is not fixed-width."""
    g = np.asarray(g, dtype=np.int64)
    is_old = np.asarray(is_old, dtype=bool)
    if len(is_old) != len(g):
        raise ValueError("pick_batch: g and is_old differ in length")
    if len(olds) != len(news) or not 0 < len(olds) <= 64:
        raise ValueError(f"pick_batch: {len(olds)} old and {len(news)} new columns")
    if len(schema) != len(olds):
        raise ValueError(f"pick_batch: the schema has {len(schema)} columns, not {len(olds)}")
    if not all(_fixed_width(t) for t in schema.types):
        return None
    cols = []
    for c, (o, n, f) in enumerate(zip(olds, news, schema)):
        o, n = np.ascontiguousarray(o), np.ascontiguousarray(n)
        w = f.type.bit_width // 8
        if o.ndim != 1 or n.ndim != 1 or o.itemsize != w or n.itemsize != w:
            raise ValueError(f"pick_batch: column {c} is {w} bytes a value, its arrays "
                             f"{o.itemsize} and {n.itemsize}")
        if len(g) and (g.min() < 0 or (g[is_old] >= len(o)).any() or
                       (g[~is_old] >= len(n)).any()):
            raise IndexError(f"pick_batch: row index out of range in column {c}")
        x = pick_rows(g, is_old, o.view(f"u{w}"), n.view(f"u{w}"))
        cols.append(pa.Array.from_buffers(f.type, len(g), [None, pa.py_buffer(x.tobytes())]))
    return kept(pa.RecordBatch.from_arrays(cols, schema=schema), views)


def export_batch(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A record batch as :func:`take_batch_runs` reads it step after step: natively, exported
    once through the C data interface (``dbsp._native.arrow_c.ExportedBatch``); here the batch
    itself."""
    if not isinstance(batch, pa.RecordBatch):
        raise TypeError(f"export_batch: expected a pyarrow RecordBatch, got {type(batch).__name__}")
    return batch


def take_batch_runs(schema: pa.Schema, groups: list):
    """One record batch of ``schema`` from column groups side by side, each group's rows the
    rows ``idx`` of its ``(batch, idx)`` runs one after another; None when a column is not
    fixed-width without nulls or a group has no column (see ``dbsp._native.arrow_c.take_batch_runs``).
    """
    sizes = {sum(len(idx) for _, idx in runs) for runs in groups}
    if len(sizes) > 1:
        raise ValueError("take_batch_runs: groups differ in rows")
    if not groups or not all(_fixed_width(t) for t in schema.types):
        return None
    cols: list = []
    for runs in groups:
        if not runs or any(b.num_columns == 0 or b.num_columns != runs[0][0].num_columns
                           for b, _ in runs):
            if runs and any(b.num_columns != runs[0][0].num_columns for b, _ in runs):
                raise ValueError("take_batch_runs: a group mixes batches of different columns")
            return None
        parts = []
        for b, idx in runs:
            if any(c.null_count for c in b.columns):
                return None
            idx = np.asarray(idx, dtype=np.int64)
            if len(idx) and (idx.min() < 0 or idx.max() >= b.num_rows):
                raise IndexError(f"take: row index out of range for {b.num_rows} rows")
            parts.append(b.take(pa.array(idx, pa.int64())))
        got = pa.concat_batches(parts) if len(parts) > 1 else parts[0]
        cols += got.columns
    if len(cols) != len(schema):
        raise ValueError("take_batch_runs: the groups' columns differ from the schema's")
    return pa.RecordBatch.from_arrays(cols, schema=schema)

"""The kernels every layer, merge, cursor and operator calls: native (``dbsp._native``) by default.

The signatures and results are specified by :mod:`dbsp.algebra.kernels_ref`. Set
``DBSP_KERNELS=ref`` to run the whole engine on the reference kernels (slow; for debugging the
native code). A native module that is missing is an installation error, reported when the
kernel is first needed, naming the module.
"""
from __future__ import annotations

import importlib
import os

import numpy as np

from . import checked as _checked
from . import kernels_ref as _ref

_USE_REF = os.environ.get("DBSP_KERNELS") == "ref"

# kernel name -> native module that provides it
_NATIVE = {
    "argsort": "sort",
    "sort_consolidate": "sort",
    "merge_consolidate": "merge_pairs",  # (u64, u64) runs; other shapes go on to merge
    "merge_indexed": "merge_pairs",
    "merge_indexed_cols": "merge_pairs",
    "merge_indexed_batches": "merge_pairs",
    "group_bounds": "search",
    "lower_bound": "search",
    "upper_bound": "search",
    "range_lower_bound": "search",
    "intersect": "search",
    "intersect_batches": "search",
    "code_sample": "search",
    "code_runs": "search",
    "code_rank": "search",
    "expand_pairs": "search",
    "take": "search",
    "concat": "search",
    "take_runs": "search",
    "take_var_runs": "search",
    "hash64": "hashing",
    "shard": "hashing",
    "owner_rows": "hashing",
    "owner_key_rows": "hashing",
    "deal_batch": "hashing",
    "deal_sorted": "hashing",
    "merge_sum_runs": "hashing",
    "merge_disjoint_runs": "hashing",
    "gather_disjoint": "hashing",
    "is_identity": "step",
    "mul_checked": "step",
    "join_matched_pairs": "step",
    "live_versions": "state",
    "gather_rows": "state",
    "versioned_pairs": "state",
    "pick_rows": "state",
    "LiveTable": "state",
    "combine_partials": "linear",
    "delta_partials": "linear",
    "finish_emit": "linear",
    "decode_u64": "linear",
    "merge_sum_packed": "linear",
    "pack_parts": "linear",
    "sum_unpack": "linear",
    "take_batch": "arrow_c",
    "take_batch_runs": "arrow_c",
    "export_batch": "arrow_c",
    "group_rows": "arrow_c",
    "index_rows": "arrow_c",
    "pick_batch": "arrow_c",
}


def _resolve(name: str):
    if _USE_REF:
        return getattr(_ref, name)
    mod = _NATIVE[name]
    try:
        native = importlib.import_module(f"dbsp._native.{mod}")
    except ImportError:
        if os.environ.get("DBSP_KERNELS") == "native":
            raise ImportError(
                f"dbsp._native.{mod} is not built; reinstall dbsp (pip install .) "
                f"or build in place (python setup.py build_ext --inplace)") from None
        return getattr(_ref, name)
    fn = getattr(native, name, None)
    return fn if fn is not None else getattr(_ref, name)


def _checked_sums(name: str, fn, groups):
    """Wrap a native consolidating kernel: it raises ``OverflowError`` when some partial weight
    sum wrapped (``_native/checked_add.h``); then ``groups(*args)`` gives the rows as
    ``(kcodes list, vcodes list, weights list)`` and the final sums are checked exactly: a sum
    out of int64 raises :class:`~dbsp.algebra.checked.WeightOverflowError`, else the kernel's
    wrapped result is the right one (modular arithmetic) and is returned."""
    if not getattr(fn, "__module__", "").startswith("dbsp._native"):
        return fn  # the reference kernels (DBSP_KERNELS=ref) do not check

    def run(*args, **kw):
        try:
            return fn(*args, **kw)
        except OverflowError:
            rows, sums = _checked.exact_sum_overflows(*groups(*args))
            if rows:
                raise _checked.WeightOverflowError(rows, sums, where=name) from None
            return fn(*args, check=False, **kw)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = fn.__doc__
    run.__wrapped__ = fn  # type: ignore[attr-defined]
    return run


def _merge_groups(runs):
    return [r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs]


def _indexed_groups(runs):
    ks = [np.repeat(np.asarray(r[0]), np.diff(np.asarray(r[1]))) for r in runs]
    return ks, [r[2] for r in runs], [r[3] for r in runs]


def _sort_groups(kcodes, vcodes, weights):
    return [kcodes], [vcodes], [weights]


def _listed(fn):
    def run(runs, *rest):  # runs may be an iterator: list it once, for a retry
        return fn(runs if isinstance(runs, list) else list(runs), *rest)
    run.__name__ = run.__qualname__ = fn.__name__
    run.__doc__ = fn.__doc__
    run.__wrapped__ = getattr(fn, "__wrapped__", fn)  # type: ignore[attr-defined]
    return run


argsort = _resolve("argsort")
sort_consolidate = _checked_sums("sort_consolidate", _resolve("sort_consolidate"), _sort_groups)
merge_consolidate = _listed(_checked_sums("merge_consolidate", _resolve("merge_consolidate"),
                                          _merge_groups))
merge_indexed = _listed(_checked_sums("merge_indexed", _resolve("merge_indexed"),
                                      _indexed_groups))
merge_indexed_cols = _listed(_checked_sums("merge_indexed_cols", _resolve("merge_indexed_cols"),
                                           _indexed_groups))
merge_indexed_batches = _checked_sums("merge_indexed_batches",
                                      _resolve("merge_indexed_batches"),
                                      lambda runs, *schemas: _indexed_groups(runs))
group_bounds = _resolve("group_bounds")
lower_bound = _resolve("lower_bound")
upper_bound = _resolve("upper_bound")
range_lower_bound = _resolve("range_lower_bound")
intersect = _resolve("intersect")
intersect_batches = _resolve("intersect_batches")
code_sample = _resolve("code_sample")
code_runs = _resolve("code_runs")
code_rank = _resolve("code_rank")
expand_pairs = _resolve("expand_pairs")
take = _resolve("take")
concat = _resolve("concat")
take_runs = _resolve("take_runs")
take_var_runs = _resolve("take_var_runs")
hash64 = _resolve("hash64")
shard = _resolve("shard")
owner_rows = _resolve("owner_rows")
owner_key_rows = _resolve("owner_key_rows")
deal_batch = _resolve("deal_batch")
deal_sorted = _resolve("deal_sorted")
merge_sum_runs = _resolve("merge_sum_runs")
merge_disjoint_runs = _resolve("merge_disjoint_runs")
gather_disjoint = _resolve("gather_disjoint")
is_identity = _resolve("is_identity")
mul_checked = _resolve("mul_checked")
join_matched_pairs = _resolve("join_matched_pairs")
live_versions = _resolve("live_versions")
gather_rows = _resolve("gather_rows")
LiveTable = _resolve("LiveTable")
versioned_pairs = _resolve("versioned_pairs")
pick_rows = _resolve("pick_rows")
combine_partials = _resolve("combine_partials")
finish_emit = _resolve("finish_emit")
delta_partials = _resolve("delta_partials")
decode_u64 = _resolve("decode_u64")
merge_sum_packed = _resolve("merge_sum_packed")
pack_parts = _resolve("pack_parts")
sum_unpack = _resolve("sum_unpack")
take_batch = _resolve("take_batch")
group_rows = _resolve("group_rows")
index_rows = _resolve("index_rows")
pick_batch = _resolve("pick_batch")
take_batch_runs = _resolve("take_batch_runs")
export_batch = _resolve("export_batch")


def using_native() -> dict[str, bool]:
    """Which kernels run natively (for the CLI's environment report and the tests)."""
    return {n: getattr(getattr(globals()[n], "__wrapped__", globals()[n]), "__module__",
                       "").startswith("dbsp._native") for n in _NATIVE}

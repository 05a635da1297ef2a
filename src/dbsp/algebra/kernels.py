"""The kernels every layer, merge, cursor and operator calls: native (``dbsp._native``) by default.

The signatures and results are specified by :mod:`dbsp.algebra.kernels_ref`. Set
``DBSP_KERNELS=ref`` to run the whole engine on the reference kernels (slow; for debugging the
native code). A native module that is missing is an installation error, reported when the
kernel is first needed, naming the module.
"""
from __future__ import annotations

import importlib
import os

from . import kernels_ref as _ref

_USE_REF = os.environ.get("DBSP_KERNELS") == "ref"

# kernel name -> native module that provides it
_NATIVE = {
    "argsort": "sort",
    "sort_consolidate": "sort",
    "merge_consolidate": "merge_pairs",  # (u64, u64) runs; other shapes go on to merge
    "merge_indexed": "merge_pairs",
    "group_bounds": "search",
    "lower_bound": "search",
    "upper_bound": "search",
    "intersect": "search",
    "expand_pairs": "search",
    "take": "search",
    "concat": "search",
    "hash64": "hashing",
    "shard": "hashing",
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


argsort = _resolve("argsort")
sort_consolidate = _resolve("sort_consolidate")
merge_consolidate = _resolve("merge_consolidate")
merge_indexed = _resolve("merge_indexed")
group_bounds = _resolve("group_bounds")
lower_bound = _resolve("lower_bound")
upper_bound = _resolve("upper_bound")
intersect = _resolve("intersect")
expand_pairs = _resolve("expand_pairs")
take = _resolve("take")
concat = _resolve("concat")
hash64 = _resolve("hash64")
shard = _resolve("shard")


def using_native() -> dict[str, bool]:
    """Which kernels run natively (for the CLI's environment report and the tests)."""
    return {n: getattr(globals()[n], "__module__", "").startswith("dbsp._native") for n in _NATIVE}

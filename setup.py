"""Build the Cython core (``src/_native`` -> ``dbsp._native``).

One table of extensions, one set of compiler directives.

Environment switches:

* ``DBSP_DEBUG=1``    bounds checks, wraparound checks and ``-O0 -g`` (one CI run uses it).
* ``DBSP_ANNOTATE=1`` write ``cython -a`` HTML next to the sources (never committed).
* ``DBSP_ONLY=a,b``   build only these extensions (fast in-place rebuilds while developing:
  ``DBSP_ONLY=sort python setup.py build_ext --inplace``).

Native code always keeps its symbols and frame pointers so that ``perf`` can walk the stack.
"""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

DEBUG = os.environ.get("DBSP_DEBUG") == "1"
ANNOTATE = os.environ.get("DBSP_ANNOTATE") == "1"
ONLY = {n for n in os.environ.get("DBSP_ONLY", "").split(",") if n}

# name -> extra Extension keyword arguments
EXTENSIONS = {
    "codes": {},        # normalized, order-preserving key codes
    # radix sort + consolidation; checked_add.h: the overflow check of weight sums
    "sort": {"depends": ["src/_native/checked_add.h"]},
    # k-way merge of sorted runs with consolidation; its AVX-512 kernel is a header (``depends``:
    # rebuilt when it changes, shipped in the sdist)
    "merge": {"depends": ["src/_native/merge_simd.h", "src/_native/checked_add.h"]},
    # k-way merge of (u64 key, u64 value) runs (indexed state's common shape)
    "merge_pairs": {"depends": ["src/_native/checked_add.h", "src/_native/arrow_blocks.pxd"]},
    # galloping seek, key intersection, join expansion, grouping; rank_place.h: the rank
    # directory's probe loop with a popcount picked at run time
    "search": {"depends": ["src/_native/rank_place.h"]},
    "step": {},         # the small-step path's checks (identity take, checked weight products)
    # key hashing for the exchange, the driver's deal of its input (Arrow struct blocks)
    "hashing": {"depends": ["src/_native/arrow_blocks.pxd", "src/_native/pack_codes.pxd"]},
    "state": {},        # operators' per-key state (the aggregate's versioned rows)
    "linear": {},       # the linear aggregate's per-step path (partials, versioned puts)
    # record batches through the Arrow C data interface (small takes); arrow_blocks.pxd: the
    # struct block helpers it shares with merge_pairs; pack_codes.pxd: the u64 key codes of an
    # exported batch (shared with hashing)
    "arrow_c": {"depends": ["src/_native/arrow_blocks.pxd", "src/_native/pack_codes.pxd"]},
    "strings": {},      # string kernels on Arrow buffers (split_part)
    "slab_pool": {},    # storage: slab buffer pool (pinning, S3-FIFO/CLOCK/LRU eviction)
    "block": {},        # storage: layer-file block kernels (crc32c, Bloom filter, var seek)
    "skeleton": {},     # storage: the wire message skeleton's walk and layout
    # storage: io_uring reader running nogil, linked with liburing-dev's static library (no
    # runtime dependency); skipped when the headers are absent (ci/install-system.sh adds them)
    **({"uring": {"libraries": [":liburing.a"]}} if os.path.exists("/usr/include/liburing.h")
       else {}),
}

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": True,
    "embedsignature": True,
    "binding": True,
}

cflags = ["-fno-omit-frame-pointer", "-g"]
cflags += ["-O0"] if DEBUG else ["-O3"]

extensions = [
    Extension(
        f"dbsp._native.{name}",
        [f"src/_native/{name}.pyx"],
        include_dirs=[numpy.get_include(), "src/_native"],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=cflags,
        extra_link_args=["-g"],
        **kw,
    )
    for name, kw in EXTENSIONS.items()
    if os.path.exists(f"src/_native/{name}.pyx") and (not ONLY or name in ONLY)
]

setup(
    package_dir={"dbsp": "src/dbsp", "dbsp._native": "src/_native"},
    # every package under src/dbsp (a new layer or sub-package ships without editing this)
    packages=["dbsp", "dbsp._native"] + [f"dbsp.{p}" for p in find_packages("src/dbsp")],
    ext_modules=cythonize(
        extensions,
        include_path=["src"],
        compiler_directives=directives,
        annotate=ANNOTATE,
        nthreads=os.cpu_count() or 1,
    ),
)

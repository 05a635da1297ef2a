# Run:  valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file=/tmp/cgb \
#           python bench/micro/callgrind_block_read.py [--block 4096] [--batches 8]
#       grep -H ^totals /tmp/cgb*       (user instructions of the measured reads; / blocks read)
#       A/B: the same with PYTHONPATH=<other tree>/src; needs gcc and valgrind's headers.
"""User-space instructions a block of the default backend's pooled read path under callgrind.

``bench_block_io.py`` times cold reads against fio, which on a shared 2-core host swings 2x
from round to round; this counts what the reader itself executes per block, which does not.
A layer file of 4 KiB (or ``--block``) blocks is written to a temporary directory and read once
buffered so that the page cache holds it; then ``--batches`` batches of 1,024 (256 at 64 KiB)
random blocks go through ``read_blocks`` of a ``make_backend("auto", direct=False)`` backend on
a freshly opened file (so every block misses the pool: reserve, io_uring read from the page
cache, CRC-32C, publish), and each batch's block views are dropped, with the instrumentation on
only around those reads (``CALLGRIND_TOGGLE_COLLECT`` through a tiny helper compiled on the fly).
Kernel work (the copy out of the page cache, the ring's syscalls) is not counted."""
from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from dbsp.storage.backend import make_backend

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_block_io import BATCH, _data_extents, _write_file  # noqa: E402

_HELPER = """#include <valgrind/callgrind.h>
void cg_on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_TOGGLE_COLLECT; }
void cg_off(void) { CALLGRIND_TOGGLE_COLLECT; CALLGRIND_DUMP_STATS; }
"""


def _helper(d: str) -> ctypes.CDLL:
    src, lib = os.path.join(d, "cg.c"), os.path.join(d, "libcg.so")
    with open(src, "w") as f:
        f.write(_HELPER)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
    return ctypes.CDLL(lib)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block", type=int, default=4096)
    ap.add_argument("--batches", type=int, default=8)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="dbsp-cgb-", dir=os.environ.get("DBSP_BENCH_DIR"))
    try:
        cg = _helper(d)
        batch = BATCH[a.block]
        n = batch * a.batches
        path = os.path.join(d, "f.layer")
        _write_file(path, max(64 << 20, 4 * n * a.block), a.block)
        with open(path, "rb") as f:                       # page cache: no disk wait counted
            while f.read(1 << 24):
                pass
        ext = _data_extents(path, a.block)
        rng = np.random.default_rng(11)
        pick = [tuple(map(int, e)) for e in ext[rng.choice(len(ext), n, replace=False)]]
        be = make_backend("auto", budget=max(64 << 20, 2 * n * a.block), slot_size=a.block,
                          populate=True, direct=False)
        fh = be.open(path)
        bufs = fh.read(pick[:batch])                      # warm the code paths, then a new file
        del bufs
        fh.close()
        fh = be.open(path)
        cg.cg_on()
        for i in range(0, n, batch):
            bufs = fh.read(pick[i:i + batch])
            del bufs
        cg.cg_off()
        fh.close()
        be.shutdown()
        print(f"{n} blocks of {a.block} B read; divide callgrind's totals by {n}")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()

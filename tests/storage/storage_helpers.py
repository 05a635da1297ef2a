"""Fixtures shared by the storage tests: every backend, small pools, layer-file builders."""
from __future__ import annotations

import decimal
import threading
from typing import Callable

import numpy as np
import pyarrow as pa
import pytest

from dbsp.storage.backend import available_backends, make_backend
from dbsp.storage.config import StorageConfig
from dbsp.storage.reader import LayerFile

BACKENDS = ["mmap", "pread", "uring"]


def tiny(root, backend: str = "auto", **kw) -> StorageConfig:
    """Everything goes to files: a 16 KiB budget (all but nothing spills), merges of 3 rows or
    more write files, read 2 rows at a time (so keys split across pieces), 4 KiB blocks."""
    opts = dict(memory_budget_bytes=16 << 10, backend=backend, block_size=4096,
                min_file_rows=3, min_spill_bytes=0, merge_chunk_rows=2, cache_bytes=1 << 20,
                min_free_bytes=0)
    opts.update(kw)
    return StorageConfig(str(root), **opts)


def backend_or_skip(kind: str, **kw):
    why = available_backends().get(kind)
    if why:
        pytest.skip(f"{kind} backend unavailable: {why}")
    if kind == "mmap":
        return make_backend("mmap")
    kw.setdefault("budget", 4 << 20)
    kw.setdefault("slot_size", 16384)
    return make_backend(kind, **kw)


def open_layer(path: str, kind: str):
    """Yield ``path`` opened as a LayerFile through a fresh backend of ``kind`` (4 KiB slots, so
    reads cross blocks), closed after (for module fixtures parametrised over backends)."""
    be = backend_or_skip(kind, budget=4 << 20, slot_size=4096) if kind != "mmap" \
        else backend_or_skip("mmap")
    f = LayerFile(path, be)
    yield f
    f.close()
    be.shutdown()


def in_threads(work: Callable[[int], None], n: int = 4) -> list:
    """Run ``work(seed)`` for seeds 0..n-1 on n threads at once; the exceptions they raised."""
    errors: list = []

    def run(seed: int) -> None:
        try:
            work(seed)
        except Exception as e:  # pragma: no cover - the caller reports it
            errors.append(e)
    ts = [threading.Thread(target=run, args=(s,)) for s in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors


@pytest.fixture(params=BACKENDS)
def backend(request):
    be = backend_or_skip(request.param)
    yield be
    be.shutdown()


ALL_TYPES = [
    ("i8", pa.int8()), ("i16", pa.int16()), ("i32", pa.int32()), ("i64", pa.int64()),
    ("u8", pa.uint8()), ("u16", pa.uint16()), ("u32", pa.uint32()), ("u64", pa.uint64()),
    ("f64", pa.float64()), ("b", pa.bool_()), ("d32", pa.date32()),
    ("ts", pa.timestamp("us", tz="UTC")), ("dec", pa.decimal128(20, 3)),
    ("s", pa.string()), ("bin", pa.binary()), ("ls", pa.large_string()),
]


def make_column(t: pa.DataType, n: int, rng: np.random.Generator, null_frac: float = 0.1):
    """A random Arrow column of type t with about null_frac nulls."""
    mask = rng.random(n) < null_frac if null_frac else np.zeros(n, dtype=bool)
    if pa.types.is_boolean(t):
        vals = rng.random(n) < 0.5
        return pa.array(vals, type=t, mask=mask)
    if pa.types.is_decimal(t):
        v = rng.integers(-10**9, 10**9, n)
        return pa.array([None if m else decimal.Decimal(int(x)).scaleb(-t.scale)
                         for x, m in zip(v, mask)], type=t)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        lens = rng.integers(0, 40, n)
        return pa.array([None if m else "é" * int(k % 3) + "x" * int(k)
                         for k, m in zip(lens, mask)], type=t)
    if pa.types.is_binary(t):
        lens = rng.integers(0, 40, n)
        return pa.array([None if m else bytes(rng.integers(0, 256, int(k), dtype=np.uint8))
                         for k, m in zip(lens, mask)], type=t)
    if pa.types.is_floating(t):
        return pa.array(rng.standard_normal(n), type=t, mask=mask)
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        base = pa.int32() if pa.types.is_date32(t) else pa.int64()
        return pa.array(rng.integers(0, 10**6, n), type=base, mask=mask).cast(t)
    info = np.iinfo(t.to_pandas_dtype())
    v = rng.integers(info.min, info.max, n, dtype=t.to_pandas_dtype(), endpoint=True)
    return pa.array(v, type=t, mask=mask)


@pytest.fixture
def tmp(tmp_path):
    return str(tmp_path)

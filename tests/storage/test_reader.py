"""LayerFile (mirrors ``src/dbsp/storage/reader.py``): row ranges against the rows written.

Any range ``[i, j)`` of any stream reads back the written slice; ``boundary`` gives ranges that
are views of one block; ``lower_bound`` agrees with ``numpy.searchsorted``; ``extents`` names
exactly the blocks a read touches; out-of-range rows, unknown columns and missing streams are
errors naming the file and the stream. (Corrupt and truncated files: ``test_corruption.py``.)
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from storage_helpers import backend_or_skip, open_layer

from dbsp.storage.format import TruncatedFileError
from dbsp.storage.reader import LayerFile, read_metadata
from dbsp.storage.writer import LayerFileWriter, LayerSpec

N = 20_000
SCHEMA = pa.schema([("v", pa.int64()), ("s", pa.string())])


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """One file of N rows in 4 KiB blocks (with repeated codes), and the rows written."""
    rng = np.random.default_rng(5)
    codes = np.sort(rng.integers(0, N // 2, N).astype(np.uint64))  # duplicates on purpose
    v = pa.array(rng.integers(-10**9, 10**9, N), pa.int64(), mask=rng.random(N) < 0.05)
    s = pa.array(["k" * int(k) for k in rng.integers(0, 60, N)], pa.string())
    w = rng.integers(1, 5, N).astype(np.int64)
    p = str(tmp_path_factory.mktemp("reader") / "r.layer")
    with LayerFileWriter(p, LayerSpec("u64", SCHEMA), block_size=4096, durable=False) as wr:
        for a in range(0, N, 3000):
            wr.append(codes[a:a + 3000], [v[a:a + 3000], s[a:a + 3000]], w[a:a + 3000])
    return p, codes, v, s, w


@pytest.fixture(scope="module", params=["pread", "mmap", "uring"])
def lf(request, written):
    yield from open_layer(written[0], request.param)


ranges = st.tuples(st.integers(0, N), st.integers(0, N)).map(sorted)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(r=ranges, copy=st.booleans())
@example(r=[0, N], copy=False)
@example(r=[N, N], copy=False)
def test_any_range_reads_the_rows_written(lf, written, r, copy):
    _, codes, v, s, w = written
    i, j = r
    assert np.array_equal(lf.codes(i, j, copy=copy), codes[i:j])
    assert np.array_equal(lf.weights(i, j, copy=copy), w[i:j])
    assert lf.column("v", i, j, copy=copy).equals(v[i:j])
    assert lf.column(1, i, j, copy=copy).equals(s[i:j])
    ch = lf.column("s", i, j, chunked=True)
    assert isinstance(ch, pa.ChunkedArray) and ch.combine_chunks().equals(s[i:j])
    chunk = lf.read(i, j, columns=["s"])
    assert chunk.columns[0].equals(s[i:j]) and np.array_equal(chunk.codes, codes[i:j])


def test_stepping_by_boundary_gives_views_of_one_block(lf, written):
    _, codes, v, s, w = written
    i, steps = 0, 0
    while i < N:
        j = lf.boundary(i)
        assert i < j <= N
        c = lf.codes(i, j)
        assert not c.flags.owndata and np.array_equal(c, codes[i:j])  # a view, not a copy
        # boundary is where the next block of *some* stream starts: one more row leaves a block
        if j < N:
            assert any(j in set(lf.block_starts(role=role, col=col))
                       for role, col in (("codes", None), ("column", 0), ("column", 1),
                                         ("weights", None)))
        del c
        i, steps = j, steps + 1
    assert steps > 10  # the file really has many blocks
    assert lf.boundary(N) == N


def test_block_starts_and_extents(lf, written):
    for role, col in (("codes", None), ("column", "v"), ("column", "s"), ("weights", None)):
        starts = lf.block_starts(role=role, col=col)
        assert starts[0] == 0 and np.all(np.diff(starts) > 0) and starts[-1] < N
    assert all(ext <= 4096 for _, ext in lf.extents(0, N))
    # a range inside the first code block touches exactly one block per stream read
    one = lf.extents(0, 1)
    assert len(one) == 4 and len(set(off for off, _ in one)) == 4
    assert lf.extents(0, 1, columns=[], weights=False) == one[:1]
    assert lf.extents(5, 5) == [] and lf.extents(-10, 0) == []


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(probe=st.integers(0, N), r=ranges)
def test_lower_bound_is_searchsorted(lf, written, probe, r):
    codes = written[1]
    lo, hi = r
    want = lo + int(np.searchsorted(codes[lo:hi], np.uint64(probe), side="left"))
    assert lf.lower_bound(probe, lo, hi) == want


def test_filter_has_no_false_negatives(lf, written):
    codes = written[1]
    assert lf.has_filter and lf.may_contain_many(codes).all()
    absent = np.arange(N, N + 20_000, dtype=np.uint64)  # codes are all below N // 2
    assert lf.may_contain_many(absent).mean() < 0.01


@pytest.mark.parametrize("call, exc, msg", [
    (lambda f: f.codes(0, N + 1), IndexError, r"rows \[0, 20001\) out of range \[0, 20000\] of "
                                              r"codes 'codes' in .*r\.layer"),
    (lambda f: f.column("v", 5, 4), IndexError, r"rows \[5, 4\) out of range .* of column 'v'"),
    (lambda f: f.weights(-1, 3), IndexError, r"rows \[-1, 3\) out of range .* weights"),
    (lambda f: f.column("nope", 0, 1), KeyError, r"layer 0 has no column 'nope'; columns: "
                                                 r"\['v', 's'\]"),
    (lambda f: f.offsets(0, 1), ValueError, "layer 0 has no offsets"),
])
def test_bad_reads_name_the_stream_and_the_file(lf, call, exc, msg):
    with pytest.raises(exc, match=msg):
        call(lf)


def test_metadata_without_opening(written):
    p = written[0]
    meta = read_metadata(p)
    assert meta["file_size"] == os.path.getsize(p)
    assert meta["layers"][0]["rows"] == N and meta["block_size"] == 4096
    with LayerFile(p, backend_or_skip("pread")) as f:
        assert (f.n_rows, f.n_layers, f.rows(0)) == (N, 1, N)
        assert f.schema(0).equals(SCHEMA)
        assert "r.layer" in repr(f) and "pread" in repr(f)
    assert f.closed


def test_a_file_that_is_not_finished_is_refused(tmp_path):
    p = str(tmp_path / "open.layer")
    wr = LayerFileWriter(p, LayerSpec("u64", None, weights=False), durable=False)
    wr.append(np.arange(10, dtype=np.uint64))
    wr._sink.flush()  # blocks on disk, no trailer yet: what a crash mid-write leaves
    with pytest.raises(TruncatedFileError):
        LayerFile(p + ".mut", backend_or_skip("pread"))
    wr.abort()

"""StorageConfig (mirrors ``src/dbsp/storage/config.py``): derived sizes against the rules the
docstring states, validation errors that name the field, ``share`` and ``as_storage_config``."""
from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dbsp.storage.config import MiB, StorageConfig, as_storage_config, free_space

budgets = st.integers(1, 8 << 30)
blocks = st.sampled_from([4096, 8192, 65536, 1 << 20])


@given(budget=budgets, block=blocks, backend=st.sampled_from(["auto", "uring", "pread", "mmap"]))
def test_derived_sizes_follow_the_documented_rules(budget, block, backend):
    c = StorageConfig("/tmp/x", memory_budget_bytes=budget, block_size=block, backend=backend)
    # cache: a quarter of the budget, within 1-256 MiB, and at least 16 blocks
    quarter = min(max(budget // 4, MiB), 256 * MiB)
    assert c.cache == max(quarter, 16 * block)
    # one merge round: a sixteenth of the budget, at least 2 MiB
    assert c.round_bytes == max(budget // 16, 2 * MiB)
    # never spill less than a 32nd of the budget, within 64 KiB - 1 MiB
    assert c.spill_floor == min(max(budget // 32, 64 << 10), MiB)
    assert 64 << 10 <= c.spill_floor <= MiB
    # in-memory batches get the budget minus the cache, never less than an eighth of it;
    # mmap has no pool, so all of it
    if backend == "mmap":
        assert c.batch_budget == budget
    else:
        assert c.batch_budget == max(budget - c.cache, budget // 8)
        assert budget // 8 <= c.batch_budget <= budget


def test_explicit_sizes_win():
    c = StorageConfig("/tmp/x", memory_budget_bytes=64 * MiB, cache_bytes=3 * MiB,
                      merge_round_bytes=12345, min_spill_bytes=7)
    assert c.cache == 3 * MiB and c.round_bytes == 12345 and c.spill_floor == 7
    # an explicit cache below 16 blocks is raised to 16 blocks (the pool needs its slots)
    assert StorageConfig("/tmp/x", cache_bytes=1, block_size=8192).cache == 16 * 8192


@given(budget=budgets, cache=st.one_of(st.none(), st.integers(1, 1 << 30)),
       parts=st.integers(-1, 64))
def test_share_divides_the_budget_and_an_explicit_cache(budget, cache, parts):
    c = StorageConfig("/tmp/x", memory_budget_bytes=budget, cache_bytes=cache)
    s = c.share(parts)
    if parts <= 1:
        assert s is c
        return
    assert s.memory_budget_bytes == max(budget // parts, 1)
    assert s.cache_bytes == (None if cache is None else max(cache // parts, 1))
    assert s.memory_budget_bytes * parts <= max(budget, parts)  # no process gets more than its part
    assert (s.dir, s.backend, s.block_size) == (c.dir, c.backend, c.block_size)


@pytest.mark.parametrize("kw, msg", [
    ({"memory_budget_bytes": 0}, "memory_budget_bytes must be positive, got 0"),
    ({"memory_budget_bytes": -5}, "memory_budget_bytes must be positive, got -5"),
    ({"block_size": 1000}, "block_size must be a positive multiple of 4096, got 1000"),
    ({"block_size": 0}, "block_size must be a positive multiple of 4096, got 0"),
    ({"block_size": 6144}, "block_size must be a positive multiple of 4096, got 6144"),
    ({"backend": "aio"}, "unknown backend 'aio'; choose auto, uring, pread or mmap"),
    ({"compression": "zstd"}, "compression must be None or 'lz4', got 'zstd'"),
    ({"min_file_rows": 0}, "min_file_rows and merge_chunk_rows must be at least 1"),
    ({"merge_chunk_rows": 0}, "min_file_rows and merge_chunk_rows must be at least 1"),
])
def test_bad_settings_are_refused_naming_the_field(kw, msg):
    with pytest.raises(ValueError) as e:
        StorageConfig("/tmp/x", **kw)
    assert str(e.value) == msg


def test_dir_may_be_a_path_and_the_config_is_frozen(tmp_path):
    c = StorageConfig(tmp_path / "state")
    assert c.dir == str(tmp_path / "state") and isinstance(c.dir, str)
    with pytest.raises(AttributeError):
        c.memory_budget_bytes = 1  # type: ignore[misc]


def test_as_storage_config(tmp_path):
    assert as_storage_config(None) is None
    c = StorageConfig(str(tmp_path))
    assert as_storage_config(c) is c
    assert as_storage_config(str(tmp_path)) == StorageConfig(str(tmp_path))
    assert as_storage_config(pathlib.Path(tmp_path)).dir == str(tmp_path)
    with pytest.raises(TypeError, match="storage must be a directory or a StorageConfig, got int"):
        as_storage_config(5)


def test_free_space_is_what_statvfs_reports(tmp_path):
    st_ = os.statvfs(tmp_path)
    got = free_space(str(tmp_path))
    assert 0 <= got <= st_.f_blocks * st_.f_frsize
    assert got % st_.f_frsize == 0
    with pytest.raises(FileNotFoundError):
        free_space(str(tmp_path / "missing"))

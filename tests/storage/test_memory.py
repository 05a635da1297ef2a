"""The allocator policy: throughput by default when a circuit starts; storage's bounded policy
wins whichever comes first; DBSP_TUNE_MALLOC=0 leaves the allocator alone."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = """
import pyarrow as pa, dbsp
from dbsp.storage import memory
order = {order!r}
if order == "bounded-first":
    memory.limit_allocator_retention()
c = dbsp.Circuit()
c.add_input("t", [("x", pa.int64())]).output()
c.step()
if order == "circuit-first":
    memory.limit_allocator_retention()
memory.tune_malloc()
print(memory.policy())
"""


@pytest.mark.parametrize("order,env,expected", [
    ("none", {}, "throughput"),
    ("circuit-first", {}, "bounded"),
    ("bounded-first", {}, "bounded"),
    ("none", {"DBSP_TUNE_MALLOC": "0"}, "None"),
])
def test_policy(order, env, expected):
    out = subprocess.run([sys.executable, "-c", CODE.format(order=order)], capture_output=True,
                         text=True, env={**os.environ, **env}, check=True, timeout=120)
    assert out.stdout.strip() == expected


NO_CHILD = """
import subprocess

def no_child(*a, **k):
    raise AssertionError(f"a child process was started: {a}")

subprocess.Popen = no_child
import pyarrow as pa, dbsp
from dbsp.storage import memory
c = dbsp.Circuit()
c.add_input("t", [("x", pa.int64())]).output()
c.step()
memory.release_free_memory()
print(memory.policy())
"""


def test_the_allocator_policy_finds_libc_without_a_child_process():
    """mallopt and malloc_trim come from the process's own symbols: starting a circuit (the
    throughput policy) and trimming start no ``ldconfig`` child, as
    ``ctypes.util.find_library`` would, in a fork of a possibly large process."""
    out = subprocess.run([sys.executable, "-c", NO_CHILD], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == "throughput", out.stderr


HUGE = """
import numpy as np, pyarrow as pa, dbsp
core = getattr(np, "_core", None) or np.core
switch = core.multiarray._set_madvise_hugepage
before = switch(True)   # numpy's own setting at import (and back on)
c = dbsp.Circuit()
c.add_input("t", [("x", pa.int64())]).output()
c.step()
print(before, switch(True))   # the setting once a circuit started
"""


@pytest.mark.parametrize("env,expected", [
    ({}, "False"),                                  # the engine's policy: no advice
    ({"NUMPY_MADVISE_HUGEPAGE": "1"}, "True"),      # the user's choice is kept
    ({"DBSP_TUNE_MALLOC": "0"}, "True"),            # no policy: numpy's default
])
def test_numpy_huge_page_advice(env, expected):
    """A circuit's start turns off numpy's huge-page advice for its large arrays (faults on them
    compact memory first: see dbsp.storage.memory), unless the user chose it in the
    environment or turned the allocator policy off."""
    environ = {k: v for k, v in os.environ.items() if k != "NUMPY_MADVISE_HUGEPAGE"}
    out = subprocess.run([sys.executable, "-c", HUGE], capture_output=True, text=True,
                         env={**environ, **env}, check=True, timeout=120)
    before, after = out.stdout.split()
    if env.get("NUMPY_MADVISE_HUGEPAGE") != "1":
        assert before == "True", out.stdout   # (numpy's default where the kernel has THP)
    assert after == expected, out.stdout

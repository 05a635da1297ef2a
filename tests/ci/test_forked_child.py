"""bench/operators/_workload.in_forked_child, the one helper every efficiency and memory
benchmark measures a run through: a result of any kind comes back, an error in the child is
raised with its traceback, and a child that dies without a result is an error, not a hang."""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("_workload", ROOT / "bench" / "operators"
                                               / "_workload.py")
workload = importlib.util.module_from_spec(_spec)
sys.modules["_workload"] = workload
_spec.loader.exec_module(workload)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork")


def _pid_and(x):
    return os.getpid(), x


def _fails():
    raise ValueError("the run failed")


def _dies():
    os._exit(3)


@linux
def test_a_result_of_any_kind_comes_back_from_another_process():
    pid, got = workload.in_forked_child(_pid_and, (1.5, [2]))
    assert pid != os.getpid() and got == (1.5, [2])


@linux
def test_an_error_in_the_child_is_raised_with_its_traceback():
    with pytest.raises(RuntimeError, match="the run failed") as e:
        workload.in_forked_child(_fails)
    assert "_fails" in str(e.value)  # the child's traceback


@linux
def test_a_child_that_dies_without_a_result_is_an_error():
    with pytest.raises(RuntimeError, match="died without a result.*exit code 3"):
        workload.in_forked_child(_dies)

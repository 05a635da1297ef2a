"""The runnable examples in the operator modules' docstrings (the maths and a worked example)."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [f"dbsp.operators.{m}" for m in
           ("distinct", "join", "aggregate", "topk", "recursive", "upsert", "map")]
MODULES.append("dbsp.runtime.circuit")


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.attempted > 0, f"{name} needs a runnable example"
    assert res.failed == 0

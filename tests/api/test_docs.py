"""The runnable examples in the docstrings of the API and time operators (doctest)."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["dbsp.api", "dbsp.api.expr", "dbsp.api.expr.tree", "dbsp.api.expr.strings",
           "dbsp.api.expr.datetime", "dbsp.api.expr.aggregates", "dbsp.api.context",
           "dbsp.algebra.dtypes", "dbsp.algebra.time", "dbsp.operators.watermark",
           "dbsp.operators.window", "dbsp.operators.rolling", "dbsp.api.durable"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.failed == 0
    assert res.attempted > 0

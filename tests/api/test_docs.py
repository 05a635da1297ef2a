"""The runnable examples in the docstrings of the API and time operators (doctest)."""
from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["dbsp.api", "dbsp.api.expr", "dbsp.api.context", "dbsp.operators.watermark",
           "dbsp.operators.window", "dbsp.operators.rolling"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert res.failed == 0
    assert res.attempted > 0

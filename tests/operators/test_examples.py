"""Every script in examples/ runs (each is one concept in under 40 lines)."""
from __future__ import annotations

import pathlib
import runpy

import pytest

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, capsys):
    assert len(path.read_text().splitlines()) < 40
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out

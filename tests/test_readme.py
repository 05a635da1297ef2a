"""The README's example and the package map's doctest run, and print what they say they print."""
from __future__ import annotations

import ast
import contextlib
import doctest
import io
import re
from pathlib import Path

import dbsp

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_prints_what_its_comments_say():
    text = README.read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    expected = [ast.literal_eval(m.split("#", 1)[1].split("--")[0].strip())
                for m in block.splitlines() if m.startswith("print(") and "#" in m]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), {})
    printed = [ast.literal_eval(line) for line in out.getvalue().splitlines()]
    assert printed == expected and len(expected) == 3


def test_package_map_doctest():
    assert doctest.testmod(dbsp).failed == 0

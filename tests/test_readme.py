"""The README's examples and the package map's doctest run, and print what they say they print.

A README example is a fenced ``python`` block whose ``print(...)`` lines end with a comment
giving the value printed (``print(x)  # {(10, 200.0): 1}``); every such block runs, and the
tests fail if the README (or the package docstring) has no runnable example at all.
"""
from __future__ import annotations

import ast
import contextlib
import doctest
import io
import re
from pathlib import Path

import dbsp

README = Path(__file__).resolve().parent.parent / "README.md"


def examples(text: str) -> list[tuple[str, list]]:
    """``(code, expected printed values)`` of every python block that says what it prints."""
    out = []
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        expected = [ast.literal_eval(line.split("#", 1)[1].split("--")[0].strip())
                    for line in block.splitlines() if line.startswith("print(") and "#" in line]
        if expected:
            out.append((block, expected))
    return out


def test_examples_are_found_only_where_they_are():
    assert examples("no code here") == []
    assert examples("```python\nx = 1\n```") == []  # runs nothing, claims nothing
    assert examples("```python\nprint(1 + 1)  # 2\n```") == [("print(1 + 1)  # 2\n", [2])]


def test_readme_examples_print_what_their_comments_say():
    found = examples(README.read_text())
    assert found, "README.md has no runnable example (a ```python block whose print(...) lines " \
                  "end with '# <value printed>')"
    for i, (block, expected) in enumerate(found):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"README.md example {i + 1}", "exec"), {})
        printed = [ast.literal_eval(line) for line in out.getvalue().splitlines()]
        assert printed == expected, f"README.md example {i + 1}"


def test_package_map_doctest():
    res = doctest.testmod(dbsp)
    assert res.attempted > 0, "the dbsp package docstring has no runnable example"
    assert res.failed == 0

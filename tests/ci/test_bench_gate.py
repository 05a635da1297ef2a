"""ci/bench_gate.py: the regression gate passes ratios within tolerance and fails the others."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_gate", ROOT / "ci" / "bench_gate.py")
gate = importlib.util.module_from_spec(_spec)
sys.modules["bench_gate"] = gate  # dataclasses look their module up
_spec.loader.exec_module(gate)


def _results(**ratios) -> dict:
    """A pytest-benchmark JSON with one benchmark per ``name=(key, value)``."""
    return {"benchmarks": [
        {"name": f"test_x[{n}]", "fullname": f"bench/micro/bench_x.py::test_x[{n}]",
         "stats": {"median": 0.01}, "extra_info": {k: v}}
        for n, (k, v) in ratios.items()]}


BASE = {"tolerance": 0.3, "checks": [
    {"bench": "bench_x.py::test_x[up]", "ratio": "ratio_to_numpy", "higher_is_better": True,
     "baseline": 2.0},
    {"bench": "bench_x.py::test_x[flat]", "ratio": "ratio_large_vs_small",
     "higher_is_better": False, "baseline": 1.2, "tolerance": 0.5},
]}


def _run(tmp_path, results, base=BASE, *extra) -> int:
    r, b = tmp_path / "r.json", tmp_path / "b.json"
    r.write_text(json.dumps(results))
    b.write_text(json.dumps(base))
    return gate.main([str(r), "--baseline", str(b), *extra])


def test_within_tolerance_passes(tmp_path, capsys):
    # 2.0 * 0.7 = 1.4 is the floor; 1.2 / 0.5 = 2.4 the ceiling of the lower-is-better ratio
    assert _run(tmp_path, _results(up=("ratio_to_numpy", 1.41),
                                   flat=("ratio_large_vs_small", 2.39))) == 0
    assert "all 2 ratios within tolerance" in capsys.readouterr().out


def test_higher_is_better_below_tolerance_fails(tmp_path, capsys):
    assert _run(tmp_path, _results(up=("ratio_to_numpy", 1.39),
                                   flat=("ratio_large_vs_small", 1.0))) == 1
    out = capsys.readouterr().out
    assert "FAIL  bench_x.py::test_x[up] ratio_to_numpy: 1.390" in out


def test_lower_is_better_above_tolerance_fails(tmp_path, capsys):
    assert _run(tmp_path, _results(up=("ratio_to_numpy", 5.0),
                                   flat=("ratio_large_vs_small", 2.41))) == 1
    assert "FAIL  bench_x.py::test_x[flat]" in capsys.readouterr().out


def test_missing_benchmark_or_ratio_fails(tmp_path, capsys):
    assert _run(tmp_path, _results(up=("ratio_to_numpy", 3.0))) == 1
    assert "missing" in capsys.readouterr().out
    assert _run(tmp_path, _results(up=("ratio_to_numpy", 3.0),
                                   flat=("other_key", 1.0))) == 1


def test_name_matches_whole_path_parts_only(tmp_path):
    # "bench_x.py::test_x[up]" must not match "otherbench_x.py::test_x[up]"
    res = _results(up=("ratio_to_numpy", 3.0), flat=("ratio_large_vs_small", 1.0))
    res["benchmarks"][0]["fullname"] = "bench/micro/otherbench_x.py::test_x[up]"
    assert _run(tmp_path, res) == 1


def test_bad_input_is_named(tmp_path, capsys):
    assert _run(tmp_path, {"nothing": []}) == 2
    assert "no 'benchmarks' list" in capsys.readouterr().err
    bad = {"tolerance": 1.5, "checks": BASE["checks"]}
    assert _run(tmp_path, _results(), bad) == 2
    assert "'tolerance' must be a number in [0, 1)" in capsys.readouterr().err
    bad = {"tolerance": 0.3, "checks": [dict(BASE["checks"][0], baseline=-1)]}
    assert _run(tmp_path, _results(), bad) == 2
    assert "checks[0] (bench_x.py::test_x[up]): 'baseline' must be a positive" in \
        capsys.readouterr().err
    assert gate.main([str(tmp_path / "nope.json"), "--baseline", str(tmp_path / "b.json")]) == 2


def test_update_writes_measured_ratios(tmp_path):
    assert _run(tmp_path, _results(up=("ratio_to_numpy", 3.14159),
                                   flat=("ratio_large_vs_small", 0.9)), BASE, "--update") == 0
    new = json.loads((tmp_path / "b.json").read_text())
    assert [c["baseline"] for c in new["checks"]] == [3.142, 0.9]
    assert new["checks"][1]["tolerance"] == 0.5  # the rest is kept


@pytest.mark.parametrize("hib,base,tol,limit", [(True, 2.0, 0.25, 1.5), (False, 1.5, 0.25, 2.0)])
def test_limit(hib, base, tol, limit):
    assert gate.limit_of(base, tol, hib) == pytest.approx(limit)


def test_committed_baseline_is_valid():
    base = json.loads((ROOT / "bench" / "baseline.json").read_text())
    checks, tol = gate._checks(base, Path("bench/baseline.json"))
    assert checks and 0 < tol < 1
    for c in checks:  # every check names a benchmark file that exists
        assert list((ROOT / "bench").rglob(c["bench"].split("::")[0])), c["bench"]

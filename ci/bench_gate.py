#!/usr/bin/env python3
"""The regression gate: ratios measured by ``bench/`` in one run, against a committed baseline.

    python ci/bench_gate.py RESULTS.json [--baseline bench/baseline.json]
    python ci/bench_gate.py RESULTS.json --update     # write the measured ratios as the baseline

``RESULTS.json`` is what ``pytest --benchmark-json=RESULTS.json`` wrote. The baseline
(``bench/baseline.json``) lists *checks*; each names a benchmark (``file::test[param]``, matched
against the end of pytest-benchmark's ``fullname``), a ratio it records in ``extra_info`` and
whether higher or lower is better. Only ratios are gated, never absolute times: a ratio compares
two things measured in the same run on the same (shared, noisy) machine - the engine against
numpy, or the step at 10x the history against the step at 1x - so a slower machine moves both
sides. Absolute times stay in the JSON for the record.

A check fails when its ratio is worse than the baseline by more than the tolerance (the check's
own ``tolerance`` or the file's): for a higher-is-better ratio ``r < baseline * (1 - tol)``, for
a lower-is-better one ``r > baseline / (1 - tol)`` (the same relative slack on the speed it
stands for). A check whose benchmark or ratio is missing from the results fails too: a gate that
passes because its benchmark stopped running is no gate. Exit status 0 when every check passes,
1 when one fails, 2 when the input is unreadable.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

DEFAULT_BASELINE = Path(__file__).resolve().parent.parent / "bench" / "baseline.json"


class GateError(Exception):
    """The results or the baseline cannot be read (a file, a field, a value)."""


@dataclass
class Outcome:
    bench: str
    ratio: str
    higher_is_better: bool
    baseline: float
    tolerance: float
    measured: Optional[float]
    limit: float

    @property
    def ok(self) -> bool:
        if self.measured is None:
            return False
        if self.higher_is_better:
            return self.measured >= self.limit
        return self.measured <= self.limit

    def line(self) -> str:
        got = "missing" if self.measured is None else f"{self.measured:.3f}"
        way = ">=" if self.higher_is_better else "<="
        verdict = "ok" if self.ok else "FAIL"
        return (f"{verdict:4}  {self.bench} {self.ratio}: {got} (baseline {self.baseline:.3f}, "
                f"needs {way} {self.limit:.3f}, tolerance {self.tolerance:.0%})")


def _load(path: Path, what: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        raise GateError(f"{what} {path}: no such file") from None
    except json.JSONDecodeError as e:
        raise GateError(f"{what} {path}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise GateError(f"{what} {path}: expected a JSON object, got {type(data).__name__}")
    return data


def limit_of(baseline: float, tolerance: float, higher_is_better: bool) -> float:
    """The worst ratio that still passes."""
    return baseline * (1 - tolerance) if higher_is_better else baseline / (1 - tolerance)


def _checks(base: dict, path: Path) -> tuple[list[dict], float]:
    tol = base.get("tolerance")
    if not isinstance(tol, (int, float)) or not 0 <= tol < 1:
        raise GateError(f"baseline {path}: 'tolerance' must be a number in [0, 1), got {tol!r}")
    checks = base.get("checks")
    if not isinstance(checks, list) or not checks:
        raise GateError(f"baseline {path}: 'checks' must be a non-empty list")
    for i, c in enumerate(checks):
        where = f"baseline {path}: checks[{i}]"
        if not isinstance(c, dict):
            raise GateError(f"{where}: expected an object, got {type(c).__name__}")
        for k, t in (("bench", str), ("ratio", str), ("higher_is_better", bool)):
            if not isinstance(c.get(k), t):
                raise GateError(f"{where}: '{k}' must be a {t.__name__}, got {c.get(k)!r}")
        b = c.get("baseline")
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not b > 0:
            raise GateError(f"{where} ({c['bench']}): 'baseline' must be a positive number, "
                            f"got {b!r}")
        t = c.get("tolerance", tol)
        if not isinstance(t, (int, float)) or not 0 <= t < 1:
            raise GateError(f"{where} ({c['bench']}): 'tolerance' must be in [0, 1), got {t!r}")
    return checks, float(tol)


def _benchmarks(results: dict, path: Path) -> list[dict]:
    bs = results.get("benchmarks")
    if not isinstance(bs, list):
        raise GateError(f"results {path}: no 'benchmarks' list (not a pytest-benchmark JSON?)")
    return bs


def _find(benchmarks: list[dict], bench: str) -> Optional[dict]:
    for b in benchmarks:
        full = str(b.get("fullname", b.get("name", "")))
        if full == bench or (full.endswith(bench) and full[:-len(bench)].endswith("/")):
            return b
    return None


def _measured(b: Optional[dict], ratio: str) -> Optional[float]:
    if b is None:
        return None
    v = (b.get("extra_info") or {}).get(ratio)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def compare(results: dict, baseline: dict, results_path: Path = Path("results"),
            baseline_path: Path = Path("baseline")) -> list[Outcome]:
    """Every check of ``baseline`` against ``results`` (both parsed JSON)."""
    checks, tol = _checks(baseline, baseline_path)
    bs = _benchmarks(results, results_path)
    out = []
    for c in checks:
        t = float(c.get("tolerance", tol))
        hib = c["higher_is_better"]
        out.append(Outcome(c["bench"], c["ratio"], hib, float(c["baseline"]), t,
                           _measured(_find(bs, c["bench"]), c["ratio"]),
                           limit_of(float(c["baseline"]), t, hib)))
    return out


def update(results: dict, baseline: dict, results_path: Path, baseline_path: Path) -> dict:
    """The baseline with every check's value replaced by the one measured in ``results``."""
    checks, _ = _checks(baseline, baseline_path)
    bs = _benchmarks(results, results_path)
    for c in checks:
        v = _measured(_find(bs, c["bench"]), c["ratio"])
        if v is None:
            raise GateError(f"results {results_path}: no '{c['ratio']}' for {c['bench']}; "
                            f"cannot update its baseline")
        c["baseline"] = round(v, 3)
    return baseline


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="pytest-benchmark JSON (--benchmark-json)")
    p.add_argument("--baseline", type=Path, default=DEFAULT_BASELINE)
    p.add_argument("--update", action="store_true",
                   help="write the measured ratios into the baseline instead of gating")
    a = p.parse_args(argv)
    try:
        results = _load(a.results, "results")
        baseline = _load(a.baseline, "baseline")
        if a.update:
            new = update(results, baseline, a.results, a.baseline)
            a.baseline.write_text(json.dumps(new, indent=2) + "\n")
            print(f"bench_gate: {len(new['checks'])} baselines written to {a.baseline}")
            return 0
        outcomes = compare(results, baseline, a.results, a.baseline)
    except GateError as e:
        print(f"bench_gate: {e}", file=sys.stderr)
        return 2
    for o in outcomes:
        print(o.line())
    bad = [o for o in outcomes if not o.ok]
    if bad:
        print(f"bench_gate: {len(bad)} of {len(outcomes)} ratios regressed beyond tolerance",
              file=sys.stderr)
        return 1
    print(f"bench_gate: all {len(outcomes)} ratios within tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Run: .venv/bin/python bench/workloads/profile_bad_data_checks.py q4   (or q5, q7 ...)
"""How much of a Nexmark query the bad-data checks cost: the query runs in-process under cProfile
and the cumulative time of the checked arithmetic (:mod:`dbsp.algebra.checked`), the input weight
check and the step journal is summed - an upper bound, since it includes the plain arithmetic the
checked functions replace. A profile, not a benchmark: it needs no A/B against another build,
which a loaded 2-core machine makes too noisy to read at this size."""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile

from dbsp.nexmark.cli import add_arguments, run_query

CHECKS = {"checked.py": ("weighted_group_sums", "group_sums", "add_overflows", "mul_overflows"),
          "input.py": ("_accept",), "journal.py": ("use_journal", "inserted", "cleared")}


def main(query: str, events: int = 1_000_000) -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--events", str(events), "--workers", "1", "--no-progress"])
    prof = cProfile.Profile()
    prof.enable()
    run_query(query, 1, args, tempfile.mkdtemp())
    prof.disable()
    st = pstats.Stats(prof)
    spent = 0.0
    for (fn, _line, name), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore
        base = fn.rsplit("/", 1)[-1]
        if name in CHECKS.get(base, ()):
            spent += ct
            print(f"  {base}:{name} {ct * 1e3:.1f} ms cumulative ({nc} calls)")
    total = st.total_tt  # type: ignore[attr-defined]
    print(f"{query}: profiled {total:.2f} s; in the checks at most {spent * 1e3:.1f} ms "
          f"({spent / total * 100:.2f}%)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "q4")

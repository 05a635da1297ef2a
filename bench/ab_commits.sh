#!/usr/bin/env bash
# Compare two builds of dbsp on the Nexmark main job and the join + average workload, in
# interleaved rounds (a shared machine drifts; interleaving keeps the comparison fair).
#
#   bash bench/ab_commits.sh DIR_A DIR_B [ROUNDS] [OUT_DIR]
#
# DIR_A and DIR_B are checkouts (e.g. `git worktree add /tmp/a <commit>`), each with its own
# `.venv` (`bash ci/setup.sh` inside it). Every run is timed by /usr/bin/time: wall seconds and
# CPU seconds (user + sys, children included), one line per run in OUT_DIR/ab.tsv; the
# per-query rates are in OUT_DIR/nx-<side>-<round>.json, the workload's in wl-<side>-<round>.json.
set -euo pipefail
A=$(cd "$1" && pwd); B=$(cd "$2" && pwd); ROUNDS=${3:-3}; OUT=${4:-results/ab}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
printf "round\tside\twhat\twall_s\tcpu_s\n" > "$OUT/ab.tsv"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    T=$A; [ "$side" = B ] && T=$B
    /usr/bin/time -f "%e %U %S" -o "$OUT/t.txt" "$T/.venv/bin/dbsp" nexmark --events 1000000 \
        --queries q0,q1,q2,q3,q4,q5,q6,q7,q8 --workers 1 --no-progress \
        --json "$OUT/nx-$side-$r.json" > /dev/null 2>&1
    read -r e u s < "$OUT/t.txt"
    printf "%s\t%s\tnexmark\t%s\t%s\n" "$r" "$side" "$e" "$(echo "$u + $s" | bc)" >> "$OUT/ab.tsv"
    (cd "$T/bench/operators" && /usr/bin/time -f "%e %U %S" -o "$OUT/t.txt" \
        "$T/.venv/bin/python" -m pytest -q -p no:cacheprovider \
        "bench_workload.py::test_bids_auctions_workload[1-threads]" --benchmark-only \
        --benchmark-json="$OUT/wl-$side-$r.json" > /dev/null 2>&1)
    read -r e u s < "$OUT/t.txt"
    printf "%s\t%s\tworkload\t%s\t%s\n" "$r" "$side" "$e" "$(echo "$u + $s" | bc)" >> "$OUT/ab.tsv"
  done
done
cat "$OUT/ab.tsv"

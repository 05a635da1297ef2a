# Run:  python bench/workloads/paper_estimate.py [--measure] [--events 10000,100000,1000000]
"""A paper estimate of the speed-up of W workers on hosts with enough cores (issue 13's closing
note), from per-step costs measured on this 2-core machine.

The model (lockstep steps, one worker per core, every core as fast as here):

* a step of ``N`` events on one worker costs ``F + b N`` CPU seconds: ``F`` the fixed cost every
  worker pays every step whatever its rows (scheduler, empty operators, its own output), ``b``
  the cost per event of the workload (here :func:`~dbsp.testing.pipelines.join_avg`);
* with ``W`` workers each pays ``F + b N / W`` (rows spread evenly: the keys are uniform) plus
  its exchanges: ``E`` exchanges a step that really move rows (after the driver's placement),
  each costing ``(W - 1) e0`` (one message to every peer, empty or not) plus ``x`` per row it
  sends, of which it sends ``(N_x / W) (W - 1) / W`` (``N_x = f_x N`` rows reach the exchange);
* the driver is serial: per step ``d0 + d_w W`` (a request to and a reply from every worker) plus
  ``d_r N`` when the rows go through it (driver-fed), nothing per row when the workers read their
  own slices (:mod:`dbsp.runtime.slices`);
* step time ``T(W) = driver(W) + worker(W)``: the driver sends, all workers run in parallel, the
  driver gathers; a step waits for its slowest worker, taken here as the mean (no skew).

Speed-up ``S(W) = T(1) / T(W)`` on the same steps. Assumptions: no network limit (the
exchange's per-row cost as measured over loopback), no skew, no stragglers, a driver on a core
of its own, output read on the workers (not gathered: a gathered output would add a per-row
driver cost). Defaults are figures measured on this machine (see ``--measure`` and the sources
printed); the loaded 2-core machine makes every per-row figure pessimistic.
"""
from __future__ import annotations

import argparse
import sys
import time

#: measured inputs: value, and where it comes from
DEFAULTS = {
    "F": (7.0e-3, "fixed step cost, s: join + average step at 10K events is 12-13 ms of which "
                  "about 7 ms fixed (issue 13 closing note, eff4; --measure refits it)"),
    "b": (0.55e-6, "CPU s per event of join_avg on one worker ((12.5 - 7) ms / 10K; --measure "
                   "refits it)"),
    "e0": (0.110e-3, "mesh: empty exchange step per peer, s (bench_mesh.py, load 15-21)"),
    "x": (0.15e-6, "exchange, CPU s per row sent (sender and receiver): bench_input_slices.py, "
                   "all-process CPU of sliced minus driver-fed, where the bids' two exchanges "
                   "become real: 3.0 ms per step for 45K rows sent (W=2, 0.066 us) and 14.8 ms "
                   "for 61K (W=3, 0.24 us), load 7-10; bench_mesh.py's 1K-rows figure, "
                   "(3.88 - 0.11) ms / 1K = 3.8 us, is a small message's cost, not a row's"),
    "E": (1, "exchanges that move rows per step in join_avg (bids and auctions are dealt by "
             "the join key, only the re-key by category moves rows)"),
    "fx": (0.91, "rows reaching that exchange per event (the join's output: one per bid)"),
    "d0": (0.6e-3, "driver, s per step: bench_input_slices.py, sliced input, driver CPU per "
                   "step 1.9 ms at W=2 and 2.6 ms at W=3 (100K events, load 7-10)"),
    "dw": (0.65e-3, "driver, s per worker per step (one request, one reply): same runs"),
    "dr": (0.10e-6, "driver, s per event it reads, splits and sends (driver-fed only): "
                    "bench_input_slices.py, driver-fed minus sliced driver CPU, 9.1 ms (W=2) "
                    "and 11.8 ms (W=3) per 100K-event step"),
}


def measure_fb(events=(2_000, 50_000), steps: int = 8) -> tuple[float, float]:
    """Fit ``F`` and ``b`` from join_avg on one embedded worker: CPU per step at two step
    sizes (steady state, medians)."""
    import statistics

    import dbsp
    from dbsp.runtime.launcher import build_outputs
    from dbsp.testing import pipelines as P
    per = []
    for n in events:
        data = P.join_avg_steps(n, steps + 3, seed=3)
        with dbsp.Circuit() as c:
            outs = build_outputs(c, P.join_avg)
            times = []
            for i, st in enumerate(data):
                t0 = time.process_time()
                for name, b in st.items():
                    c.inputs[name].push(b)
                c.step()
                outs["avg"].to_arrow()
                if i >= 3:
                    times.append(time.process_time() - t0)
        per.append(statistics.median(times))
    (n1, n2), (t1, t2) = events, per
    b = (t2 - t1) / (n2 - n1)
    return max(t1 - b * n1, 0.0), b


def step_time(W: int, N: float, p: dict, sliced: bool) -> float:
    worker = p["F"] + p["b"] * N / W
    if W > 1:
        sent = p["fx"] * N / W * (W - 1) / W
        worker += p["E"] * ((W - 1) * p["e0"] + p["x"] * sent)
    driver = p["d0"] + p["dw"] * W + (0.0 if sliced else p["dr"] * N)
    return driver + worker


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", default="10000,100000,1000000",
                    help="events per step (comma separated)")
    ap.add_argument("--workers", default="1,2,8,32")
    ap.add_argument("--measure", action="store_true",
                    help="refit F and b from join_avg on one embedded worker first")
    for k, (v, _) in DEFAULTS.items():
        ap.add_argument(f"--{k}", type=float, default=v)
    a = ap.parse_args(argv)
    p = {k: getattr(a, k) for k in DEFAULTS}
    src = {k: s for k, (_, s) in DEFAULTS.items()}
    if a.measure:
        F, b = measure_fb()
        p["F"], p["b"] = F, b
        src["F"] = src["b"] = "measured now (--measure): join_avg, one embedded worker, CPU " \
                              "per step at 2K and 50K events, medians of 8 steps"
    print(__doc__.split("\n\n")[1])
    print("\ninputs:")
    for k in DEFAULTS:
        print(f"  {k:3s} = {p[k]:.3g}   {src[k]}")
    Ws = [int(w) for w in a.workers.split(",")]
    for sliced in (False, True):
        print(f"\nexpected speed-up T(1)/T(W), input {'read by the workers' if sliced else 'fed by the driver'}:")
        print("  events/step " + "".join(f"{'W=' + str(w):>10s}" for w in Ws) +
              "   step ms at W=1 / at W=max")
        for N in (int(x) for x in a.events.split(",")):
            t1 = step_time(1, N, p, sliced)
            row = "".join(f"{t1 / step_time(w, N, p, sliced):10.1f}" for w in Ws)
            print(f"  {N:11d} {row}   {t1 * 1e3:8.1f} / {step_time(Ws[-1], N, p, sliced) * 1e3:.1f}")
    print("\nwhat bounds it: every worker pays F whatever W, the serial driver pays d_w per "
          "worker and each worker (W - 1) e0 per exchange, so past W ~ sqrt(b N / d_w) adding "
          "workers makes a step slower; the driver's per-event cost d_r N (driver-fed input) "
          "is serial too.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

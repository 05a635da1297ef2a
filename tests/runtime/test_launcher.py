"""The launcher: a join, an aggregate and a recursive query on 2 and 3 worker processes joined
by the authenticated mesh give, step by step, the same output as the embedded runtime; workers
started by hand (``spawn=False``, as on other hosts) join the same way; a dead worker is an
error, not a hang."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

import dbsp
from dbsp.circuit.exchange import as_shard_map
from dbsp.runtime.launcher import (
    AUTH_ENV, build_outputs, launch, pipeline_spec, resolve_pipeline, serve_worker)
from dbsp.runtime.process import WorkerDied
from dbsp.runtime.socket_transport import HandshakeRefused, MeshAuth
from dbsp.testing import pipelines as P


def _views_per_step(runner, outputs: dict, steps) -> list:
    """Push each step's input into ``runner`` (a circuit or a launched job), step it, and take
    every output's view after the step."""
    got = []
    for st in steps:
        P.push_step(runner.inputs, st)
        runner.step()
        got.append({k: o.to_dict() for k, o in outputs.items()})
    return got


def _embedded(steps, workers=1):
    with dbsp.Circuit(workers=workers) as c:
        outs = build_outputs(c, P.join_agg_closure)
        return _views_per_step(c, outs, steps)


@pytest.mark.slow
@pytest.mark.parametrize("procs", [2, 3])
def test_launcher_matches_embedded(procs):
    steps = P.sample_steps(5)
    want = _embedded(steps)
    assert all(want[0][k] for k in ("join", "agg", "closure"))  # not a vacuous comparison
    with launch(P.join_agg_closure, workers=procs) as job:
        assert len(job.procs) == procs
        got = _views_per_step(job, job.outputs, steps)
        rows = job.circuit.state_rows()
        assert rows > 0
    for s, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"step {s} differs"
    assert all(p.returncode == 0 for p in job.procs) or job.procs == []


def test_launcher_shards_by_the_layout_given():
    """A layout other than the default (a map resized from 3 workers to 2, as a resumed
    checkpoint gives): the driver deals input by it and the workers' exchanges shard by it; if
    either used the default map, joined keys would miss each other."""
    steps = P.sample_steps(3)
    want = _embedded(steps)
    layout = as_shard_map(3).resize(2)
    assert layout != as_shard_map(2)
    with launch(P.join_agg_closure, workers=2, layout=layout) as job:
        assert job.circuit.layout == layout
        job.circuit.start()
        assert job.circuit._executor.call("layout") == [layout.to_dict()] * 2
        got = _views_per_step(job, job.outputs, steps)
    assert got == want


def test_workers_started_by_hand_as_on_other_hosts(tmp_path):
    """spawn=False: the caller starts ``dbsp worker`` with the job's command (here through the
    CLI, with its credentials in the environment), and the first step waits for them."""
    steps = P.sample_steps(2)
    want = _embedded(steps)
    job = launch("dbsp.testing.pipelines:join_agg_closure", workers=2, spawn=False)
    cmd = job.worker_command(1)
    assert cmd.startswith(AUTH_ENV + "=") and "--worker 1" in cmd
    env = dict(os.environ, **{AUTH_ENV: job.auth.to_text()})
    procs = [subprocess.Popen([sys.executable, "-m", "dbsp.cli", "worker", "--coordinator",
                               job.coordinator.address, "--worker", str(i)], env=env)
             for i in range(2)]
    try:
        got = _views_per_step(job, job.outputs, steps)
    finally:
        job.close()
        codes = [p.wait(timeout=30) for p in procs]
    assert got == want
    assert codes == [0, 0]


def test_worker_without_credentials_is_told_what_is_missing():
    env = {k: v for k, v in os.environ.items() if k != AUTH_ENV}
    r = subprocess.run([sys.executable, "-m", "dbsp.cli", "worker", "--coordinator",
                        "127.0.0.1:1", "--worker", "0"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and AUTH_ENV in r.stderr


def test_worker_with_a_wrong_secret_is_refused_by_the_coordinator():
    job = launch(P.join_agg_closure, workers=1, spawn=False, timeout=30)
    bad = MeshAuth(job.auth.job, job.auth.generation, b"z" * 32)
    try:
        with pytest.raises(HandshakeRefused):
            serve_worker(job.coordinator.address, bad, 0, timeout=10)
        ok = threading.Thread(target=serve_worker,
                              args=(job.coordinator.address, job.auth, 0, P.join_agg_closure))
        ok.start()
        P.push_step(job.inputs, P.sample_steps(1)[0])
        job.step()  # the real worker got in after the impostor was turned away
        assert job.outputs["join"].to_dict()
    finally:
        job.close()
        ok.join(timeout=30)


def test_a_killed_worker_is_an_error_not_a_hang():
    with launch(P.join_agg_closure, workers=2) as job:
        P.push_step(job.inputs, P.sample_steps(1)[0])
        job.step()
        pid = job.coordinator.info[1]["pid"]
        os.kill(pid, signal.SIGKILL)
        job.procs[1].wait(timeout=30)
        P.push_step(job.inputs, P.sample_steps(2)[1])
        with pytest.raises(WorkerDied):
            job.step()


def test_pipeline_names_are_checked():
    assert pipeline_spec(P.keyed_count) == "dbsp.testing.pipelines:keyed_count"
    assert resolve_pipeline("dbsp.testing.pipelines:keyed_count") is P.keyed_count
    with pytest.raises(ValueError, match="lambda"):
        pipeline_spec(lambda c: None)
    with pytest.raises(ValueError, match="module:function"):
        resolve_pipeline("no_colon")
    with pytest.raises(ValueError, match="cannot be imported"):
        resolve_pipeline("dbsp.testing.pipelines:nope")
    with dbsp.Circuit() as c, pytest.raises(TypeError, match="output handle"):
        build_outputs(c, lambda c: 42)


@pytest.mark.slow
def test_a_failed_step_on_the_launcher_is_rolled_back_and_the_circuit_goes_on():
    """A sum out of range on one worker process: the step is rolled back on both (over a new
    mesh, since the failure aborted the old one), the error names the row, and the next steps
    give the same output as the embedded runtime without the failed step."""
    from dbsp.circuit.errors import RowError

    def push(inputs, rows):
        inputs["events"].push(rows)

    good = [[(k, k) for k in range(20)] + [(100, 2 ** 62)], [(k, 1) for k in range(0, 20, 3)]]
    bad = [(100, 2 ** 62), (5, 1)]
    with dbsp.Circuit(workers=2) as c:
        outs = build_outputs(c, P.keyed_count)
        want = []
        for st in good:
            push(c.inputs, st)
            c.step()
            want.append(outs["counts"].to_dict())
    with launch(P.keyed_count, workers=2) as job:
        push(job.inputs, good[0])
        job.step()
        got = [job.outputs["counts"].to_dict()]
        push(job.inputs, bad)
        with pytest.raises(RowError, match="out of range"):
            job.step()
        assert job.coordinator.broken is None
        push(job.inputs, good[1])
        job.step()
        got.append(job.outputs["counts"].to_dict())
        assert job.outputs["counts"].view_dict() == outs["counts"].view_dict()
    assert got == want


def test_workers_with_descriptors_above_1024_still_step():
    """A process with many open files (a Spark executor) hands its mesh sockets descriptors
    >= 1024, which ``select`` cannot watch: the exchange polls instead. Two in-process workers
    of a launched job, after this process opened 1100 files, run steps over the mesh."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        if hard != resource.RLIM_INFINITY and hard < 1400:
            pytest.skip(f"the descriptor limit ({hard}) is below what the test needs")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1400, hard))
    held = [open(os.devnull, "rb") for _ in range(1100)]
    steps = P.sample_steps(3)
    want = _embedded(steps)
    job = launch(P.join_agg_closure, workers=2, spawn=False, timeout=60)
    seen: list = []
    ws = [threading.Thread(target=serve_worker, daemon=True,
                           args=(job.coordinator.address, job.auth, w, P.join_agg_closure),
                           kwargs={"on_ready": lambda: seen.append(_max_socket_fd())})
          for w in range(2)]
    try:
        for t in ws:
            t.start()
        got = _views_per_step(job, job.outputs, steps)
        assert got == want
        assert min(seen) >= 1024, seen  # the mesh really was on high descriptors
    finally:
        job.close()
        for t in ws:
            t.join(timeout=30)
        for f in held:
            f.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _max_socket_fd() -> int:
    """The highest descriptor of a socket this process holds."""
    fds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                fds.append(int(name))
        except OSError:
            pass
    return max(fds)


def test_the_launchers_driver_leaves_the_sort_to_its_workers(monkeypatch):
    """Small steps of an input read by ``index_by`` are sorted by the threads runtime's driver
    for its workers (``deal_sorted``), never by the launcher's (nor the processes runtime's):
    there every worker sorts its own part side by side, where a sort in the driver would keep
    them all waiting, all of a step's rows in one serial sort however many workers there are.
    The output is the embedded runtime's either way."""
    import dbsp.operators.input as I
    calls = []
    real = I.deal_sorted
    monkeypatch.setattr(I, "deal_sorted", lambda *a, **k: calls.append(1) or real(*a, **k))
    steps = P.sample_steps(3)
    want = _embedded(steps)
    with dbsp.Circuit(workers=2, runtime="threads") as c:  # (the split it does sort)
        outs = build_outputs(c, P.join_agg_closure)
        assert _views_per_step(c, outs, steps) == want
    assert calls, "the threads runtime's driver no longer deals sorted: this test checks nothing"
    calls.clear()
    with launch(P.join_agg_closure, workers=2) as job:
        assert _views_per_step(job, job.outputs, steps) == want
    assert not calls, f"the launcher's driver sorted {len(calls)} parts for its workers"

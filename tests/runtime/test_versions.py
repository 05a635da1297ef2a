"""Mixed-version generations: the wire protocol, the checkpoint format and the layer-file format
carry version numbers (``dbsp._version``); the coordinator refuses a worker whose formats do not
interoperate with the driver's, naming the worker, its host and both versions, while a worker of
another package version with the same formats (a rolling upgrade) runs; checkpoints in a format
this package cannot read are refused."""
from __future__ import annotations

import json
import os
import shutil
import zlib

import pyarrow as pa
import pytest

import dbsp
from dbsp import _version as V
from dbsp.api import StreamContext
from dbsp.api.expr.aggregates import count
from dbsp.checkpoint import CheckpointVersionError
from dbsp.runtime.launcher import VersionMismatch, launch, spawn_workers
from dbsp.storage import format as F
from dbsp.testing import pipelines as P


def package_copy(tmp_path, version: str, wire: tuple = (1, 1)) -> dict:
    """A copy of the package that reports ``version`` and speaks wire protocol ``wire``
    (written, oldest read); the environment that makes a worker import it."""
    src = os.path.dirname(dbsp.__file__)
    dst = tmp_path / "other" / "dbsp"
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    if not (dst / "_native").exists():  # an editable install keeps the extensions elsewhere
        import dbsp._native as native
        os.symlink(list(native.__path__)[0], dst / "_native")
    f = dst / "_version.py"
    text = f.read_text()
    old_v = f'__version__ = "{dbsp.__version__}"'
    old_w = f"WIRE_PROTOCOL, WIRE_PROTOCOL_MIN = {V.WIRE_PROTOCOL}, {V.WIRE_PROTOCOL_MIN}"
    assert old_v in text and old_w in text
    f.write_text(text.replace(old_v, f'__version__ = "{version}"')
                 .replace(old_w, f"WIRE_PROTOCOL, WIRE_PROTOCOL_MIN = {wire[0]}, {wire[1]}"))
    return {"PYTHONPATH": str(tmp_path / "other")}


def test_formats_and_their_compatibility():
    f = V.formats()
    assert f == {"wire": [V.WIRE_PROTOCOL, V.WIRE_PROTOCOL_MIN],
                 "checkpoint": [V.CHECKPOINT_FORMAT, V.CHECKPOINT_FORMAT_MIN],
                 "layer": [V.LAYER_FORMAT, V.LAYER_FORMAT_MIN]}
    assert (F.FORMAT_VERSION, F.MIN_READ_VERSION) == (V.LAYER_FORMAT, V.LAYER_FORMAT_MIN)
    assert V.incompatibility(f, dict(f)) is None
    assert V.incompatibility(f, None) is None  # a worker of before the formats: version 1
    newer = {**f, "wire": [2, 1]}  # writes 2: the older side cannot read it
    assert "wire format" in V.incompatibility(f, newer)
    assert V.incompatibility({**f, "wire": [2, 1]}, {**f, "wire": [2, 2]}) is None
    assert "one of them only" in V.incompatibility(f, {"wire": [1, 1]})


def _launch_mixed(tmp_path, env):
    job = launch(P.keyed_count, workers=2, spawn=False, timeout=60)
    procs = spawn_workers(job.coordinator.address, 2, job.auth, env=[None, env])
    return job, procs


@pytest.mark.slow
def test_a_worker_that_cannot_interoperate_is_refused(tmp_path):
    env = package_copy(tmp_path, "9.0.0", wire=(2, 2))
    job, procs = _launch_mixed(tmp_path, env)
    try:
        job.inputs["events"].push(P.keyed_events(100, 10, 1))
        with pytest.raises(VersionMismatch) as e:
            job.step()
        msg = str(e.value)
        assert "worker 1 on host 127.0.0.1 runs dbsp 9.0.0" in msg
        assert f"the driver dbsp {dbsp.__version__}" in msg and "wire format" in msg
        for p in procs:  # both workers were told, and exit instead of waiting for a mesh
            assert p.wait(timeout=60) != 0
    finally:
        job.close()
        for p in procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_another_version_with_the_same_formats_runs(tmp_path):
    env = package_copy(tmp_path, dbsp.__version__ + "+patch")
    ev = P.keyed_events(500, 20, 2)
    with dbsp.Circuit() as c:
        from dbsp.runtime.launcher import build_outputs
        outs = build_outputs(c, P.keyed_count)
        c.inputs["events"].push(ev)
        c.step()
        want = outs["counts"].to_dict()
    job, procs = _launch_mixed(tmp_path, env)
    try:
        job.inputs["events"].push(ev)
        job.step()
        assert job.outputs["counts"].to_dict() == want
        assert job.circuit.layout_info()["versions"] == [dbsp.__version__,
                                                         dbsp.__version__ + "+patch"]
    finally:
        job.close()
        for p in procs:
            p.wait(timeout=60)


def _make(d):
    ctx = StreamContext(storage=d, checkpoint_every=1)
    s = ctx.stream(pa.schema([("k", pa.int64())]), name="src")
    s.group_by("k").agg(n=count()).collect(name="agg")
    return ctx, s


def test_checkpoints_in_an_unreadable_format_are_refused(tmp_path):
    d = str(tmp_path)
    ctx, s = _make(d)
    s.push([(1,), (2,)])
    ctx.step()
    ctx.close()
    path = os.path.join(d, "checkpoints.json")
    with open(path) as f:
        doc = json.load(f)
    cat = doc["catalog"]
    assert cat["formats"] == {"checkpoint": V.CHECKPOINT_FORMAT, "layer": V.LAYER_FORMAT}
    assert cat["package"] == dbsp.__version__ and cat["checkpoints"]
    ctx, s = _make(d)  # the same format: resumes
    ctx.open()
    ctx.close()
    cat["formats"]["checkpoint"] = V.CHECKPOINT_FORMAT + 1
    cat["package"] = "9.0.0"
    body = json.dumps(cat, sort_keys=True).encode()
    with open(path, "w") as f:
        json.dump({"catalog": cat, "crc32": zlib.crc32(body)}, f)
    ctx, s = _make(d)
    with pytest.raises(CheckpointVersionError,
                       match=r"written by dbsp 9.0.0 in checkpoint format 2; this is dbsp"):
        ctx.open()
    ctx.circuit.close()

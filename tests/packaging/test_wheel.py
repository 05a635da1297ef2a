"""The binary wheel users install: a manylinux tag, self-contained, symbols kept, installs and runs
in a clean venv with no compiler, and ships to Spark executors as a packed venv (``spark.archives``).

The wheel is the one ``ci/build-wheel.sh`` makes (``ci/setup.sh`` builds it and installs the test
venv from it, so the rest of the suite tests the same artifact). ``DBSP_WHEEL`` names it; otherwise
the newest ``dist/dbsp-*-manylinux*.whl`` of the source tree is used. Without one these tests are
skipped on a developer's machine and fail in CI (``CI=true``), where the wheel must exist.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _wheel() -> Path:
    named = os.environ.get("DBSP_WHEEL")
    if named:
        return Path(named)
    found = sorted(glob.glob(str(ROOT / "dist" / "dbsp-*-manylinux*.whl")), key=os.path.getmtime)
    if found:
        return Path(found[-1])
    if os.environ.get("CI") == "true":
        pytest.fail("no repaired wheel in dist/: ci/setup.sh should have built it")
    pytest.skip("no wheel built (run: bash ci/build-wheel.sh)")


@pytest.fixture(scope="module")
def wheel() -> Path:
    return _wheel()


def _native_libs(wheel: Path, tmp: Path) -> list[Path]:
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(".so")]
        z.extractall(tmp, names)
    return [tmp / n for n in names]


def test_wheel_is_manylinux_self_contained_with_symbols(wheel, tmp_path):
    # the platform tag auditwheel gave it, not the build machine's linux_x86_64
    assert "manylinux" in wheel.name and "linux_x86_64" not in wheel.name.replace("manylinux", "")
    libs = _native_libs(wheel, tmp_path)
    names = {p.name.split(".")[0] for p in libs}
    # every extension of setup.py, io_uring reader included (liburing linked in statically)
    assert {"codes", "sort", "merge", "search", "hashing", "slab_pool", "block", "uring"} <= names
    for lib in libs:
        dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True,
                             check=True).stdout
        needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
        # only the C library (and what auditwheel grafted under dbsp.libs, which would be named
        # with a hash): no liburing.so, no compiler runtime the user must install
        assert all(n.startswith(("libc.so", "libm.so", "libpthread.so")) or "-" in n
                   for n in needed), (lib.name, needed)
        sections = subprocess.run(["readelf", "-S", str(lib)], capture_output=True, text=True,
                                  check=True).stdout
        assert ".symtab" in sections, f"{lib.name} is stripped: perf would show no symbols"


@pytest.fixture(scope="module")
def clean_venv(wheel, tmp_path_factory) -> Path:
    """A new venv, no system site-packages, the wheel installed with no compiler reachable."""
    venv = tmp_path_factory.mktemp("clean") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    env = dict(os.environ, PATH=f"{venv / 'bin'}:/usr/bin:/bin", CC="/bin/false",
               CXX="/bin/false", LDSHARED="/bin/false", PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    # --only-binary: a dependency that would need compiling fails instead of building
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--only-binary=:all:",
                    str(wheel), "venv-pack>=0.2"], check=True, env=env)
    return venv


PIPELINE = textwrap.dedent("""
    import sys, pyarrow as pa, dbsp
    from dbsp import StreamContext, sum_
    import dbsp._native.uring  # the io_uring reader, liburing linked in
    assert dbsp.__file__.startswith(sys.prefix), dbsp.__file__
    with StreamContext(workers=2) as ctx:
        s = ctx.stream(pa.schema([("k", pa.int64()), ("v", pa.int64())]), name="s")
        out = s.group_by("k").agg(t=sum_("v")).collect()
        s.insert([(1, 2), (1, 3), (2, 5)])
        ctx.step()
        print(sorted(out.view_dict()))
""")


@pytest.mark.slow
def test_wheel_installs_and_runs_without_compiler(clean_venv, tmp_path):
    out = subprocess.run([str(clean_venv / "bin" / "python"), "-c", PIPELINE], cwd=tmp_path,
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[(1, 5), (2, 5)]"


SPARK_JOB = textwrap.dedent("""
    import os, sys
    from pyspark.sql import SparkSession
    archive = sys.argv[1]
    # PySpark's documented way: executors unpack the archive in their working directory and run
    # its python (a relative path, resolved there). local-cluster starts real executor JVMs with
    # working directories of their own, as on a cluster.
    os.environ["PYSPARK_PYTHON"] = "./environment/bin/python"
    spark = (SparkSession.builder.master("local-cluster[2,1,1024]")
             .config("spark.archives", archive + "#environment")
             .config("spark.ui.enabled", "false").getOrCreate())

    def run_pipeline(batches):
        import pyarrow as pa, dbsp
        from dbsp import StreamContext, sum_
        for b in batches:
            with StreamContext(workers=1) as ctx:
                s = ctx.stream(pa.schema([("k", pa.int64()), ("v", pa.int64())]), name="s")
                out = s.group_by("k").agg(t=sum_("v")).collect()
                v = b.column(0).to_numpy()
                s.push(pa.table({"k": v % 3, "v": v}))
                ctx.step()
                rows = sorted(out.view_dict())
            yield pa.RecordBatch.from_pylist([{"exe": sys.executable, "dbsp": dbsp.__file__,
                                               "result": repr(rows)}])

    app = spark.sparkContext.applicationId
    try:
        got = spark.range(0, 12, numPartitions=2).mapInArrow(
            run_pipeline, "exe string, dbsp string, result string").collect()
    finally:
        spark.stop()
        # local-cluster executors work under $SPARK_HOME/work/<app> (not configurable there)
        import pyspark, shutil
        shutil.rmtree(os.path.join(os.path.dirname(pyspark.__file__), "work", app),
                      ignore_errors=True)
    for r in got:
        # the executors ran the unpacked archive's python and its dbsp, not the driver's
        env = r.exe[: -len("/bin/python")]
        assert r.exe.endswith("/environment/bin/python") and r.exe != sys.executable, r.exe
        assert r.dbsp.startswith(env + "/lib/"), (r.dbsp, env)
    print(sorted(r.result for r in got))
""")


@pytest.mark.slow
def test_spark_executors_run_the_packed_venv(clean_venv, tmp_path):
    pytest.importorskip("pyspark")
    archive = tmp_path / "dbsp-env.tar.gz"
    subprocess.run([str(clean_venv / "bin" / "venv-pack"), "-p", str(clean_venv), "-o",
                    str(archive), "-q"], check=True)
    job = tmp_path / "job.py"
    job.write_text(SPARK_JOB)
    out = subprocess.run([sys.executable, str(job), str(archive)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-4000:]
    # partitions 0..5 and 6..11, keyed by v % 3, summed per partition
    assert out.stdout.strip().splitlines()[-1] == repr(sorted(
        [repr([(0, 3), (1, 5), (2, 7)]), repr([(0, 15), (1, 17), (2, 19)])]))


def _spark_requirements(requires: list[str]) -> list:
    from packaging.requirements import Requirement
    return [r for r in map(Requirement, requires)
            if r.marker is not None and r.marker.evaluate({"extra": "spark"})
            and not r.marker.evaluate({"extra": ""})]


def test_spark_extra_brings_pyspark(tmp_path):
    """``pip install dbsp[spark]`` brings pyspark: the installed package's metadata (and the
    wheel's, when one is built) declares it under the ``spark`` extra, and the environment the
    tests run in (``ci/setup.sh`` installs the wheel with ``[test,spark]``) has a pyspark that
    satisfies it, so the Spark tests run instead of skipping (in CI a missing one fails)."""
    import importlib.metadata as md
    reqs = _spark_requirements(md.requires("dbsp") or [])
    assert "pyspark" in {r.name for r in reqs}, reqs
    try:
        have = md.version("pyspark")
    except md.PackageNotFoundError:
        if os.environ.get("CI") == "true":
            pytest.fail("pyspark is not installed: ci/setup.sh installs dbsp[test,spark]")
        pytest.skip("pyspark not installed (pip install dbsp[spark])")
    for r in reqs:
        if r.name == "pyspark":
            assert r.specifier.contains(have, prereleases=True), (str(r), have)
    found = sorted(glob.glob(str(ROOT / "dist" / "dbsp-*-manylinux*.whl")), key=os.path.getmtime)
    if os.environ.get("DBSP_WHEEL") or found:
        with zipfile.ZipFile(_wheel()) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode().splitlines()
        assert "Provides-Extra: spark" in lines
        shipped = _spark_requirements([ln.split(": ", 1)[1] for ln in lines
                                       if ln.startswith("Requires-Dist: ")])
        assert "pyspark" in {r.name for r in shipped}, shipped

"""The ``dbsp`` command end to end: a verified Nexmark run with JSON output, argument errors,
``dbsp storage inspect|verify`` on a good and a corrupted file, and ``dbsp info``."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from dbsp.cli.main import main
from dbsp.storage.writer import LayerFileWriter, LayerSpec


def test_nexmark_verified_run_writes_json(tmp_path, capsys):
    out = tmp_path / "r" / "nexmark.json"
    rc = main(["nexmark", "--events", "30000", "--queries", "q0,q4,q10,q12,q13",
               "--workers", "1,2", "--chunk", "7000", "--verify", "--no-progress",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    doc = json.loads(out.read_text())
    assert set(doc["queries"]) == {"q0", "q4", "q10", "q12", "q13"}
    for q, per_workers in doc["queries"].items():
        assert set(per_workers) == {"1", "2"}
        for w, r in per_workers.items():
            assert r["verified"] is True, (q, w, r.get("differences"))
            assert r["events"] == 30000 and r["workers"] == int(w)
            assert r["e2e_events_per_s"] > 0 and r["push_step_events_per_s"] > 0
            # the generator runs inside the end-to-end clock, outside push + step
            assert r["e2e_seconds"] >= r["push_step_seconds"] > 0
            assert r["peak_rss_mb"] > 0
    assert "q4" in text and "push+step" in text and "verified" in text


@pytest.mark.parametrize("generators", [0, 3])
def test_nexmark_generator_thread_or_processes(tmp_path, capsys, generators):
    """The events come from a thread of the query's process (0) or from generator processes
    through shared memory (chunks taken in event order): the result is the same, verified."""
    out = tmp_path / "g.json"
    rc = main(["nexmark", "--events", "23000", "--queries", "q1,q7", "--workers", "1",
               "--chunk", "3000", "--generators", str(generators), "--verify", "--no-progress",
               "--json", str(out)])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert doc["generators"] == generators
    for q in ("q1", "q7"):
        r = doc["queries"][q]["1"]
        assert r["verified"] is True and r["generators"] == generators
        assert r["steps"] >= 8  # 8 chunks, plus the side input's step
    assert main(["nexmark", "--generators", "-1", "--no-progress"]) == 2
    assert "--generators" in capsys.readouterr().err


def test_nexmark_peak_rss_is_the_query_process_own(tmp_path, capsys):
    """A query process starts from the fork server, not from the parent holding the events and
    the DuckDB results: its RSS does not grow with what the parent holds."""
    import numpy as np

    def run(tag):
        out = tmp_path / f"{tag}.json"
        rc = main(["nexmark", "--events", "5000", "--queries", "q2", "--workers", "1",
                   "--no-progress", "--json", str(out)])
        assert rc == 0, capsys.readouterr().err
        return json.loads(out.read_text())["queries"]["q2"]["1"]

    light = run("light")
    ballast = np.ones(400 << 20, dtype=np.uint8)  # 400 MB resident in this (parent) process
    heavy = run("heavy")
    assert ballast.sum() == ballast.nbytes
    assert heavy["start_rss_mb"] < light["start_rss_mb"] + 100
    assert heavy["peak_rss_mb"] < light["peak_rss_mb"] + 100


def test_nexmark_refuses_unknown_queries_and_bad_sizes(capsys):
    assert main(["nexmark", "--queries", "q0,q99", "--no-progress"]) == 2
    assert "q99" in capsys.readouterr().err
    assert main(["nexmark", "--events", "0", "--no-progress"]) == 2
    assert main(["nexmark", "--workers", "1,0", "--no-progress"]) == 2
    assert "positive" in capsys.readouterr().err


def _layer(path, n=5000):
    with LayerFileWriter(path, LayerSpec("u64", pa.schema([("s", pa.string())])),
                         block_size=8192, durable=False) as w:
        w.append(np.arange(n, dtype=np.uint64), [pa.array([f"v{i}" for i in range(n)])],
                 np.ones(n, np.int64))
    return path


def test_storage_inspect_and_verify(tmp_path, capsys):
    p = _layer(str(tmp_path / "a.layer"))
    assert main(["storage", "inspect", p]) == 0
    assert "5000 rows" in capsys.readouterr().out
    assert main(["storage", "verify", p]) == 0
    capsys.readouterr()
    data = bytearray(open(p, "rb").read())
    data[8192 + 100] ^= 0x10  # a bit inside the second block
    bad = tmp_path / "bad.layer"
    bad.write_bytes(bytes(data))
    assert main(["storage", "verify", str(bad)]) == 1
    err = capsys.readouterr()
    assert "bad.layer" in err.out + err.err and "offset" in err.out + err.err


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "native kernels: all" in out and "default backend" in out


def test_usage_error_exits_2():
    with pytest.raises(SystemExit) as e:
        main(["nexmark", "--events", "many"])
    assert e.value.code == 2


def test_nexmark_with_state_on_disk(tmp_path, capsys):
    store = tmp_path / "state"
    rc = main(["nexmark", "--events", "40000", "--queries", "q4,q7", "--workers", "2",
               "--chunk", "5000", "--storage", str(store), "--memory-budget", "1",
               "--verify", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert list(store.rglob("*.dbsp")), "no layer file was written under the 1 MB budget"
    assert main(["nexmark", "--memory-budget", "8", "--no-progress"]) == 2

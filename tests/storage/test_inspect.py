"""inspect_file / verify_file / the CLI entry points (``src/dbsp/storage/inspect.py``)."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from dbsp.storage.inspect import inspect_file, main_inspect, main_verify, verify_file
from dbsp.storage.writer import LayerFileWriter, LayerSpec


def make(path, n=20000, **kw):
    with LayerFileWriter(path, LayerSpec("u64", pa.schema([("s", pa.string())])),
                         block_size=8192, durable=False, metadata={"who": "test"}, **kw) as w:
        w.append(np.arange(n, dtype=np.uint64), [pa.array([str(i) for i in range(n)])],
                 np.ones(n, np.int64))
    return path


def test_inspect_describes_the_file(tmp_path, capsys):
    p = make(str(tmp_path / "a.layer"), compression="lz4")
    d = inspect_file(p)
    assert d["layers"][0]["rows"] == 20000 and d["compression"] == "lz4"
    assert d["sizes"]["file"] == os.path.getsize(p)
    assert [s["role"] for s in d["streams"]] == ["codes", "column", "weights"]
    assert d["filter"]["keys"] == 20000 and d["filter"]["expected_fpr"] < 2e-4
    assert d["metadata"] == {"who": "test"}
    json.dumps(d)
    assert main_inspect([p]) == 0
    assert "layer 0: 20000 rows" in capsys.readouterr().out
    assert main_inspect([p, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 1
    assert main_inspect([str(tmp_path / "missing")]) == 1


def test_verify_good_and_bad(tmp_path, capsys):
    p = make(str(tmp_path / "b.layer"))
    assert verify_file(p) == []
    assert main_verify([p]) == 0
    raw = bytearray(open(p, "rb").read())
    raw[5 * 4096 + 77] ^= 0x10
    raw[9 * 4096 + 5] ^= 0x01
    q = str(tmp_path / "c.layer")
    open(q, "wb").write(raw)
    probs = verify_file(q)
    assert [pr.offset for pr in probs][:2] == [5 * 4096, 9 * 4096 - (9 * 4096) % 8192] or \
        probs[0].offset == 5 * 4096 - (5 * 4096) % 8192
    assert main_verify([q]) == 1
    assert q in capsys.readouterr().err

"""Inspect and verify layer files (the ``dbsp storage inspect|verify`` commands).

* :func:`inspect_file` -- what a file holds: layers, streams (rows, blocks, index depth, bytes),
  Bloom filter, sizes, format version and features, user metadata. Reads only the trailer.
* :func:`verify_file` -- reads every block: each checksum, each index entry against the block it
  points to (stream, first row, row count, level), that children tile their parent's rows, and
  that the blocks tile the whole file. Returns the problems found, first by file offset.
* :func:`main_inspect` / :func:`main_verify` -- CLI entry points returning an exit code
  (verify: 1 and the file and offset of the first bad block). ``verify`` takes directories too:
  every layer file below one (found by its magic bytes, whatever its name) is verified, other
  files are counted and skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from . import format as F
from .format import HEADER_SIZE, StorageError
from .._native import block as _nb
from .reader import read_metadata

__all__ = ["Problem", "inspect_file", "verify_file", "main_inspect", "main_verify"]


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a file: where (byte offset of the block) and what."""

    offset: int
    path: str
    what: str

    def __str__(self):
        return f"{self.path}: offset {self.offset}: {self.what}"


def inspect_file(path) -> dict:
    """A JSON-able description of a layer file (from its trailer)."""
    path = os.fspath(path)
    m = read_metadata(path)
    streams = []
    for sid, s in enumerate(m["streams"]):
        streams.append({
            "id": sid, "layer": s["layer"], "role": s["role"], "name": s["name"],
            "layout": s["phys"]["kind"], "itemsize": s["phys"]["itemsize"],
            "offset_width": s["phys"]["offset_width"], "nullable": s["nullable"],
            "type": s.get("arrow_type"), "rows": s["rows"], "data_blocks": s["blocks"],
            "index_blocks": s["index_blocks"], "index_depth": s["depth"],
            "bytes_raw": s["bytes_raw"], "bytes_on_disk": s["bytes_stored"],
        })
    layers = []
    for li, L in enumerate(m["layers"]):
        schema = F.schema_from_b64(L["schema"]) if L["schema"] else None
        layers.append({
            "layer": li, "rows": L["rows"], "code": L["code"], "ordered": L["ordered"],
            "columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                        for f in schema] if schema is not None else [],
            "weights": L["weights"] is not None,
        })
    filt = m.get("filter")
    fdesc = None
    if filt:
        fdesc = {"keys": filt["keys"], "bytes": filt["words"] * 8, "k": filt["k"],
                 "bits_per_key": round(filt["words"] * 64 / max(filt["keys"], 1), 2),
                 "target_fpr": filt["target_fpr"],
                 "expected_fpr": F.bloom_fpr(filt["words"] * 64 / max(filt["keys"], 1),
                                             filt["k"]),
                 "offset": filt["offset"]}
    blocks = sum(s["data_blocks"] + s["index_blocks"] for s in streams)
    data_bytes = sum(s["bytes_on_disk"] for s in streams)
    return {
        "path": path, "version": m["version"], "block_size": m["block_size"],
        "checksum": m["checksum"], "compression": m["compression"],
        "features": {"incompat": m["incompat"], "compat": m["compat"]},
        "layers": layers, "streams": streams, "filter": fdesc,
        "blocks": blocks + (1 if filt else 0) + 1,
        "sizes": {"file": m["file_size"], "streams": data_bytes,
                  "filter": filt["extent"] if filt else 0, "trailer": m["trailer_extent"]},
        "metadata": m.get("metadata", {}),
    }


def verify_file(path, max_problems: int = 100) -> list:
    """Every problem of the file, sorted by offset (empty: the file is good)."""
    path = os.fspath(path)
    problems: list = []
    try:
        m = read_metadata(path)
    except F.CorruptBlockError as e:
        return [Problem(e.offset, path, e.reason)]
    except (StorageError, OSError, ValueError) as e:
        return [Problem(0, path, str(e))]
    size = m["file_size"]
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    covered: list = [(m["trailer_offset"], m["trailer_extent"], "trailer")]

    def add(off, what):
        problems.append(Problem(int(off), path, what))

    def read_block(off, ext, kind_name):
        if off % F.BLOCK_ALIGN or ext % F.BLOCK_ALIGN or ext <= 0 or off + ext > size:
            add(off, f"{kind_name} block extent ({off}, {ext}) is outside the file or unaligned")
            return None
        b = os.pread(fd, ext, off)
        code = _nb.verify_block(b, ext)
        if code:
            add(off, f"{kind_name} block: {F.verify_reason(code)}")
            return None
        return b

    try:
        filt = m.get("filter")
        if filt:
            covered.append((filt["offset"], filt["extent"], "filter"))
            b = read_block(filt["offset"], filt["extent"], "filter")
            if b is not None:
                h = F.BlockHeader.parse(b)
                if h.kind != F.KIND_FILTER or h.aux != filt["words"]:
                    add(filt["offset"], "filter block does not match the trailer")
        for sid, s in enumerate(m["streams"]):
            if len(problems) >= max_problems:
                break
            if not s["root"]:
                if s["rows"]:
                    add(m["trailer_offset"], f"stream {sid} has {s['rows']} rows but no index")
                continue
            n_data = [0]
            _verify_node(read_block, add, covered, sid, s, s["root"][0], s["root"][1], 0,
                         s["rows"], s["depth"], n_data)
            if n_data[0] != s["blocks"]:
                add(s["root"][0], f"stream {sid} ({s['name']}): index reaches {n_data[0]} data "
                                  f"blocks, trailer says {s['blocks']}")
        # the blocks must tile the file exactly
        covered.sort()
        pos = 0
        for off, ext, what in covered:
            if off > pos:
                add(pos, f"{off - pos} bytes at [{pos}, {off}) belong to no block")
            elif off < pos:
                add(off, f"{what} block at {off} overlaps the previous block")
            pos = max(pos, off + ext)
        if pos != size:
            add(pos, f"blocks end at {pos}, file is {size} B")
    finally:
        os.close(fd)
    return sorted(problems)[:max_problems]


def _verify_node(read_block, add, covered, sid, s, off, ext, first_row, rows, level, n_data):
    covered.append((off, ext, "index"))
    b = read_block(off, ext, f"stream {sid} index")
    if b is None:
        return
    h = F.BlockHeader.parse(b)
    if h.kind != F.KIND_INDEX or h.stream != sid or h.level != level or \
            h.first_row != first_row or h.aux != rows or h.n == 0:
        add(off, f"stream {sid} index block does not match its parent (kind {h.kind}, stream "
                 f"{h.stream}, level {h.level}/{level}, rows {h.first_row}+{h.aux} vs "
                 f"{first_row}+{rows})")
        return
    n = h.n
    first = np.frombuffer(b, "<u8", n, HEADER_SIZE + h.bufs[0]).astype(np.int64)
    offs = np.frombuffer(b, "<u8", n, HEADER_SIZE + h.bufs[1]).astype(np.int64)
    exts = np.frombuffer(b, "<u4", n, HEADER_SIZE + h.bufs[2]).astype(np.int64)
    if first[0] != first_row or (n > 1 and not bool(np.all(first[1:] > first[:-1]))) or \
            first[-1] >= first_row + rows:
        add(off, f"stream {sid} index block: children do not tile rows "
                 f"[{first_row}, {first_row + rows})")
        return
    end = first_row + rows
    for k in range(n):
        c0 = int(first[k])
        c1 = int(first[k + 1]) if k + 1 < n else end
        if level == 1:
            n_data[0] += 1
            covered.append((int(offs[k]), int(exts[k]), "data"))
            d = read_block(int(offs[k]), int(exts[k]), f"stream {sid} data")
            if d is None:
                continue
            dh = F.BlockHeader.parse(d)
            if dh.kind != F.KIND_DATA or dh.stream != sid or dh.first_row != c0 or \
                    dh.n != c1 - c0:
                add(int(offs[k]), f"stream {sid} data block does not match the index (rows "
                                  f"{dh.first_row}+{dh.n} vs {c0}+{c1 - c0})")
            elif HEADER_SIZE + dh.stored > int(exts[k]):
                add(int(offs[k]), f"stream {sid} data block payload overruns its extent")
        else:
            _verify_node(read_block, add, covered, sid, s, int(offs[k]), int(exts[k]), c0,
                         c1 - c0, level - 1, n_data)


# --------------------------------------------------------------------------- CLI

def main_inspect(argv: Optional[Sequence[str]] = None) -> int:
    """``dbsp storage inspect FILE...``: print what each layer file holds."""
    ap = argparse.ArgumentParser(prog="dbsp storage inspect",
                                 description="Describe dbsp layer files (reads the trailer).")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args(argv)
    rc = 0
    out = []
    for p in a.files:
        try:
            d = inspect_file(p)
        except (StorageError, OSError) as e:
            print(f"error: {e}", file=sys.stderr)
            rc = 1
            continue
        if a.json:
            out.append(d)
            continue
        print(f"{d['path']}: format v{d['version']}, {d['sizes']['file']} B, {d['blocks']} blocks "
              f"of up to {d['block_size'] // 1024} KiB, checksum {d['checksum']}, "
              f"compression {d['compression'] or 'none'}")
        for L in d["layers"]:
            cols = ", ".join(f"{c['name']}: {c['type']}{'?' if c['nullable'] else ''}"
                             for c in L["columns"])
            print(f"  layer {L['layer']}: {L['rows']} rows, {L['code']} codes"
                  f"{', ordered' if L['ordered'] else ''}{', weights' if L['weights'] else ''}"
                  f"{'; ' + cols if cols else ''}")
        for s in d["streams"]:
            print(f"    stream {s['id']:>3} {s['role']:<7} {s['name']:<16} {s['layout']:<5} "
                  f"rows={s['rows']:<10} blocks={s['data_blocks']:<7} depth={s['index_depth']} "
                  f"disk={s['bytes_on_disk']}")
        f = d["filter"]
        if f:
            print(f"  bloom filter: {f['keys']} keys, {f['bytes']} B, {f['bits_per_key']} bits/key,"
                  f" k={f['k']}, expected FPR {f['expected_fpr']:.2e}")
    if a.json:
        print(json.dumps(out if len(out) != 1 else out[0], indent=2))
    return rc


LOCK_NAME = "LOCK"  # the storage directory's lock file (dbsp.storage.lock)


def layer_files_below(directory: str) -> tuple[list[str], int]:
    """``(every layer file below directory, sorted; how many other files were seen)``. A layer
    file is recognised by the magic of its first block header, not by its name."""
    found, skipped = [], 0
    for root, dirs, names in os.walk(directory):
        dirs.sort()
        for n in sorted(names):
            path = os.path.join(root, n)
            if not os.path.isfile(path) or (n == LOCK_NAME and root == directory):
                continue  # (the directory's lock file, dbsp.storage.lock, is no stray file)
            try:
                with open(path, "rb") as f:
                    head = f.read(len(F.MAGIC))
            except OSError:
                head = b""
            if head == F.MAGIC:
                found.append(path)
            else:
                skipped += 1
    return found, skipped


def main_verify(argv: Optional[Sequence[str]] = None) -> int:
    """``dbsp storage verify FILE...``: check every block; exit 1 naming the first bad one."""
    ap = argparse.ArgumentParser(prog="dbsp storage verify",
                                 description="Verify every checksum and index bound of dbsp "
                                             "layer files.")
    ap.add_argument("files", nargs="+", help="layer files, or directories to walk")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    a = ap.parse_args(argv)
    rc = 0
    files: list[str] = []
    for p in a.files:
        if os.path.isdir(p):
            found, skipped = layer_files_below(p)
            if not a.quiet:
                print(f"{p}: {len(found)} layer file(s), {skipped} other file(s) skipped")
            files.extend(found)
        else:
            files.append(p)
    for p in files:
        probs = verify_file(p)
        if probs:
            rc = 1
            first = probs[0]
            print(f"{first.path}: first bad block at offset {first.offset}: {first.what}",
                  file=sys.stderr)
            for q in probs[1:]:
                print(f"  also: {q}", file=sys.stderr)
        elif not a.quiet:
            print(f"{p}: OK")
    return rc

# Run:  python bench/workloads/callgrind_mesh.py [--exchanges 300]
#       (A/B: the same with PYTHONPATH=<other tree>/src; needs gcc and valgrind's headers)
"""Instructions of one mesh exchange and of one control message, the launcher's per-message
cost (issue 14), under callgrind.

* ``exchange``: two processes over a socketpair (:func:`socketpair_mesh`, the transport of the
  ``processes`` runtime and, over TCP, of the launcher) swap join_avg's aggregate part, a
  (4, 51) u64 array and a small tuple, ``--exchanges`` times; counted: worker 0's side (encode,
  send, blocking receive, decode);
* ``step`` / ``outputs``: a step's input for one worker (a Z-set of 4,500 bids and one of 450
  auctions) and a worker's outputs (a sorted part of 50 averages) sent and received over a
  socketpair in one process (both ends counted), ``--messages`` times.

Printed: instructions a message. Measured (branch lau12; old main -> native skeleton walk ->
one-peer fast path): exchange 132.6K -> 78.5K -> 69.9K.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "operators"))


def _exchange(n: int) -> None:
    import numpy as np
    from callgrind_step import _helper
    from dbsp.runtime.socket_transport import SocketTransport, socketpair_mesh
    cg = _helper()
    mesh = socketpair_mesh(2)
    pid = os.fork()
    w = 0 if pid else 1
    for v, socks in enumerate(mesh):
        if v != w:
            for s in socks.values():
                s.close()
    t = SocketTransport(w, mesh[w], 2)
    part = (np.arange(4 * 51, dtype=np.uint64).reshape(4, 51), ((8, True, False),))
    for _ in range(50):
        t.exchange(w, [part, part])
    if w == 0:
        cg.cg_mark(b"start:exchange")
        cg.cg_on()
    for _ in range(n):
        t.exchange(w, [part, part])
    if w == 0:
        cg.cg_off()
    if pid:
        os.waitpid(pid, 0)
    else:
        os._exit(0)


def _messages(n: int) -> None:
    import pyarrow as pa
    from callgrind_step import _helper
    from dbsp.operators.output import SortedPart
    from dbsp.runtime import wire_types  # noqa: F401
    from dbsp.storage import wire
    from dbsp.testing import pipelines as P
    from dbsp.trace.batch import ZSet
    from dbsp.algebra.codes import codec_for
    import numpy as np
    cg = _helper()
    st = P.join_avg_steps(10_000, 2)[1]
    half = {k: b.slice(0, b.num_rows // 2) for k, b in st.items()}
    step = ("step", {0: ZSet(half["auctions"], np.ones(half["auctions"].num_rows, np.int64)),
                     1: ZSet(half["bids"], np.ones(half["bids"].num_rows, np.int64))})
    avg = pa.record_batch({"category": np.arange(50, dtype=np.int64),
                           "avg_price": np.arange(50, dtype=np.float64)})
    outs = ("ok", {9: SortedPart(avg, np.ones(50, np.int64), codec_for(avg.schema), 1)})
    a, b = socket.socketpair()
    for name, msg in (("step", step), ("outputs", outs)):
        for _ in range(20):
            wire.send(a, msg)
            wire.recv(b)
        cg.cg_mark(f"start:{name}".encode())
        cg.cg_on()
        for _ in range(n):
            wire.send(a, msg)
            wire.recv(b)
        cg.cg_off()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exchanges", type=int, default=300)
    ap.add_argument("--messages", type=int, default=200)
    ap.add_argument("--inner", default="")
    a = ap.parse_args()
    if a.inner == "exchange":
        return _exchange(a.exchanges)
    if a.inner == "messages":
        return _messages(a.messages)
    out = tempfile.mkdtemp(prefix="dbsp-cgm-")
    for what, n in (("exchange", a.exchanges), ("messages", a.messages)):
        subprocess.run(["valgrind", "-q", "--tool=callgrind", "--collect-atstart=no",
                        f"--callgrind-out-file={out}/{what}.%p", sys.executable, __file__,
                        "--inner", what, f"--exchanges={a.exchanges}",
                        f"--messages={a.messages}"], check=True)
    res = {}
    for f in sorted(os.listdir(out), key=lambda f: [int(x) if x.isdigit() else x
                                                    for x in f.replace(".", " ").split()]):
        txt = open(os.path.join(out, f)).read()
        tot = int(next(line.split()[1] for line in txt.splitlines()
                       if line.startswith("totals:")))
        if tot:
            res.setdefault(f.split(".")[0], []).append(tot)
    ex = res.get("exchange", [0])
    print(f"exchange (worker 0's side):    {max(ex) / a.exchanges:10,.0f} instructions")
    msgs = res.get("messages", [])
    for name, tot in zip(("step input", "outputs"), msgs):
        print(f"{name + ' (send + receive):':30s} {tot / a.messages:10,.0f} instructions")


if __name__ == "__main__":
    main()

"""The socket transport: exchanges of any size in both directions at once never deadlock,
arrive intact and in step, and a vanished peer is reported."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from dbsp.circuit.exchange import TransportAborted
from dbsp.runtime.socket_transport import MeshAuth, SocketTransport, socketpair_mesh, tcp_mesh


def _run_workers(transports, fn):
    results, errors = [None] * len(transports), []

    def run(i):
        try:
            results[i] = fn(i, transports[i])
        except BaseException as e:  # reported below
            errors.append(e)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(transports))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in ts), "an exchange hung"
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("workers", [2, 3])
def test_large_parts_both_ways_at_once(workers):
    mesh = socketpair_mesh(workers)
    transports = [SocketTransport(w, mesh[w], workers) for w in range(workers)]
    n = 2_000_000  # 16 MB per part, far above any socket buffer

    def fn(i, t):
        got = []
        for rnd in range(3):
            parts = [np.full(n, i * 100 + j + rnd, dtype=np.int64) for j in range(workers)]
            recv = t.exchange(i, parts)
            got.append([int(r[0]) for r in recv] + [len(r) for r in recv])
        return got

    res = _run_workers(transports, fn)
    for i in range(workers):
        for rnd in range(3):
            assert res[i][rnd][:workers] == [src * 100 + i + rnd for src in range(workers)]
            assert res[i][rnd][workers:] == [n] * workers
    for t in transports:
        t.close()


def test_two_workers_small_one_way_large_the_other():
    """Two workers: the one whose small part is sent at once waits for the peer's large part
    in a blocking receive, while the peer is still pushing it through the socket buffer; parts
    of every size in between, and empty ones, arrive intact and in step."""
    mesh = socketpair_mesh(2)
    transports = [SocketTransport(w, mesh[w], 2) for w in range(2)]
    sizes = [0, 1, 7, 1000, 300_000, 2_000_000]

    def fn(i, t):
        got = []
        for rnd, n in enumerate(sizes):
            mine = np.arange(n if i == rnd % 2 else 3, dtype=np.int64) + rnd
            recv = t.exchange(i, [mine, mine])
            other = recv[1 - i]
            got.append((len(other), int(other.sum())))
        return got

    res = _run_workers(transports, fn)
    for i in range(2):
        for rnd, n in enumerate(sizes):
            m = n if (1 - i) == rnd % 2 else 3
            assert res[i][rnd] == (m, int((np.arange(m, dtype=np.int64) + rnd).sum()))
    for t in transports:
        t.close()


def test_tcp_mesh_on_loopback():
    import socket
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    addrs = [f"127.0.0.1:{s.getsockname()[1]}" for s in listeners]
    transports = [None, None]
    auth = MeshAuth.new()

    def connect(i):
        transports[i] = tcp_mesh(i, addrs, auth, listener=listeners[i], timeout=20)

    ts = [threading.Thread(target=connect, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    res = _run_workers(transports, lambda i, t: t.all_gather(i, {"worker": i}))
    assert res == [[{"worker": 0}, {"worker": 1}]] * 2
    for t in transports:
        t.close()


def test_vanished_peer_is_reported():
    mesh = socketpair_mesh(2)
    t0 = SocketTransport(0, mesh[0], 2)
    t1 = SocketTransport(1, mesh[1], 2)
    t1.close()
    with pytest.raises(TransportAborted):
        t0.exchange(0, [b"x", b"y"])


def test_a_slice_travels_without_its_parent():
    import pyarrow as pa

    from dbsp.storage import wire
    big = pa.record_batch({"x": np.arange(1_000_000, dtype=np.int64),
                           "s": pa.array([f"row{i}" for i in range(1_000_000)])})
    part = big.slice(250_000, 1000)
    frames = wire.dumps(part)
    size = sum(memoryview(f).cast("B").nbytes for f in frames)
    assert size < 100_000  # the slice's rows, not the 15 MB parent
    back = wire.loads(b"".join(bytes(memoryview(f).cast("B")) for f in frames))
    assert back.equals(part)

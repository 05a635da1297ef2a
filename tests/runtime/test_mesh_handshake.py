"""The mesh admits only workers of one job and generation: a wrong secret, another job, an old
generation, garbage bytes and a half-open connection are refused and logged, and the real peers
still form the mesh around them."""
from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from dbsp.runtime.socket_transport import (
    HandshakeRefused, MeshAuth, accept_peers, handshake_dial, tcp_mesh)


def _listeners(n):
    ls = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    return ls, [f"127.0.0.1:{s.getsockname()[1]}" for s in ls]


def _mesh(addrs, listeners, auths, timeout=20):
    out, errs = [None] * len(addrs), [None] * len(addrs)

    def run(i):
        try:
            out[i] = tcp_mesh(i, addrs, auths[i], listener=listeners[i], timeout=timeout)
        except BaseException as e:  # inspected by the test
            errs[i] = e

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(addrs))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=timeout + 10)
    assert not any(t.is_alive() for t in ts)
    return out, errs


def _gather_all(transports):
    res = [None] * len(transports)

    def run(i):
        res[i] = transports[i].all_gather(i, i * 10)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(transports))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=30)
    return res


def test_three_workers_form_an_authenticated_mesh():
    auth = MeshAuth.new()
    listeners, addrs = _listeners(3)
    ts, errs = _mesh(addrs, listeners, [auth] * 3)
    assert errs == [None] * 3
    assert _gather_all(ts) == [[0, 10, 20]] * 3
    for t in ts:
        t.close()


def _intruder_then_real(intrude, caplog, handshake_timeout=5.0):
    """Worker 0 listens for worker 1; ``intrude(addr)`` connects first, then the real worker 1
    dials. Returns worker 1's transport and the refusal log lines."""
    auth = MeshAuth.new(generation=3)
    listeners, addrs = _listeners(2)
    result = {}

    def acceptor():
        result["t0"] = tcp_mesh(0, addrs, auth, listener=listeners[0], timeout=20,
                                handshake_timeout=handshake_timeout)

    listeners[1].close()
    th = threading.Thread(target=acceptor)
    with caplog.at_level(logging.WARNING, logger="dbsp.mesh"):
        th.start()
        intrude(addrs[0], auth)
        time.sleep(0.2)
        real = socket.create_connection(("127.0.0.1", int(addrs[0].rsplit(":", 1)[1])))
        handshake_dial(real, auth, 1)
        th.join(timeout=30)
    assert not th.is_alive()
    assert set(result["t0"].peers) == {1}
    result["t0"].close()
    real.close()
    return [r.getMessage() for r in caplog.records if r.name == "dbsp.mesh"]


def _dial(addr, auth, worker=1):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    try:
        handshake_dial(s, auth, worker, timeout=5)
    finally:
        s.close()


def test_wrong_secret_is_refused_and_logged(caplog):
    def intrude(addr, auth):
        bad = MeshAuth(auth.job, auth.generation, b"x" * 32)
        with pytest.raises(HandshakeRefused, match="secret"):
            _dial(addr, bad)
    logs = _intruder_then_real(intrude, caplog)
    assert any("wrong secret" in m for m in logs), logs


def test_other_job_is_refused(caplog):
    def intrude(addr, auth):
        with pytest.raises(HandshakeRefused, match="wrong job"):
            _dial(addr, MeshAuth(b"j" * 16, auth.generation, auth.secret))
    logs = _intruder_then_real(intrude, caplog)
    assert any("wrong job" in m for m in logs), logs


def test_old_generation_is_refused(caplog):
    def intrude(addr, auth):  # a zombie of the generation before: same job, same secret
        with pytest.raises(HandshakeRefused, match="old generation 2"):
            _dial(addr, MeshAuth(auth.job, auth.generation - 1, auth.secret))
    logs = _intruder_then_real(intrude, caplog)
    assert any("old generation 2" in m for m in logs), logs


def test_garbage_bytes_are_refused(caplog):
    def intrude(addr, auth):
        host, port = addr.rsplit(":", 1)
        s = socket.create_connection((host, int(port)))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + b"\0" * 64)
        time.sleep(0.2)
        s.close()
    logs = _intruder_then_real(intrude, caplog)
    assert any("garbage" in m for m in logs), logs


def test_half_open_connection_is_refused_without_holding_up_the_mesh(caplog):
    held = []

    def intrude(addr, auth):  # connects, says nothing, never closes
        host, port = addr.rsplit(":", 1)
        held.append(socket.create_connection((host, int(port))))
    t0 = time.monotonic()
    _intruder_then_real(intrude, caplog, handshake_timeout=0.5)
    assert time.monotonic() - t0 < 5  # the real peer did not wait behind it
    time.sleep(0.6)
    held[0].close()


def test_half_open_connection_is_logged(caplog):
    auth = MeshAuth.new()
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    held = socket.create_connection(("127.0.0.1", port))
    with caplog.at_level(logging.WARNING, logger="dbsp.mesh"):
        with pytest.raises(TimeoutError, match="0 of 1"):
            accept_peers(lst, auth, lambda w: None, 1, time.monotonic() + 1.0,
                         handshake_timeout=0.3)
    held.close()
    lst.close()
    assert any("half-open" in r.getMessage() for r in caplog.records)


def test_impostor_cannot_take_a_worker_id_from_the_real_one(caplog):
    """A wrong-secret dialer claiming worker 1 must not stop the real worker 1 joining."""
    def intrude(addr, auth):
        with pytest.raises(HandshakeRefused):
            _dial(addr, MeshAuth(auth.job, auth.generation, b"y" * 32), worker=1)
    _intruder_then_real(intrude, caplog)


def test_credentials_round_trip_and_hide_the_secret():
    a = MeshAuth.new(generation=7)
    assert MeshAuth.from_text(a.to_text()) == a
    assert a.secret.hex() not in repr(a)
    assert a.next_generation().generation == 8
    with pytest.raises(ValueError, match="job:generation:secret"):
        MeshAuth.from_text("nonsense")

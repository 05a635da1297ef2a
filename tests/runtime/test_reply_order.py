"""The driver reads the workers' replies starting with the one that answered last the time
before (:func:`dbsp.runtime.process.reply_order`): one sleep a request instead of one for every
worker that answers after the one before it; replies still come back in worker order and a dead
worker is still reported."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from dbsp.runtime.launcher import Coordinator
from dbsp.runtime.process import WorkerDied, arrived, reply_order
from dbsp.runtime.socket_transport import MeshAuth
from dbsp.storage import wire


def test_reply_order():
    assert reply_order({0: None, 1: None, 2: None}, None) == [0, 1, 2]
    assert reply_order({0: None, 1: None, 2: None}, 2) == [2, 0, 1]
    assert reply_order({0: None, 1: None, 2: None}, 0) == [0, 1, 2]
    assert reply_order({0: None, 1: None}, 5) == [0, 1]  # a worker no longer there
    assert reply_order({3: None}, 3) == [3]


def test_arrived():
    a, b = socket.socketpair()
    try:
        assert not arrived(b)
        a.send(b"x")
        assert arrived(b)
        assert arrived(b)  # a peek: still there
        assert b.recv(1) == b"x"
        assert not arrived(b)
        a.close()
        assert arrived(b)  # the peer is gone: the read says so
    finally:
        b.close()


@pytest.fixture
def coordinator():
    co = Coordinator(2, MeshAuth.new())
    pairs = [socket.socketpair() for _ in range(2)]
    co.ctrl = {w: p[0] for w, p in enumerate(pairs)}
    try:
        yield co, [p[1] for p in pairs]
    finally:
        co._listener.close()
        for p in pairs:
            for s in p:
                s.close()


def test_coordinator_reads_the_late_worker_first(coordinator):
    co, workers = coordinator

    def reply(w: int, value, delay: float) -> threading.Thread:
        def run():
            time.sleep(delay)
            wire.send(workers[w], ("ok", value))
        t = threading.Thread(target=run)
        t.start()
        return t

    # worker 1 answers late: found missing after worker 0's reply, read first next time
    t = reply(0, "a", 0.0), reply(1, "b", 0.2)
    assert co._replies() == ["a", "b"]
    for x in t:
        x.join()
    assert co._late == 1
    assert reply_order(co.ctrl, co._late) == [1, 0]
    # read first and answering last: no change; the replies still in worker order
    t = reply(0, "c", 0.0), reply(1, "d", 0.1)
    assert co._replies() == ["c", "d"]
    for x in t:
        x.join()
    assert co._late == 1
    # now worker 0 is the late one
    t = reply(1, "e", 0.0), reply(0, "f", 0.2)
    assert co._replies() == ["f", "e"]
    for x in t:
        x.join()
    assert co._late == 0


def test_coordinator_reports_a_dead_worker_read_later(coordinator):
    co, workers = coordinator
    co._late = 1
    wire.send(workers[1], ("ok", 1))
    workers[0].close()  # worker 0 died
    with pytest.raises(WorkerDied, match="worker 0"):
        co._replies()

"""A transport over a full mesh of connected sockets (between processes or hosts).

Every pair of workers shares one non-blocking stream socket. An exchange sends to and receives
from all peers in one ``select`` loop (incremental :class:`~dbsp.storage.wire.Sender` /
:class:`~dbsp.storage.wire.Receiver`), so two workers sending large parts to each other at the
same time can never deadlock on full socket buffers, and no thread hand-off sits on the path.
Messages carry the exchange's sequence number; all workers call :meth:`exchange` in the same
order (identical circuits in lockstep), and a mismatch is reported as a protocol error.

:func:`socketpair_mesh` builds the mesh for forked worker processes on one machine;
:func:`tcp_mesh` builds it between hosts from a list of ``host:port`` addresses (the Spark
launcher's rendezvous hands that list to every worker).
"""
from __future__ import annotations

import select
import socket
import time
from typing import Any, Optional, Sequence

from ..circuit.exchange import TransportAborted
from ..storage import wire

class SocketTransport:
    def __init__(self, worker: int, peers: dict[int, socket.socket], workers: int):
        self.worker = worker
        self.workers = workers
        self.peers = peers
        self.seq = 0
        self.bytes_sent = 0
        self._aborted = False
        for s in peers.values():
            s.setblocking(False)

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        if worker != self.worker:
            raise ValueError(f"transport of worker {self.worker} called as worker {worker}")
        if self._aborted:
            raise TransportAborted("transport aborted")
        seq = self.seq
        self.seq += 1
        out: list[Any] = [None] * self.workers
        out[self.worker] = parts[self.worker]
        sending = {}
        for p, sock in self.peers.items():
            snd = wire.Sender(sock, (seq, parts[p]))
            self.bytes_sent += snd.nbytes
            sending[sock] = snd
        receiving = {sock: (p, wire.Receiver(sock)) for p, sock in self.peers.items()}
        try:
            for sock in list(sending):  # most messages fit the socket buffer: no select needed
                if sending[sock].pump():
                    del sending[sock]
            while receiving or sending:
                r, w, _ = select.select(list(receiving), list(sending), [])
                for sock in w:
                    if sending[sock].pump():
                        del sending[sock]
                for sock in r:
                    p, rcv = receiving[sock]
                    if rcv.feed():
                        del receiving[sock]
                        got_seq, value = rcv.value()
                        if got_seq != seq:
                            raise RuntimeError(
                                f"exchange out of step: worker {p} sent #{got_seq}, expected "
                                f"#{seq} (circuits differ between workers?)")
                        out[p] = value
        except (OSError, wire.WireError) as e:
            self._aborted = True
            raise TransportAborted(f"a peer of worker {self.worker} is gone ({e})") from None
        return out

    def all_gather(self, worker: int, value: Any) -> list[Any]:
        return self.exchange(worker, [value] * self.workers)

    def abort(self) -> None:
        self._aborted = True
        self.close()

    def close(self) -> None:
        for s in self.peers.values():
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def socketpair_mesh(workers: int) -> list[dict[int, socket.socket]]:
    """For each worker, its sockets to every other worker (create before forking)."""
    socks: list[dict[int, socket.socket]] = [{} for _ in range(workers)]
    for i in range(workers):
        for j in range(i + 1, workers):
            a, b = socket.socketpair()
            socks[i][j] = a
            socks[j][i] = b
    return socks


def tcp_mesh(worker: int, addresses: Sequence[str], listener: Optional[socket.socket] = None,
             timeout: float = 60.0) -> SocketTransport:
    """Connect worker ``worker`` to every other worker: it dials lower ids, accepts higher ids.

    ``addresses[i]`` is ``host:port`` where worker ``i`` listens (``listener`` is this worker's
    already-bound listening socket, or one is bound to its address).
    """
    W = len(addresses)
    if listener is None:
        host, port = addresses[worker].rsplit(":", 1)
        listener = socket.create_server((host, int(port)), reuse_port=False)
    peers: dict[int, socket.socket] = {}
    deadline = time.monotonic() + timeout
    for j in range(worker):
        host, port = addresses[j].rsplit(":", 1)
        while True:
            try:
                s = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {worker} could not reach worker {j} at "
                                       f"{addresses[j]}") from None
                time.sleep(0.05)
        s.settimeout(None)
        s.sendall(worker.to_bytes(4, "little"))
        peers[j] = s
    listener.settimeout(max(1.0, deadline - time.monotonic()))
    while len(peers) < W - 1:
        s, _ = listener.accept()
        s.settimeout(None)
        j = int.from_bytes(wire._recv_exact(s, 4), "little")
        if j in peers or not (worker < j < W):
            s.close()
            raise RuntimeError(f"unexpected connection from worker {j}")
        peers[j] = s
    listener.close()
    for s in peers.values():
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return SocketTransport(worker, peers, W)

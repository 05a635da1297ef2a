"""A transport over a full mesh of connected sockets (between processes or hosts).

Every pair of workers shares one stream socket. An exchange sends to and receives from all
peers in one ``poll`` loop of sends and receives that never block (``MSG_DONTWAIT``;
incremental :class:`~dbsp.storage.wire.Sender` / :class:`~dbsp.storage.wire.Receiver`), so two
workers sending large parts to each other at the same time can never deadlock on full socket
buffers, and no thread hand-off sits on the path.
``poll``, not ``select``: ``select`` cannot watch a descriptor numbered 1024 or more, which a
process with many open files (a Spark executor, a worker with thousands of batch files) hands
out to its sockets. A worker with one peer (two workers) whose part is sent waits for the
peer's in a blocking receive instead: nothing can then wait on it, and it saves the poll.
Messages carry the exchange's sequence number; all workers call :meth:`exchange` in the same
order (identical circuits in lockstep), and a mismatch is reported as a protocol error.

:func:`socketpair_mesh` builds the mesh for forked worker processes on one machine;
:func:`tcp_mesh` builds it between hosts from a list of ``host:port`` addresses (the launcher's
rendezvous, :mod:`dbsp.runtime.launcher`, hands that list to every worker).

**Handshake.** A TCP connection (between workers, or from a worker to the coordinator) carries
nothing before both ends proved they belong to the same job and generation (:class:`MeshAuth`: a
job id, a generation number and a per-job secret the driver made). The dialer sends
``HELLO = magic | job id | generation | worker id | nonce_d``; the acceptor checks the magic,
job, generation and worker id, and answers ``nonce_a | HMAC(secret, "A" | HELLO | nonce_a)``;
the dialer checks that MAC and answers ``HMAC(secret, "D" | HELLO | nonce_a)``; the acceptor
checks it and says yes. The secret never crosses the wire, a replayed answer fails on the fresh
nonces, and nothing is unpickled from a peer before it passed. Garbage bytes, a wrong job, a
wrong secret, an old (or newer) generation and a connection that says nothing within the
handshake timeout are refused, logged on the ``dbsp.mesh`` logger, and the acceptor keeps
waiting for the real peer. The mesh is authenticated, not encrypted: run it on a trusted network
(as Spark's own unencrypted block transfer) or under a VPN.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import queue
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..circuit.exchange import TransportAborted
from ..storage import wire

log = logging.getLogger("dbsp.mesh")

HELLO_MAGIC = b"DBSPMSH1"
_HELLO = struct.Struct("<8s16sQI16s")  # magic, job id, generation, worker id, nonce
_MAC = 32
#: worker id the coordinator (driver) uses when it dials a worker (never a worker's id)
COORDINATOR = 0xFFFFFFFF
# poll events that mean "read now": data, or the peer hung up / failed (the read then raises)
_IN = select.POLLIN | select.POLLPRI | select.POLLHUP | select.POLLERR
_OUT = select.POLLOUT
_OUT_OR_FAIL = select.POLLOUT | select.POLLHUP | select.POLLERR  # a send then raises


class HandshakeRefused(ConnectionError):
    """A connection did not prove it belongs to this job and generation (or we did not)."""


@dataclass(frozen=True)
class MeshAuth:
    """Who may join a mesh: the workers of job ``job`` (16 bytes), generation ``generation``,
    holding ``secret``. The driver makes one per job with :meth:`new` and hands it to each
    worker (a launch argument, an environment variable, a Spark closure)."""

    job: bytes
    generation: int
    secret: bytes

    def __post_init__(self):
        if not isinstance(self.job, bytes) or len(self.job) != 16:
            raise ValueError(f"MeshAuth.job must be 16 bytes, got {self.job!r}")
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            raise ValueError("MeshAuth.secret must be at least 16 bytes")
        if not (0 <= int(self.generation) < 1 << 63):
            raise ValueError(f"MeshAuth.generation must be >= 0, got {self.generation!r}")

    @classmethod
    def new(cls, generation: int = 0) -> "MeshAuth":
        return cls(os.urandom(16), generation, os.urandom(32))

    def next_generation(self) -> "MeshAuth":
        """The same job and secret, one generation on (a restart after a failure)."""
        return MeshAuth(self.job, self.generation + 1, self.secret)

    def to_text(self) -> str:
        """``job:generation:secret`` in hex (for a command line's environment)."""
        return f"{self.job.hex()}:{self.generation}:{self.secret.hex()}"

    @classmethod
    def from_text(cls, text: str) -> "MeshAuth":
        try:
            job, gen, secret = text.strip().split(":")
            return cls(bytes.fromhex(job), int(gen), bytes.fromhex(secret))
        except ValueError as e:
            raise ValueError(f"bad mesh credentials {text[:12]!r}...: expected "
                             f"'job:generation:secret' in hex ({e})") from None

    def __repr__(self) -> str:  # never print the secret
        return f"MeshAuth(job={self.job.hex()}, generation={self.generation})"


def _mac(auth: MeshAuth, role: bytes, hello: bytes, nonce: bytes) -> bytes:
    return hmac.new(auth.secret, role + hello + nonce, hashlib.sha256).digest()


def _refuse(sock: socket.socket, reason: str) -> None:
    try:
        msg = reason.encode()[:200]
        sock.sendall(b"N" + bytes([len(msg)]) + msg)
    except OSError:
        pass


def _answer(sock: socket.socket) -> None:
    """Read the acceptor's yes (``Y``) or its refusal (``N`` + reason) and raise on a no."""
    code = wire._recv_exact(sock, 1)
    if code == b"Y":
        return
    if code == b"N":
        n = wire._recv_exact(sock, 1)[0]
        raise HandshakeRefused(f"refused by the peer: {wire._recv_exact(sock, n).decode()}")
    raise HandshakeRefused(f"peer answered the handshake with garbage {bytes(code)!r}")


def handshake_dial(sock: socket.socket, auth: MeshAuth, worker: int,
                   timeout: float = 10.0) -> None:
    """Prove to the acceptor on ``sock`` that we are ``worker`` of ``auth``'s job and
    generation, and check that it is too. Raises :class:`HandshakeRefused`."""
    sock.settimeout(timeout)
    hello = _HELLO.pack(HELLO_MAGIC, auth.job, auth.generation, worker, os.urandom(16))
    try:
        sock.sendall(hello)
        _answer(sock)
        nonce_a = bytes(wire._recv_exact(sock, 16))
        mac_a = bytes(wire._recv_exact(sock, _MAC))
        # answer before judging, so that an acceptor whose secret differs from ours learns
        # (and logs) that the secrets differ, not just that we hung up
        sock.sendall(_mac(auth, b"D", hello, nonce_a))
        if not hmac.compare_digest(mac_a, _mac(auth, b"A", hello, nonce_a)):
            raise HandshakeRefused("the peer does not hold this job's secret (wrong secret)")
        _answer(sock)
    except (OSError, wire.WireError) as e:
        if isinstance(e, HandshakeRefused):
            raise
        raise HandshakeRefused(f"handshake failed: {e}") from None
    sock.settimeout(None)


def handshake_accept(sock: socket.socket, auth: MeshAuth, accept: Callable[[int], Optional[str]],
                     timeout: float = 5.0,
                     claim: Optional[Callable[[int], Optional[str]]] = None) -> int:
    """Check the dialer on ``sock`` (see the module doc); ``accept(worker)`` returns None if
    that worker id may connect here, else why not; ``claim(worker)``, asked once the dialer
    proved it holds the secret, the same (so only an authenticated peer can take a worker id).
    Returns the dialer's worker id; raises
    :class:`HandshakeRefused` (after telling the dialer why, where that is safe)."""
    sock.settimeout(timeout)
    try:
        hello = bytes(wire._recv_exact(sock, _HELLO.size))
    except socket.timeout:
        raise HandshakeRefused(f"said nothing within {timeout:g} s (half-open connection)") \
            from None
    except (OSError, wire.WireError) as e:
        raise HandshakeRefused(f"closed during the handshake ({e})") from None
    magic, job, gen, worker, _nonce = _HELLO.unpack(hello)
    if magic != HELLO_MAGIC:
        raise HandshakeRefused(f"not a dbsp mesh peer (garbage bytes {hello[:8]!r})")
    if job != auth.job:
        _refuse(sock, "wrong job")
        raise HandshakeRefused(f"wrong job {job.hex()} (this is {auth.job.hex()})")
    if gen != auth.generation:
        why = "old" if gen < auth.generation else "newer"
        _refuse(sock, f"{why} generation {gen} (this is {auth.generation})")
        raise HandshakeRefused(f"{why} generation {gen} (this is {auth.generation})")
    bad = accept(worker)
    if bad is not None:
        _refuse(sock, bad)
        raise HandshakeRefused(bad)
    nonce_a = os.urandom(16)
    try:
        sock.sendall(b"Y" + nonce_a + _mac(auth, b"A", hello, nonce_a))
        mac_d = bytes(wire._recv_exact(sock, _MAC))
    except socket.timeout:
        raise HandshakeRefused(f"worker {worker} stopped answering the handshake") from None
    except (OSError, wire.WireError) as e:
        raise HandshakeRefused(f"worker {worker} closed during the handshake ({e})") from None
    if not hmac.compare_digest(mac_d, _mac(auth, b"D", hello, nonce_a)):
        _refuse(sock, "wrong secret")
        raise HandshakeRefused(f"claimed worker {worker} with a wrong secret")
    bad = claim(worker) if claim is not None else None
    if bad is not None:
        _refuse(sock, bad)
        raise HandshakeRefused(bad)
    sock.sendall(b"Y")
    sock.settimeout(None)
    return worker


def accept_peers(listener: socket.socket, auth: MeshAuth, want: Callable[[int], Optional[str]],
                 count: int, deadline: float, handshake_timeout: float = 5.0,
                 what: str = "mesh", watch: Optional[Callable[[], None]] = None
                 ) -> dict[int, socket.socket]:
    """Accept ``count`` authenticated connections on ``listener`` by ``deadline`` (monotonic).

    Each connection's handshake runs in a thread of its own, so a half-open connection holds up
    nobody; refused ones are logged and closed, and accepting goes on. ``want(worker)`` says
    whether a worker id may connect (None) or why not; a worker connecting twice is refused.
    ``watch()`` is called while waiting and may raise to give up (the launcher checks that the
    job that starts the workers is still alive).
    """
    got: dict[int, socket.socket] = {}
    done: "queue.Queue[tuple]" = queue.Queue()
    lock = threading.Lock()
    claimed: set[int] = set()

    def check(w: int) -> Optional[str]:
        with lock:
            if w in claimed:
                return f"worker {w} is connected already"
            claimed.add(w)
        return None

    def shake(s: socket.socket, addr) -> None:
        try:
            w = handshake_accept(s, auth, want, handshake_timeout, claim=check)
            done.put((w, s, None))
        except HandshakeRefused as e:
            log.warning("%s (job %s, generation %d): refused a connection from %s: %s", what,
                        auth.job.hex()[:8], auth.generation, addr, e)
            s.close()
            done.put((None, None, e))
        except BaseException as e:  # pragma: no cover - reported to the caller
            s.close()
            done.put((None, None, e))

    listener.settimeout(0.05)
    try:
        while len(got) < count:
            if watch is not None:
                watch()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: {len(got)} of {count} peers connected before the "
                                   f"deadline (connected: {sorted(got)})")
            try:
                s, addr = listener.accept()
            except socket.timeout:
                pass
            else:
                threading.Thread(target=shake, args=(s, addr), daemon=True).start()
            while True:
                try:
                    w, s, err = done.get_nowait()
                except queue.Empty:
                    break
                if w is not None:
                    got[w] = s
    except BaseException:
        for s in got.values():
            s.close()
        raise
    return got

class SocketTransport:
    def __init__(self, worker: int, peers: dict[int, socket.socket], workers: int):
        self.worker = worker
        self.workers = workers
        self.peers = peers
        self.seq = 0
        self.bytes_sent = 0
        self._aborted = False
        # blocking sockets: the poll loop's sends and receives never block (MSG_DONTWAIT), and
        # a worker with one peer (two workers) waits for its part in a blocking receive
        for s in peers.values():
            s.setblocking(True)
        self._one = next(iter(peers.items())) if len(peers) == 1 else None

    def exchange(self, worker: int, parts: Sequence[Any]) -> list[Any]:
        if worker != self.worker:
            raise ValueError(f"transport of worker {self.worker} called as worker {worker}")
        if self._aborted:
            raise TransportAborted("transport aborted")
        seq = self.seq
        self.seq += 1
        out: list[Any] = [None] * self.workers
        out[self.worker] = parts[self.worker]
        if self._one is not None:
            # one peer: once our part is sent nothing can block on us, so wait for the
            # peer's part in a blocking receive (a send, two receives: no poll, no poller set
            # up, no receive that finds nothing, no per-peer tables)
            p, sock = self._one
            snd = wire.Sender(sock, (seq, parts[p]))
            self.bytes_sent += snd.nbytes
            try:
                if snd.pump():
                    rcv = wire.Receiver(sock)
                    rcv.wait()
                    out[p] = self._value(p, rcv, seq)
                    return out
            except (OSError, wire.WireError) as e:
                self._aborted = True
                raise TransportAborted(f"a peer of worker {self.worker} is gone ({e})") \
                    from None
            return self._poll(out, seq, {sock: snd})
        sending = {}
        for p, sock in self.peers.items():
            snd = wire.Sender(sock, (seq, parts[p]))
            self.bytes_sent += snd.nbytes
            sending[sock] = snd
        return self._poll(out, seq, sending)

    def _poll(self, out: list, seq: int, sending: dict) -> list:
        """Send what is left in ``sending`` and receive every peer's part, in one ``poll``
        loop (see the module doc)."""
        try:
            for sock in list(sending):  # most messages fit the socket buffer: no poll needed
                if sending[sock].pump():
                    del sending[sock]
            receiving = {sock: (p, wire.Receiver(sock)) for p, sock in self.peers.items()}
            by_fd = {s.fileno(): s for s in self.peers.values()}
            poller = select.poll()  # no syscall until poll(); no limit on descriptor numbers

            def watch(sock: socket.socket) -> int:
                return (_IN if sock in receiving else 0) | (_OUT if sock in sending else 0)

            for sock in self.peers.values():
                if watch(sock):
                    poller.register(sock, watch(sock))
            while receiving or sending:
                for fd, ev in poller.poll():
                    sock = by_fd[fd]
                    if ev & select.POLLNVAL:
                        raise OSError(f"the socket to a peer was closed under worker "
                                      f"{self.worker}")
                    if ev & _OUT_OR_FAIL and sock in sending and sending[sock].pump():
                        del sending[sock]
                    if ev & _IN and sock in receiving:
                        p, rcv = receiving[sock]
                        if rcv.feed():
                            del receiving[sock]
                            out[p] = self._value(p, rcv, seq)
                    mask = watch(sock)
                    if mask:
                        poller.modify(sock, mask)
                    else:
                        poller.unregister(sock)
        except (OSError, wire.WireError) as e:
            self._aborted = True
            raise TransportAborted(f"a peer of worker {self.worker} is gone ({e})") from None
        return out

    @staticmethod
    def _value(p: int, rcv: "wire.Receiver", seq: int) -> Any:
        got_seq, value = rcv.value()
        if got_seq != seq:
            raise RuntimeError(f"exchange out of step: worker {p} sent #{got_seq}, expected "
                               f"#{seq} (circuits differ between workers?)")
        return value

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


def dial(address: str, auth: MeshAuth, worker: int, deadline: float,
         handshake_timeout: float = 10.0) -> socket.socket:
    """Connect to ``host:port`` (retrying until ``deadline`` while nobody listens there) and
    pass the handshake as ``worker``; a refusal is final and raised."""
    host, port = address.rsplit(":", 1)
    while True:
        try:
            s = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker {worker} could not reach {address}") from None
            time.sleep(0.05)
    try:
        handshake_dial(s, auth, worker, handshake_timeout)
    except BaseException:
        s.close()
        raise
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def tcp_mesh(worker: int, addresses: Sequence[str], auth: MeshAuth,
             listener: Optional[socket.socket] = None, timeout: float = 60.0,
             handshake_timeout: float = 5.0) -> SocketTransport:
    """Connect worker ``worker`` to every other worker: it dials lower ids, accepts higher ids,
    each connection authenticated by the handshake of ``auth`` (see the module doc).

    ``addresses[i]`` is ``host:port`` where worker ``i`` listens (``listener`` is this worker's
    already-bound listening socket, or one is bound to its address).
    """
    W = len(addresses)
    if not 0 <= worker < W:
        raise ValueError(f"worker {worker} is not in 0..{W - 1}")
    if listener is None:
        host, port = addresses[worker].rsplit(":", 1)
        listener = socket.create_server((host, int(port)), reuse_port=False)
    deadline = time.monotonic() + timeout
    peers: dict[int, socket.socket] = {}
    try:
        for j in range(worker):
            peers[j] = dial(addresses[j], auth, worker, deadline, max(handshake_timeout, 10.0))

        def want(j: int) -> Optional[str]:
            return None if worker < j < W else f"worker {j} does not dial worker {worker}"

        peers.update(accept_peers(listener, auth, want, W - 1 - worker, deadline,
                                  handshake_timeout, what=f"mesh worker {worker}"))
    except BaseException:
        for s in peers.values():
            s.close()
        raise
    finally:
        listener.close()
    for s in peers.values():
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return SocketTransport(worker, peers, W)

"""Wire format for batches crossing a process boundary: pickle protocol 5, buffers out of band.

A message is ``header | pickle bytes | buffer 0 | buffer 1 | ...``. The header is
``magic u32, npickle u64, nbuf u32`` then ``nbuf`` u64 lengths. Numpy arrays and Arrow buffers
travel as raw bytes (no copy into the pickle stream; one copy into the socket), and are rebuilt
over the received memory without another copy.
"""
from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

MAGIC = 0xDB5B0001
_HEAD = struct.Struct("<IQI")


class WireError(ConnectionError):
    """The peer closed the connection or sent something that is not a message."""


def dumps(obj: Any) -> list:
    """``obj`` as a list of byte-like frames ready for ``sendmsg``."""
    bufs: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    head = _HEAD.pack(MAGIC, len(payload), len(raws)) + struct.pack(
        f"<{len(raws)}Q", *[r.nbytes for r in raws])
    return [head, payload, *raws]


def send(sock: socket.socket, obj: Any) -> int:
    """Send one message with scatter-gather writes (one ``sendmsg`` for all frames when the
    socket takes it all, which it does for anything up to the socket buffer)."""
    frames = [memoryview(f).cast("B") for f in dumps(obj)]
    total = sum(f.nbytes for f in frames)
    sent = 0
    while frames:
        k = sock.sendmsg(frames[:_IOV_MAX])
        sent += k
        while frames and k >= frames[0].nbytes:
            k -= frames[0].nbytes
            frames.pop(0)
        if k:
            frames[0] = frames[0][k:]
    assert sent == total
    return total


_IOV_MAX = 1024


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:], n - got)
        if k == 0:
            raise WireError("connection closed by peer")
        got += k
    return buf


def recv(sock: socket.socket) -> Any:
    head = _recv_exact(sock, _HEAD.size)
    magic, npickle, nbuf = _HEAD.unpack(head)
    if magic != MAGIC:
        raise WireError(f"bad message magic {magic:#x}")
    lens = struct.unpack(f"<{nbuf}Q", _recv_exact(sock, 8 * nbuf)) if nbuf else ()
    payload = _recv_exact(sock, npickle)
    bufs = [_recv_exact(sock, n) for n in lens]
    return pickle.loads(payload, buffers=bufs)

"""The native walk of a wire message's skeleton (``src/_native/skeleton.pyx``) against the
Python walk it replaced (kept here as the reference): the same skeleton, the same buffers in the
same order, the same frames byte for byte, and bad layouts refused."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dbsp._native import skeleton as S

_ATOMS = (type(None), bool, int, float, str, bytes)
BIG = 4


class Blob:
    """An object the walk hands to ``other`` (as a batch or an array)."""

    def __init__(self, v):
        self.v = v

    def __eq__(self, o):
        return type(o) is Blob and o.v == self.v


def _other(o, raws):
    i = len(raws)
    raws.append(repr(o.v if type(o) is Blob else o).encode())
    return (..., "x", i)


def _ref_enc(o, raws):
    t = type(o)
    if t in _ATOMS:
        return o
    if t is tuple:
        if len(o) > BIG:
            return _other(o, raws)
        out = tuple([_ref_enc(x, raws) for x in o])
        return (..., "t") + out if o and o[0] is ... else out
    if t is dict:
        for k in o:
            if type(k) not in _ATOMS:
                return _other(o, raws)
        return {k: _ref_enc(v, raws) for k, v in o.items()}
    if t is list:
        if len(o) > BIG:
            return _other(o, raws)
        return [_ref_enc(x, raws) for x in o]
    return _other(o, raws)


def _ref_frames(magic, meta, raws):
    pads = [b""] + [bytes(8 - i) for i in range(1, 8)]
    frames = [b"", b"", meta]
    lens = []
    body = 8 * len(raws) + len(meta)
    if len(meta) & 7:
        frames.append(pads[len(meta) & 7])
        body += 8 - (len(meta) & 7)
    for r in raws:
        r = memoryview(r).cast("B")
        lens.append(len(r))
        frames.append(r)
        body += len(r)
        if len(r) & 7:
            frames.append(pads[len(r) & 7])
            body += 8 - (len(r) & 7)
    frames[0] = struct.pack("<IIQQ", magic, len(lens), len(meta), body)
    frames[1] = struct.pack(f"<{len(lens)}Q", *lens)
    return frames


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                  st.text(max_size=4), st.binary(max_size=4), st.just(...),
                  st.integers(0, 9).map(Blob))
_tree = st.recursive(
    _leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.lists(inner, max_size=6).map(tuple),
        st.dictionaries(st.one_of(st.integers(0, 9), st.text(max_size=2), st.just((1, 2))),
                        inner, max_size=3)),
    max_leaves=20)


def _kinds():
    def x(s, bufs):
        return ("X", bytes(bufs[s[2]]))

    def t(s, bufs):
        return tuple([S.decode(v, bufs, kinds) for v in s[2:]])
    kinds = {"x": x, "t": t}
    return kinds


def _ref_dec(s, bufs):
    if type(s) is tuple:
        if s and s[0] is ...:
            if s[1] == "x":
                return ("X", bytes(bufs[s[2]]))
            return tuple([_ref_dec(v, bufs) for v in s[2:]])
        return tuple([_ref_dec(v, bufs) for v in s])
    if type(s) is dict:
        return {k: _ref_dec(v, bufs) for k, v in s.items()}
    if type(s) is list:
        return [_ref_dec(v, bufs) for v in s]
    return s


def _flat(frames) -> bytes:
    return b"".join(bytes(memoryview(f).cast("B")) for f in frames)


@settings(max_examples=300, deadline=None)
@given(_tree)
def test_the_walk_gives_the_python_walks_skeleton_and_buffers(obj):
    raws, ref_raws = [], []
    got = S.encode(obj, raws, _other, BIG)
    ref = _ref_enc(obj, ref_raws)
    assert repr(got) == repr(ref) and [bytes(r) for r in raws] == [bytes(r) for r in ref_raws]
    bufs = [memoryview(r) for r in raws]
    assert repr(S.decode(got, bufs, _kinds())) == repr(_ref_dec(ref, bufs))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=30), st.lists(st.binary(max_size=20), max_size=6),
       st.sampled_from([0xDB5B0003, 0xDB5B0002]))
def test_frames_are_the_python_layout_byte_for_byte_and_split_back(meta, raws, magic):
    got = S.frames(magic, meta, list(raws))
    assert _flat(got) == _flat(_ref_frames(magic, meta, raws))
    for f in got:  # ready for sendmsg: bytes or flat byte views
        assert type(f) is bytes or (memoryview(f).format == "B" and memoryview(f).ndim == 1)
    body = bytearray(_flat(got)[24:])
    m, bufs = S.split_body(body, len(raws), len(meta))
    assert bytes(m) == meta and [bytes(b) for b in bufs] == raws


def test_views_of_other_shapes_are_sent_as_bytes():
    import numpy as np
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    got = S.frames(1, b"m", [memoryview(a), a])
    assert bytes(got[4]) == a.tobytes() and got[4].format == "B"


@pytest.mark.parametrize("nbuf, nmeta, body", [
    (1, 0, bytes(4)),                                    # too short for its lengths
    (1, 0, struct.pack("<Q", 100) + bytes(8)),           # a buffer past the end
    (1, 0, struct.pack("<Q", 2**63) + bytes(8)),         # an absurd length
    (0, 3, bytes(16)),                                   # bytes left over
    (2, 1, struct.pack("<QQ", 1, 1) + bytes(8)),         # one byte short
])
def test_a_body_that_does_not_match_its_layout_is_refused(nbuf, nmeta, body):
    with pytest.raises(ValueError):
        S.split_body(bytearray(body), nbuf, nmeta)


def test_a_message_nested_too_deep_is_refused_not_a_crash():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(RecursionError):
        S.encode(deep, [], _other, BIG)
    skel: list = []
    for _ in range(5000):
        skel = [skel]
    with pytest.raises(ValueError):
        S.decode(skel, [], {})

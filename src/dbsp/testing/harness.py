"""Running a circuit against the reference model, step by step (the operator tests' helper).

:func:`check_steps` builds a circuit on ``workers`` workers, feeds it a list of per-step input
deltas and checks after every step that

(a) the output *delta* equals the reference applied incrementally:
    ``reference(I_t) - reference(I_{t-1})`` (and, for linear operators, also ``reference(Δ_t)``);
(b) the *integrated* output (the output handle's view) equals the reference recomputed from
    scratch over everything pushed so far, ``reference(I_t)``.

The tests run every operator through it with ``workers`` = 1 and 2 (the ``workers`` fixture of
``tests/conftest.py``), so the same test covers the sharded paths.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa

from .. import Circuit
from ..algebra.codes import Codes
from . import reference as ref


def push_dict(inp, z: dict) -> None:
    """Push a reference Z-set (``dict[row, weight]``) into an input stream."""
    if not z:
        return
    rows = list(z)
    inp.push(rows, weights=np.asarray([z[r] for r in rows], dtype=np.int64))


def _fmt(z: dict) -> str:
    return "{" + ", ".join(f"{r!r}: {w}" for r, w in sorted(z.items(), key=lambda p: repr(p))) + "}"


def check_consolidated(z: Any, ctx: str = "") -> None:
    """Assert the invariant of a consolidated Z-set (an output's delta): its rows, encoded
    afresh with its codec, strictly ascend (sorted, each row once) and no weight is zero.
    An operator that hands an already sorted batch on (the output then neither encodes nor
    sorts it) must keep it."""
    if not len(z):
        return
    codes = Codes.to_list(z.codec.encode_batch(z.data))
    assert all(a < b for a, b in zip(codes, codes[1:])), \
        f"{ctx}\ndelta rows not in code order or repeated: {z.data.to_pylist()}"
    assert (np.asarray(z.weights) != 0).all(), f"{ctx}\ndelta has a zero weight"


def check_steps(workers: int, schemas: dict[str, Any], build: Callable[..., Any],
                reference: Callable[..., dict], steps: list[dict[str, dict]],
                linear: bool = False, keys: Optional[dict[str, list]] = None,
                normalize: Optional[Callable[[dict], dict]] = None,
                storage: Any = None, runtime: str = "threads") -> Circuit:
    """Check ``build(*inputs) -> stream`` against ``reference(*input dicts) -> dict``.

    ``schemas``: input name -> schema (inputs are passed to ``build`` / ``reference`` in this
    order). ``steps``: one ``{input name: delta dict}`` per step (missing inputs get nothing).
    ``linear``: also check that the delta equals ``reference`` of the input deltas.
    ``normalize``: applied to both sides before comparing (e.g. to round floats).
    ``storage`` / ``runtime``: passed to the circuit (state in layer files, worker processes).
    Returns the circuit (closed).
    """
    norm = normalize or (lambda z: z)
    names = list(schemas)
    with Circuit(workers=workers, storage=storage, runtime=runtime) as c:
        inputs = [c.add_input(n, schemas[n], key=(keys or {}).get(n)) for n in names]
        out = build(*inputs).output()
        integ: dict[str, dict] = {n: {} for n in names}
        prev: dict = {}
        for t, step in enumerate(steps):
            for n, inp in zip(names, inputs):
                push_dict(inp, step.get(n, {}))
            c.step()
            for n in names:
                integ[n] = ref.add(integ[n], step.get(n, {}))
            want = reference(*[integ[n] for n in names])
            got_delta = out.to_dict()
            want_delta = ref.sub(want, prev)
            ctx = f"step {t} with {workers} worker(s); inputs so far {integ!r}"
            check_consolidated(out.delta(), ctx)
            assert norm(got_delta) == norm(want_delta), (
                f"{ctx}\ndelta: got  {_fmt(got_delta)}\n       want {_fmt(want_delta)}")
            if linear:
                lin = reference(*[step.get(n, {}) for n in names])
                assert norm(got_delta) == norm(lin), (
                    f"{ctx}\ndelta vs reference(Δ): got {_fmt(got_delta)}\n want {_fmt(lin)}")
            got_view = out.view_dict()
            assert norm(got_view) == norm(want), (
                f"{ctx}\nview: got  {_fmt(got_view)}\n      want {_fmt(want)}")
            prev = want
    return c


def run_steps(workers: int, schemas: dict[str, Any], build: Callable[..., Any],
              steps: list[dict[str, dict]], storage: Any = None) -> list[dict]:
    """Feed ``steps`` to ``build(*inputs)`` and return the output delta of every step (for
    operators that are not functions of the integrated input: delay, integrate, differentiate)."""
    names = list(schemas)
    out_deltas = []
    with Circuit(workers=workers, storage=storage) as c:
        inputs = [c.add_input(n, schemas[n]) for n in names]
        out = build(*inputs).output(view=False)
        for step in steps:
            for n, inp in zip(names, inputs):
                push_dict(inp, step.get(n, {}))
            c.step()
            out_deltas.append(out.to_dict())
    return out_deltas


def table(schema: pa.Schema, z: dict) -> pa.Table:
    """A reference Z-set as an Arrow table with a ``__weight`` column."""
    rows = list(z)
    cols = list(zip(*rows)) if rows else [[] for _ in schema]
    t = pa.table({f.name: pa.array(list(c), f.type) for f, c in zip(schema, cols)})
    return t.append_column("__weight", pa.array([z[r] for r in rows], pa.int64()))


__all__ = ["check_steps", "run_steps", "push_dict", "table"]

"""Drive a fluent pipeline step by step and check it against a reference after every step."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pyarrow as pa
from hypothesis import strategies as st

from dbsp.api import StreamContext

import _api_ref as R


def push(stream, z: dict) -> None:
    """Push the Z-set ``{row: weight}`` into a source stream."""
    if not z:
        return
    rows = list(z)
    cols = list(zip(*rows))
    schema = stream.schema
    table = pa.Table.from_arrays([pa.array(list(c), type=f.type) for c, f in zip(cols, schema)],
                                 schema=schema)
    stream.push(table, np.array([z[r] for r in rows], dtype=np.int64))


@st.composite
def steps_of(draw, rows, n_steps=4, max_rows=6, deletes=True):
    """Per step a delta of rows drawn from ``rows``: new rows inserted and (with ``deletes``) some
    rows inserted in an earlier step deleted, so a deletion never goes below zero."""
    live: dict = {}
    out = []
    for _ in range(draw(st.integers(1, n_steps))):
        d: dict = {}
        for r in draw(st.lists(rows, max_size=max_rows)):
            d[r] = d.get(r, 0) + 1
        present = sorted((r for r, w in live.items() if w > 0), key=R._key)
        if present and deletes:
            for r in draw(st.lists(st.sampled_from(present), max_size=2, unique=True)):
                d[r] = d.get(r, 0) - 1
        d = {r: w for r, w in d.items() if w}
        live = R.add(live, d)
        out.append(d)
    return out


def late_steps(ctx, ls, rs, kl, kr, left_steps, right_steps):
    """Push ``left_steps`` into ``ls`` and ``right_steps`` into ``rs`` (watermarked sources),
    step ``ctx``, and yield ``(i, a, b)`` after each step: the rows of each side so far that
    the reference lateness filters ``kl`` / ``kr`` (:class:`_api_ref.Lateness`) kept."""
    a: dict = {}
    b: dict = {}
    for i in range(max(len(left_steps), len(right_steps))):
        dl = left_steps[i] if i < len(left_steps) else {}
        dr = right_steps[i] if i < len(right_steps) else {}
        push(ls, dl)
        push(rs, dr)
        a, b = R.add(a, kl.step(dl)), R.add(b, kr.step(dr))
        ctx.step()
        yield i, a, b


def fmt(z: dict) -> str:
    return "\n".join(f"  {w:+d} {r}" for r, w in sorted(z.items(), key=lambda x: R._key(x[0])))


def check_steps(workers: int, schemas: dict[str, Any], build: Callable[..., Any],
                steps: list[dict[str, dict]], reference: Callable[..., dict],
                approx: bool = False, ctx_kw: dict | None = None) -> StreamContext:
    """Build ``out = build(ctx, *streams)`` (a collector); push ``steps`` (per step, per input a
    Z-set delta); after each step compare the view with ``reference(*integrated inputs)`` and
    the delta with the change of the reference."""
    with StreamContext(workers=workers, **(ctx_kw or {})) as ctx:
        streams = [ctx.stream(s, name=n) for n, s in schemas.items()]
        out = build(ctx, *streams)
        acc = {n: {} for n in schemas}
        prev: dict = {}
        for i, step in enumerate(steps):
            for n, s in zip(schemas, streams):
                d = step.get(n, {})
                push(s, d)
                acc[n] = R.add(acc[n], d)
            ctx.step()
            want = reference(*[acc[n] for n in schemas])
            got = out.view_dict()
            eq = R.close if approx else (lambda a, b: a == b)
            assert eq(got, want), f"step {i}: view\n{fmt(got)}\nexpected\n{fmt(want)}"
            dgot, dwant = out.delta_dict(), R.sub(want, prev)
            if not approx:
                assert dgot == dwant, f"step {i}: delta\n{fmt(dgot)}\nexpected\n{fmt(dwant)}"
            prev = want
        return ctx

"""Tests of ``dbsp.nexmark.reference``: the DuckDB SQL against naive pure-Python oracles written
from the module's definitions, and ``compare_results`` against planted differences."""

from __future__ import annotations

import builtins
import math
import random
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("duckdb")

from dbsp.nexmark.generator import NexmarkGenerator, side_input
from dbsp.nexmark.reference import (
    QUERIES,
    QUERY_SCHEMAS,
    compare_results,
    reference_results,
    step_proc_times,
)
from dbsp.operators.proc_time import StepClock

Row = tuple[Any, ...]
Events = dict[str, list[dict[str, Any]]]

# --- naive oracles: one row at a time, straight from the documented definitions ---------------


def _fl(x: int, w: int) -> int:
    return x - x % w  # Python's % floors


def _winners(ev: Events) -> dict[int, tuple[dict[str, Any], dict[str, Any]]]:
    auctions = {a["id"]: a for a in ev["auction"]}
    best: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    for b in ev["bid"]:
        a = auctions.get(b["auction"])
        if a is None or not (a["date_time"] <= b["date_time"] <= a["expires"]):
            continue
        if b["price"] < a["reserve"]:
            continue
        key = (-b["price"], b["date_time"], b["bidder"], b["extra"], b["channel"], b["url"])
        if a["id"] not in best or key < best[a["id"]][0]:
            best[a["id"]] = (key, b)
    return {aid: (auctions[aid], b) for aid, (_, b) in best.items()}


def _avg(values: list[int]) -> float:
    return float(sum(values)) / len(values)


def q0(ev: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], b["price"], b["channel"], b["url"], b["date_time"],
             b["extra"]) for b in ev["bid"]]


def q1(ev: Events) -> list[Row]:
    return [(b["auction"], b["bidder"], b["price"] * 908 // 1000, b["date_time"], b["extra"])
            for b in ev["bid"]]


def q2(ev: Events) -> list[Row]:
    return [(b["auction"], b["price"]) for b in ev["bid"] if b["auction"] % 123 == 0]


def q3(ev: Events) -> list[Row]:
    out = []
    for a in ev["auction"]:
        for p in ev["person"]:
            if a["seller"] == p["id"] and a["category"] == 10 and p["state"] in ("OR", "ID", "CA"):
                out.append((p["name"], p["city"], p["state"], a["id"]))
    return out


def q4(ev: Events) -> list[Row]:
    prices: dict[int, list[int]] = defaultdict(list)
    for a, b in _winners(ev).values():
        prices[a["category"]].append(b["price"])
    return [(c, _avg(v)) for c, v in prices.items()]


def q5(ev: Events) -> list[Row]:
    counts: Counter[tuple[int, int]] = Counter()
    for b in ev["bid"]:
        t = b["date_time"]
        s = _fl(t - 10_000, 2000)
        while s <= t:
            if s + 10_000 > t:
                counts[(s, b["auction"])] += 1
            s += 2000
    top: dict[int, int] = {}
    for (s, _), n in counts.items():
        top[s] = max(top.get(s, 0), n)
    return [(a, n, s, s + 10_000) for (s, a), n in counts.items() if n == top[s]]


def q6(ev: Events) -> list[Row]:
    won: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for a, b in _winners(ev).values():
        won[a["seller"]].append((a["expires"], a["id"], b["price"]))
    return [(s, _avg([p for _, _, p in sorted(v, reverse=True)[:10]])) for s, v in won.items()]


def q7(ev: Events) -> list[Row]:
    top: dict[int, int] = {}
    for b in ev["bid"]:
        w = _fl(b["date_time"], 10_000)
        top[w] = max(top.get(w, b["price"]), b["price"])
    return [(b["auction"], b["price"], b["bidder"], b["date_time"], b["extra"])
            for b in ev["bid"] if b["price"] == top[_fl(b["date_time"], 10_000)]]


def q8(ev: Events) -> list[Row]:
    sellers = {(a["seller"], _fl(a["date_time"], 10_000)) for a in ev["auction"]}
    persons = {(p["id"], p["name"], _fl(p["date_time"], 10_000)) for p in ev["person"]}
    return [(i, n, w) for i, n, w in persons if (i, w) in sellers]


def q9(ev: Events) -> list[Row]:
    cols = ["id", "item_name", "description", "initial_bid", "reserve", "date_time", "expires",
            "seller", "category", "extra"]
    return [tuple(a[c] for c in cols) + (b["auction"], b["bidder"], b["price"], b["date_time"],
                                         b["extra"]) for a, b in _winners(ev).values()]


def q10(ev: Events) -> list[Row]:
    def fmt(t: int, f: str) -> str:
        return datetime.fromtimestamp(t / 1000, tz=timezone.utc).strftime(f)
    return [(b["auction"], b["bidder"], b["price"], b["date_time"], b["extra"],
             fmt(b["date_time"], "%Y-%m-%d"), fmt(b["date_time"], "%H:%M")) for b in ev["bid"]]


def q12(ev: Events) -> list[Row]:
    counts: Counter[tuple[int, int]] = Counter()
    assert len(ev["bid_proc_time"]) == len(ev["bid"])
    for b, p in zip(ev["bid"], ev["bid_proc_time"]):
        counts[(b["bidder"], _fl(p["p_time"], 10_000))] += 1
    return [(bidder, n, w, w + 10_000) for (bidder, w), n in counts.items()]


def q13(ev: Events) -> list[Row]:
    value = {r["key"]: r["value"] for r in ev["side_input"]}
    return [(b["auction"], b["bidder"], b["price"], b["date_time"], value[b["auction"] % 10_000])
            for b in ev["bid"] if b["auction"] % 10_000 in value]


def q11(ev: Events) -> list[Row]:
    times: dict[int, list[int]] = defaultdict(list)
    for b in ev["bid"]:
        times[b["bidder"]].append(b["date_time"])
    out = []
    for bidder, ts in times.items():
        ts.sort()
        first = prev = ts[0]
        n = 0
        for t in ts:
            if t - prev > 10_000:
                out.append((bidder, n, first, prev + 10_000))
                first, n = t, 0
            n += 1
            prev = t
        out.append((bidder, n, first, prev + 10_000))
    return out


def q14(ev: Events) -> list[Row]:
    out = []
    for b in ev["bid"]:
        eur = b["price"] * 908 // 1000
        if not 1_000_000 < eur < 50_000_000:
            continue
        h = (b["date_time"] // 3_600_000) % 24
        kind = "dayTime" if 8 <= h <= 18 else "nightTime" if h <= 6 or h >= 20 else "otherTime"
        out.append((b["auction"], b["bidder"], eur, kind, b["date_time"], b["extra"],
                    b["extra"].count("c")))
    return out


def _day(t: int) -> str:
    return datetime.fromtimestamp(t / 1000, tz=timezone.utc).strftime("%Y-%m-%d")


def _rank(price: int) -> int:
    return 1 if price < 10_000 else 2 if price < 1_000_000 else 3


def _stats(bids: list[dict[str, Any]]) -> tuple[int, ...]:
    ranks = [[b for b in bids if _rank(b["price"]) == r] for r in (1, 2, 3)]
    groups = [bids] + ranks
    return (
        tuple(len(g) for g in groups)
        + tuple(len({b["bidder"] for b in g}) for g in groups)
        + tuple(len({b["auction"] for b in g}) for g in groups)
    )


def q15(ev: Events) -> list[Row]:
    days: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for b in ev["bid"]:
        days[_day(b["date_time"])].append(b)
    return [(d,) + _stats(v) for d, v in days.items()]


def q16(ev: Events) -> list[Row]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for b in ev["bid"]:
        groups[(b["channel"], _day(b["date_time"]))].append(b)
    out = []
    for (c, d), v in groups.items():
        minute = max(datetime.fromtimestamp(b["date_time"] / 1000, tz=timezone.utc)
                     .strftime("%H:%M") for b in v)
        out.append((c, d, minute) + _stats(v))
    return out


def q17(ev: Events) -> list[Row]:
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for b in ev["bid"]:
        groups[(b["auction"], _day(b["date_time"]))].append(b["price"])
    return [(a, d, len(p), *(sum(_rank(x) == r for x in p) for r in (1, 2, 3)),
             min(p), max(p), _avg(p), sum(p)) for (a, d), p in groups.items()]


def _latest_first(b: dict[str, Any]) -> tuple[Any, ...]:
    return (-b["date_time"], -b["price"], b["channel"], b["url"], b["extra"])


def q18(ev: Events) -> list[Row]:
    last: dict[tuple[int, int], dict[str, Any]] = {}
    for b in ev["bid"]:
        k = (b["bidder"], b["auction"])
        if k not in last or _latest_first(b) < _latest_first(last[k]):
            last[k] = b
    return q0({"bid": list(last.values())})


def q19(ev: Events) -> list[Row]:
    per: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for b in ev["bid"]:
        per[b["auction"]].append(b)
    out = []
    for bids in per.values():
        bids.sort(key=lambda x: (-x["price"], x["date_time"], x["bidder"], x["channel"],
                                 x["url"], x["extra"]))
        out += [r + (i + 1,) for i, r in enumerate(q0({"bid": bids[:10]}))]
    return out


def q20(ev: Events) -> list[Row]:
    auctions = {a["id"]: a for a in ev["auction"] if a["category"] == 10}
    out = []
    for r, b in zip(q0(ev), ev["bid"], strict=True):
        a = auctions.get(b["auction"])
        if a is not None:
            out.append(r + tuple(a[c] for c in ("item_name", "description", "initial_bid",
                                                "reserve", "date_time", "expires", "seller",
                                                "category", "extra")))
    return out


def q21(ev: Events) -> list[Row]:
    ids = {"apple": "0", "google": "1", "facebook": "2", "baidu": "3"}
    out = []
    for b in ev["bid"]:
        cid = ids.get(b["channel"].lower())
        if cid is None:
            params = b["url"].split("?", 1)[1].split("&")
            found = [p[len("channel_id="):] for p in params if p.startswith("channel_id=")]
            cid = found[0] if found else None
        if cid is not None:
            out.append((b["auction"], b["bidder"], b["price"], b["channel"], cid))
    return out


def q22(ev: Events) -> list[Row]:
    out = []
    for b in ev["bid"]:
        parts = b["url"].split("/") + [None, None, None, None, None, None]
        out.append((b["auction"], b["bidder"], b["price"], b["channel"], *parts[3:6]))
    return out


ORACLES: dict[str, Callable[[Events], list[Row]]] = {
    "q0": q0, "q1": q1, "q2": q2, "q3": q3, "q4": q4, "q5": q5, "q6": q6, "q7": q7, "q8": q8,
    "q9": q9, "q10": q10, "q11": q11, "q12": q12, "q13": q13, "q14": q14, "q15": q15, "q16": q16, "q17": q17, "q18": q18,
    "q19": q19, "q20": q20, "q21": q21, "q22": q22,
}


# --- fixtures ---------------------------------------------------------------------------------


def _ms_columns(table: pa.Table) -> pa.Table:
    """Timestamps as int64 epoch milliseconds (what the oracles compute with)."""
    cols = [c.cast(pa.int64()) if pa.types.is_timestamp(c.type) else c for c in table.columns]
    return pa.table(cols, names=table.column_names)


def _rows(table: pa.Table) -> list[Row]:
    return [tuple(r.values()) for r in _ms_columns(table).to_pylist()]


STREAMS = {
    # 100 events/s: 30k events span 300 s, i.e. 30 tumbling windows; long auctions
    "slow": {"seed": 7, "first_event_rate": 100, "total": 30_000},
    # the reference rate: 3 s of events, short auctions, hopping windows overlap heavily
    "reference-rate": {"seed": 11, "first_event_rate": 10_000, "total": 20_000},
}


@pytest.fixture(scope="module", params=list(STREAMS))
def stream(
    request: pytest.FixtureRequest,
) -> tuple[dict[str, pa.Table], Events, dict[str, pa.Table]]:
    spec = dict(STREAMS[request.param])
    total = spec.pop("total")
    gen = NexmarkGenerator(**spec)
    tables = gen.tables(total, chunk=7_000)
    tables["side_input"] = side_input()
    tables["bid_proc_time"] = step_proc_times(total, 7_000, StepClock(T0, 3_000), gen)
    events = {k: _ms_columns(t).to_pylist() for k, t in tables.items()}
    return tables, events, reference_results(tables)


T0 = 1_436_918_400_000  # a multiple of every window size


def _handcrafted() -> dict[str, pa.Table]:
    """A few events on the boundaries of the definitions (reserve, lifetime, ties, gaps)."""
    from dbsp.nexmark.generator import AUCTION_SCHEMA, BID_SCHEMA, PERSON_SCHEMA

    def person(i: int, state: str, t: int) -> dict[str, Any]:
        return {
            "id": i, "name": f"p{i}", "email_address": "e@x.com",
            "credit_card": "0000 0000 0000 0000", "city": "Bend", "state": state,
            "date_time": T0 + t, "extra": "",
        }

    def auction(i: int, seller: int, cat: int, t: int, end: int, reserve: int) -> dict[str, Any]:
        return {
            "id": i, "item_name": "it", "description": "d", "initial_bid": 1,
            "reserve": reserve, "date_time": T0 + t, "expires": T0 + end, "seller": seller,
            "category": cat, "extra": "",
        }

    def bid(
        a: int, bidder: int, price: int, t: int, channel: str = "Google",
        url: str = "https://www.nexmark.com/a/b/c/item.htm?query=1", extra: str = "",
    ) -> dict[str, Any]:
        return {
            "auction": a, "bidder": bidder, "price": price, "channel": channel, "url": url,
            "date_time": T0 + t, "extra": extra,
        }

    persons = [person(1, "OR", 0), person(2, "CA", 9_999), person(3, "WA", 10_000)]
    auctions = [
        auction(10, 1, 10, 100, 1_000, 500),
        auction(11, 2, 10, 5_000, 6_000, 50),
        auction(12, 3, 11, 10_000, 40_000, 1),
        auction(13, 1, 12, 10_000, 10_001, 1_000_000),  # no qualifying bid
    ]
    bids = [
        bid(10, 1, 500, 100, extra="cc"),  # exactly the reserve, at the auction's start
        bid(10, 2, 500, 1_000),  # same price later, at the expiry: loses the tie
        bid(10, 3, 499, 500),  # below the reserve
        bid(10, 4, 900, 1_001),  # after the expiry
        bid(11, 5, 70, 6_000, channel="channel-7", url="https://x.com/a?query=1&channel_id=77"),
        bid(11, 4, 70, 6_000, channel="channel-8", url="https://x.com/a?query=1"),
        bid(11, 6, 80, 4_999, channel="APPLE"),  # before the auction opened
        bid(12, 7, 5, 20_000),
        bid(12, 7, 5, 30_000),  # exactly 10 s later: same session
        bid(12, 7, 5, 40_001),  # more than 10 s later: a new session
        bid(13, 8, 40, 19_999),
        bid(13, 9, 40, 19_999),  # tie with the previous one for q7's window maximum
    ]
    kinds = (("person", persons, PERSON_SCHEMA), ("auction", auctions, AUCTION_SCHEMA),
             ("bid", bids, BID_SCHEMA))
    out = {}
    for name, rows, schema in kinds:
        cols = {f.name: pa.array([r[f.name] for r in rows], pa.int64() if
                                 pa.types.is_timestamp(f.type) else f.type).cast(f.type)
                for f in schema}
        out[name] = pa.table(cols, schema=schema)
    return out


def test_handcrafted_boundaries() -> None:
    tables = _handcrafted()
    n_bids = tables["bid"].num_rows
    tables["side_input"] = side_input(12)  # keys 0..11: auctions 10, 11 match, 12, 13 do not
    tables["bid_proc_time"] = pa.table(
        {"p_time": pa.array([T0 + 4_000 * (i // 4) for i in range(n_bids)],
                            pa.int64()).cast(pa.timestamp("ms"))})
    events = {k: _ms_columns(t).to_pylist() for k, t in tables.items()}
    results = reference_results(tables)
    for query, oracle in ORACLES.items():
        assert Counter(_rows(results[query])) == Counter(oracle(events)), query
    winners = {(r[0], r[11], r[12]) for r in _rows(results["q9"])}
    assert winners == {(10, 1, 500), (11, 4, 70), (12, 7, 5)}
    assert _rows(results["q4"]) == [(10, 285.0), (11, 5.0)]
    assert {r[:2] for r in _rows(results["q11"]) if r[0] == 7} == {(7, 2), (7, 1)}
    assert {(r[0], r[2]) for r in _rows(results["q7"]) if r[1] == 40} == {(13, 8), (13, 9)}
    # the channel-8 bid has neither a hot channel nor a channel_id: dropped
    assert sorted((r[1], r[4]) for r in _rows(results["q21"])) == [
        (1, "1"), (2, "1"), (3, "1"), (4, "1"), (5, "77"), (6, "0"),
        (7, "1"), (7, "1"), (7, "1"), (8, "1"), (9, "1"),
    ]
    assert {(r[0], r[2]) for r in _rows(results["q8"])} == {(1, T0), (2, T0), (3, T0 + 10_000)}
    # bids stamped 0, 4, 8 s (4 per step): steps 0-2 fill the first 10 s window
    assert sum(r[1] for r in _rows(results["q12"]) if r[2] == T0) == n_bids
    assert {r[4] for r in _rows(results["q13"])} == {"10", "11"}  # 12, 13 are not keys


def test_every_query_has_an_oracle() -> None:
    assert set(ORACLES) == set(QUERIES)


@pytest.mark.parametrize("query", list(ORACLES))
def test_sql_matches_naive_oracle(stream: Any, query: str) -> None:
    _, events, results = stream
    table = results[query]
    assert table.schema == QUERY_SCHEMAS[query]
    assert Counter(_rows(table)) == Counter(ORACLES[query](events))


def test_oracles_see_nontrivial_results(stream: Any) -> None:
    """Guard against vacuous agreement: every query has rows on the test streams."""
    _, events, results = stream
    for query in QUERIES:
        assert results[query].num_rows > 0, query
    assert len(_winners(events)) > 10


def test_results_only_for_requested_queries() -> None:
    tables = NexmarkGenerator(seed=1).tables(2000)
    assert list(reference_results(tables, "q2")) == ["q2"]
    assert list(reference_results(tables, ["q7", "q1"])) == ["q7", "q1"]
    with pytest.raises(ValueError, match="q99"):
        reference_results(tables, ["q99"])
    # without their extra tables, q12 and q13 are left out of "all" and refused by name
    assert "q12" not in reference_results(tables) and "q13" not in reference_results(tables)
    with pytest.raises(ValueError, match="side_input"):
        reference_results(tables, ["q13"])


def test_missing_kinds_are_empty_and_record_batches_accepted() -> None:
    batch = NexmarkGenerator(seed=1).generate(0, 500)
    result = reference_results({"bid": batch.bid}, ["q0", "q3"])
    assert result["q0"].num_rows == batch.bid.num_rows
    assert result["q3"].num_rows == 0 and result["q3"].schema == QUERY_SCHEMAS["q3"]


def test_bad_event_schema_is_reported() -> None:
    with pytest.raises(ValueError, match="bid"):
        reference_results({"bid": pa.table({"x": [1]})}, ["q0"])


def test_missing_duckdb_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_duckdb(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "duckdb":
            raise ImportError("No module named 'duckdb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_duckdb)
    with pytest.raises(ImportError, match=r"pip install dbsp\[verify\]"):
        reference_results({}, ["q0"])


# --- compare_results ----------------------------------------------------------------------------


def _table(rows: list[tuple[Any, ...]], names: tuple[str, ...] = ("k", "s", "x")) -> pa.Table:
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})


BASE = [(1, "a", 0.5), (2, "b", 1.25), (2, "b", 1.25), (3, None, -7.0), (4, "d", math.nan)]


def test_equal_tables_in_any_order() -> None:
    shuffled = BASE[:]
    random.Random(1).shuffle(shuffled)
    assert compare_results(_table(BASE), _table(shuffled)) == []
    reordered = _table(shuffled).select(["x", "k", "s"])
    assert compare_results(_table(BASE), reordered) == []


def test_missing_and_extra_rows_with_multiplicities() -> None:
    diff = compare_results(_table(BASE), _table(BASE[:1] + BASE[2:] + [(5, "e", 1.0)]))
    assert diff[0].startswith("1 row(s) missing from actual (1 distinct), 1 unexpected row(s)")
    assert any("missing x1 (expected multiplicity 2, actual 1)" in d and "'b'" in d for d in diff)
    assert any("unexpected x1 (expected multiplicity 0, actual 1)" in d and "'e'" in d
               for d in diff)


def test_changed_value_is_one_missing_and_one_unexpected() -> None:
    changed = [(1, "a", 0.5), (2, "b", 1.25), (2, "b", 1.25), (3, "c", -7.0), (4, "d", math.nan)]
    diff = compare_results(_table(BASE), _table(changed))
    assert len(diff) == 3
    assert "None" in diff[1] and "'c'" in diff[2]


def test_float_tolerance() -> None:
    close = [(k, s, x * (1 + 1e-12)) for k, s, x in BASE]
    assert compare_results(_table(BASE), _table(close)) == []
    far = [(k, s, x * (1 + 1e-6)) for k, s, x in BASE]
    diff = compare_results(_table(BASE), _table(far))
    assert diff and "4 row(s) missing" in diff[0]  # NaN still matches NaN
    assert compare_results(_table(BASE), _table(far), rel_tol=1e-5) == []


def test_weight_columns() -> None:
    consolidated = _table([(1, "a", 0.5), (2, "b", 1.25), (3, None, -7.0), (4, "d", math.nan)])
    consolidated = consolidated.append_column("weight", pa.array([1, 2, 1, 1], pa.int64()))
    assert compare_results(_table(BASE), consolidated, actual_weight="weight") == []
    wrong = consolidated.set_column(3, "weight", pa.array([1, 3, 1, -1], pa.int64()))
    diff = compare_results(_table(BASE), wrong, actual_weight="weight")
    assert any("unexpected x1 (expected multiplicity 2, actual 3)" in d for d in diff)
    assert any("missing x2 (expected multiplicity 1, actual -1)" in d for d in diff)
    assert compare_results(consolidated, _table(BASE), expected_weight="weight") == []


def test_schema_differences() -> None:
    assert "columns differ" in compare_results(_table(BASE), _table(BASE, ("k", "s", "y")))[0]
    narrow = _table(BASE).cast(pa.schema([("k", pa.int32()), ("s", pa.string()),
                                          ("x", pa.float64())]))
    assert compare_results(_table(BASE), narrow) == [
        "column 'k' has type int32, expected int64"
    ]


def test_at_most_max_shown_rows() -> None:
    expected = _table([(i, "v", 0.0) for i in range(50)])
    diff = compare_results(expected, _table([]).cast(expected.schema), max_shown=5)
    assert len(diff) == 1 + 5 + 1
    assert diff[-1] == "... and 45 more differing row(s)"


def test_compares_query_results(stream: Any) -> None:
    """The comparator on real results: equal to itself, finds one dropped row of q9."""
    _, _, results = stream
    q9 = results["q9"]
    assert compare_results(q9, q9.take(list(range(q9.num_rows))[::-1])) == []
    diff = compare_results(q9, q9.slice(1))
    assert diff[0].startswith("1 row(s) missing from actual (1 distinct), 0 unexpected")

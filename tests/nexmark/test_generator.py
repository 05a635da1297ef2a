"""Tests of ``dbsp.nexmark.generator``: determinism, chunk invariance, the event model."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import dbsp.nexmark.generator as G
from dbsp.nexmark.generator import (
    AUCTION_SCHEMA,
    BID_SCHEMA,
    PERSON_SCHEMA,
    NexmarkConfig,
    NexmarkGenerator,
    collect_tables,
)

GEN = NexmarkGenerator(seed=42)
N_EVENTS = 60_000  # 6 s of event time at the default rate


@pytest.fixture(scope="module")
def events() -> dict[str, pa.Table]:
    return GEN.tables(N_EVENTS, chunk=17_000)


def _np(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return column.to_numpy()


def _event_numbers(gen: NexmarkGenerator, start: int, count: int) -> dict[str, np.ndarray]:
    n = np.arange(start, start + count, dtype=np.int64)
    kind = gen.event_kind(n)
    return {"person": n[kind == 0], "auction": n[kind == 1], "bid": n[kind == 2]}


def _assert_same(a: G.NexmarkBatch, b: G.NexmarkBatch) -> None:
    for kind in ("person", "auction", "bid"):
        x, y = a.as_dict()[kind], b.as_dict()[kind]
        assert x.schema == y.schema
        assert x.equals(y), kind


# --- schemas and determinism ------------------------------------------------------------------


def test_schemas_are_exact() -> None:
    batch = GEN.generate(0, 500)
    assert batch.person.schema == PERSON_SCHEMA
    assert batch.auction.schema == AUCTION_SCHEMA
    assert batch.bid.schema == BID_SCHEMA
    assert BID_SCHEMA.field("date_time").type == pa.timestamp("ms")
    assert AUCTION_SCHEMA.field("expires").type == pa.timestamp("ms")
    for rb in batch.as_dict().values():
        rb.validate(full=True)
        assert rb.num_rows > 0
        assert all(rb.column(i).null_count == 0 for i in range(rb.num_columns))


def test_empty_chunk_has_the_schemas() -> None:
    batch = GEN.generate(123, 0)
    assert batch.num_rows == 0
    assert batch.person.schema == PERSON_SCHEMA and batch.bid.schema == BID_SCHEMA


def test_same_seed_same_events_other_seed_other_events() -> None:
    _assert_same(NexmarkGenerator(seed=42).generate(1000, 3000), GEN.generate(1000, 3000))
    other = NexmarkGenerator(seed=43).generate(1000, 3000)
    assert not other.bid.equals(GEN.generate(1000, 3000).bid)
    # ids and times do not depend on the seed, everything random does
    assert other.bid.column("date_time").equals(GEN.generate(1000, 3000).bid.column("date_time"))


@settings(max_examples=30)
@given(
    start=st.integers(0, 200_000),
    sizes=st.lists(st.integers(0, 700), min_size=1, max_size=8),
)
@example(start=0, sizes=[1, 1, 1, 47, 50])
@example(start=49, sizes=[1, 3, 0, 2])
def test_chunking_does_not_change_events(start: int, sizes: list[int]) -> None:
    total = sum(sizes)
    whole = GEN.generate(start, total)
    pieces = []
    lo = start
    for size in sizes:
        pieces.append(GEN.generate(lo, size))
        lo += size
    joined = collect_tables(pieces)
    for kind, table in joined.items():
        assert table.equals(pa.Table.from_batches([whole.as_dict()[kind]])), kind


def test_iter_batches_covers_the_range() -> None:
    batches = list(GEN.iter_batches(1234, chunk=500, start_event=10))
    assert [(b.start_event, b.count) for b in batches] == [(10, 500), (510, 500), (1010, 234)]
    whole = GEN.generate(10, 1234)
    for kind, table in collect_tables(batches).items():
        assert table.equals(pa.Table.from_batches([whole.as_dict()[kind]])), kind


def test_generate_numeric_matches_generate() -> None:
    numeric = GEN.generate_numeric(777, 5000)
    batch = GEN.generate(777, 5000)
    for kind, cols in numeric.items():
        rb = batch.as_dict()[kind]
        for name, values in cols.items():
            assert values.dtype == np.int64
            np.testing.assert_array_equal(values, _np(pa.Table.from_batches([rb]), name))


def test_string_fallback_without_string_view_is_identical(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = NexmarkGenerator(seed=5, avg_bid_byte_size=40)  # short extras: inline string views
    with_views = gen.generate(0, 3000)
    monkeypatch.setattr(G, "_HAS_STRING_VIEW", False)
    _assert_same(gen.generate(0, 3000), with_views)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        GEN.generate(-1, 10)
    with pytest.raises(ValueError):
        GEN.generate(0, -1)
    with pytest.raises(ValueError):
        NexmarkGenerator(first_event_rate=0)
    with pytest.raises(ValueError):
        NexmarkConfig(hot_auction_ratio=0)
    with pytest.raises(TypeError):
        NexmarkGenerator(no_such_option=1)
    with pytest.raises(ValueError):
        list(GEN.iter_batches(10, chunk=0))


# --- the event model ------------------------------------------------------------------------


@pytest.mark.parametrize("start,count", [(0, 50), (0, 5000), (13, 4321), (10_049, 1)])
def test_event_mix(start: int, count: int) -> None:
    batch = GEN.generate(start, count)
    expected = _event_numbers(GEN, start, count)
    assert batch.person.num_rows == len(expected["person"])
    assert batch.auction.num_rows == len(expected["auction"])
    assert batch.bid.num_rows == len(expected["bid"])
    if count % 50 == 0 and start % 50 == 0:
        k = count // 50
        assert (batch.person.num_rows, batch.auction.num_rows, batch.bid.num_rows) == (
            k, 3 * k, 46 * k,
        )


def test_ids_follow_the_interleaving(events: dict[str, pa.Table]) -> None:
    numbers = _event_numbers(GEN, 0, N_EVENTS)
    person_ids = _np(events["person"], "id")
    auction_ids = _np(events["auction"], "id")
    np.testing.assert_array_equal(person_ids, 1000 + np.arange(len(person_ids)))
    np.testing.assert_array_equal(auction_ids, 1000 + np.arange(len(auction_ids)))
    np.testing.assert_array_equal(GEN.person_event_number(person_ids), numbers["person"])
    np.testing.assert_array_equal(GEN.auction_event_number(auction_ids), numbers["auction"])


def test_timestamps(events: dict[str, pa.Table]) -> None:
    numbers = _event_numbers(GEN, 0, N_EVENTS)
    for kind, table in events.items():
        ts = _np(table, "date_time")
        np.testing.assert_array_equal(ts, G.BASE_TIME_MS + numbers[kind] // 10)  # 100 µs apart
    slow = NexmarkGenerator(seed=1, first_event_rate=3, base_time_ms=0).generate(0, 10)
    bid_times = _np(pa.Table.from_batches([slow.bid]), "date_time")
    np.testing.assert_array_equal(bid_times, (np.arange(4, 10) * 1000) // 3)


def test_referential_integrity(events: dict[str, pa.Table]) -> None:
    numbers = _event_numbers(GEN, 0, N_EVENTS)
    person_ids = set(_np(events["person"], "id").tolist())
    auction_ids = _np(events["auction"], "id")
    created_at = _np(events["auction"], "date_time").tolist()
    auction_time = dict(zip(auction_ids.tolist(), created_at, strict=True))

    seller = _np(events["auction"], "seller")
    assert set(seller.tolist()) <= person_ids
    assert (GEN.person_event_number(seller) < numbers["auction"]).all()

    bid_auction = _np(events["bid"], "auction")
    bidder = _np(events["bid"], "bidder")
    assert set(bid_auction.tolist()) <= set(auction_ids.tolist())
    assert set(bidder.tolist()) <= person_ids
    assert (GEN.auction_event_number(bid_auction) < numbers["bid"]).all()
    assert (GEN.person_event_number(bidder) < numbers["bid"]).all()
    bid_time = _np(events["bid"], "date_time")
    created = np.array([auction_time[a] for a in bid_auction.tolist()])
    assert (created <= bid_time).all()


def test_auction_fields(events: dict[str, pa.Table]) -> None:
    a = events["auction"]
    assert (_np(a, "expires") > _np(a, "date_time")).all()
    category = _np(a, "category")
    assert category.min() == 10 and category.max() == 14
    assert set(np.unique(category).tolist()) == {10, 11, 12, 13, 14}
    initial, reserve = _np(a, "initial_bid"), _np(a, "reserve")
    assert (initial >= 100).all() and (initial <= 100_000_000).all()
    assert (reserve >= initial + 100).all()
    # auctions last about twice the time to open 100 more auctions: ~1666 events = 166 ms
    length = _np(a, "expires") - _np(a, "date_time")
    assert 1 <= length.min() and length.max() <= 2 * 167 + 1
    assert 130 < length.mean() < 200
    for name, limit in (("item_name", 19), ("description", 99)):
        lengths = pc.binary_length(a.column(name)).to_numpy()
        assert lengths.max() <= limit
        assert pc.all(pc.equal(a.column(name), pc.ascii_trim(a.column(name), " "))).as_py()


def test_bid_and_person_fields(events: dict[str, pa.Table]) -> None:
    b, p = events["bid"], events["person"]
    price = _np(b, "price")
    assert price.min() >= 100 and price.max() <= 100_000_000
    # log-uniform: about a third of the prices in each of [1e2,1e4), [1e4,1e6), [1e6,1e8]
    thirds = np.histogram(np.log10(price), bins=[2, 4, 6, 8.01])[0] / len(price)
    assert np.allclose(thirds, 1 / 3, atol=0.02)
    assert set(p.column("state").to_pylist()) == set(G.US_STATES)
    assert set(p.column("city").to_pylist()) == set(G.US_CITIES)
    card = re.compile(r"^\d{4} \d{4} \d{4} \d{4}$")
    assert all(card.match(c) for c in p.column("credit_card").to_pylist())
    email = re.compile(r"^[a-z ]{0,6}@[a-z ]{0,4}\.com$")
    assert all(email.match(e) for e in p.column("email_address").to_pylist())
    names = {f"{first} {last}" for first in G.FIRST_NAMES for last in G.LAST_NAMES}
    assert set(p.column("name").to_pylist()) <= names
    url = re.compile(r"^https://www\.nexmark\.com/[a-z_]{3,4}/[a-z_]{3,4}/[a-z_]{3,4}/"
                     r"item\.htm\?query=1(&channel_id=\d+)?$")
    channels = b.column("channel").to_pylist()
    urls = b.column("url").to_pylist()
    assert all(url.match(u) for u in set(urls))
    hot = np.isin(np.array(channels, dtype=object), G.HOT_CHANNELS)
    assert 0.98 < hot.mean() < 1.0  # hot_channels_ratio = 100
    cold = [c for c in channels if c not in G.HOT_CHANNELS]
    assert all(re.match(r"^channel-\d+$", c) for c in cold)
    # one URL per channel
    assert len(set(zip(channels, urls, strict=True))) == len(set(channels))


def test_extra_sizes(events: dict[str, pa.Table]) -> None:
    extra = pc.binary_length(events["bid"].column("extra")).to_numpy()
    # bid: 100 - 4 * 8 = 68 bytes on average, 68 - 14 .. 68 + 13
    assert extra.min() >= 54 and extra.max() <= 81 and abs(extra.mean() - 68) < 1
    letters = pc.match_substring_regex(events["bid"].column("extra"), r"^[a-z]*$")
    assert pc.all(letters).as_py()
    a = events["auction"]
    size = (
        8 + 5 * 8
        + pc.binary_length(a.column("item_name")).to_numpy()
        + pc.binary_length(a.column("description")).to_numpy()
        + pc.binary_length(a.column("extra")).to_numpy()
    )
    assert abs(size.mean() - 500) < 10
    p = events["person"]
    size = 8 + sum(
        pc.binary_length(p.column(c)).to_numpy()
        for c in ("name", "email_address", "credit_card", "city", "state", "extra")
    )
    assert abs(size.mean() - 200) < 5


def test_hot_skew(events: dict[str, pa.Table]) -> None:
    numbers = _event_numbers(GEN, 0, N_EVENTS)["bid"]
    auction = _np(events["bid"], "auction") - 1000
    last_auction = (numbers // 50) * 3 + 2
    hot_auction = (last_auction // 100) * 100
    assert 0.48 < (auction == hot_auction).mean() < 0.54  # 1/2 hot + uniform hits
    assert ((auction <= last_auction) & (auction >= last_auction - 100)).all()
    bidder = _np(events["bid"], "bidder") - 1000
    last_person = numbers // 50
    hot_bidder = np.minimum((last_person // 100) * 100 + 1, last_person)
    assert 0.74 < (bidder == hot_bidder).mean() < 0.78  # 3/4 hot
    seller = _np(events["auction"], "seller") - 1000
    last_person = _event_numbers(GEN, 0, N_EVENTS)["auction"] // 50
    assert 0.73 < (seller == (last_person // 100) * 100).mean() < 0.78
    assert (seller >= last_person - 1000).all()

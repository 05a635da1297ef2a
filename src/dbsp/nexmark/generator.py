"""Deterministic, vectorised generator of Nexmark events (persons, auctions, bids).

Nexmark models an online auction house: people register (``person``), open auctions
(``auction``) and bid on them (``bid``).  This module reproduces the event *model* of the
standard Java/Flink Nexmark generator (the ``nexmark`` benchmark suite, itself derived from
Apache Beam's) with numpy and pyarrow: every chunk of events is built column by column, with
no per-event Python code, and comes out as three Arrow record batches.

Goals
-----
* **Deterministic and chunk-invariant.**  Every random draw is a counter-based hash of
  ``(seed, event number, field)`` (a splitmix64 finaliser), so event ``n`` is a pure function of
  the seed, the configuration and ``n``: ``generate(0, 10)`` equals ``generate(0, 3)`` followed by
  ``generate(3, 7)``, for any split.  String pools are built from the same hash, so nothing depends
  on numpy's or Python's random streams.
* **Fast.**  Numeric columns cost a few tens of numpy operations per chunk (well above 5M
  events/s on one core); strings are slices of pre-built random character pools assembled by
  Arrow kernels (see ``bench/workloads/bench_nexmark_generator.py``).

The model (as in the reference generator)
-----------------------------------------
* Events are numbered ``0, 1, 2, ...``.  Out of every ``50`` consecutive events (one *epoch*)
  the first is a person, the next 3 are auctions and the last 46 are bids
  (``PERSON_PROPORTION : AUCTION_PROPORTION : BID_PROPORTION = 1 : 3 : 46``).
* Ids follow the interleaving: the person of epoch ``e`` has id ``FIRST_PERSON_ID + e``, its
  auctions have ids ``FIRST_AUCTION_ID + 3e + {0, 1, 2}`` (``FIRST_*_ID = 1000``).
* Event ``n`` happens at ``date_time = base_time_ms + floor(n * 1000 / first_event_rate)`` ms
  (default rate 10,000 events/s, i.e. 100 µs between events; the base time is fixed, so results
  are reproducible).
* **Auction**: the seller is, with probability ``1 - 1/hot_sellers_ratio`` (3/4), the *hot
  seller* of the current batch of ``HOT_SELLER_RATIO = 100`` persons (the first person of that
  batch), otherwise a uniformly chosen person among the ``num_active_people`` (1000) most recent
  ones.  ``category`` is uniform in ``10..14``; ``initial_bid`` is a price; ``reserve`` is
  ``initial_bid`` plus another price; ``expires = date_time + 1 + U[0, 2h)`` where ``h`` is the
  time it takes to generate ``num_in_flight_auctions`` (100) more auctions.  ``item_name`` and
  ``description`` are random lower-case strings (up to 20 / 100 characters, one in 13 characters
  a space, trimmed).
* **Bid**: the auction is, with probability ``1 - 1/hot_auction_ratio`` (1/2), the *hot
  auction* of the current batch of ``HOT_AUCTION_RATIO = 100`` auctions (the first of the batch),
  otherwise uniform among the last ``num_in_flight_auctions`` auctions; the bidder is, with
  probability ``1 - 1/hot_bidders_ratio`` (3/4), the *hot bidder* (the second person of the current
  batch of ``HOT_BIDDER_RATIO = 100`` persons, so hot bidders and hot sellers differ), otherwise a
  recent person as for sellers.  ``channel``/``url`` is, with probability
  ``1 - 1/hot_channels_ratio`` (99/100), one of the four hot channels (Google, Facebook, Baidu,
  Apple), otherwise one of ``CHANNELS_NUMBER = 10,000`` channels ``channel-<i>`` whose URL carries
  ``&channel_id=<|reverse32(i)|>`` nine times in ten.  URLs look like
  ``https://www.nexmark.com/<dir1>/<dir2>/<dir3>/item.htm?query=1``.
* **Prices** are ``round(10 ** (6 u) * 100)`` for ``u`` uniform in ``[0, 1)``: 100 .. 10^8 cents,
  log-uniform.
* **Person**: ``name`` is "<first> <last>" from fixed name lists, ``email_address`` is
  "<3-6 chars>@<3-4 chars>.com", ``credit_card`` four groups of four digits, ``city`` and ``state``
  drawn independently from fixed lists of western US cities and states.
* ``extra`` pads every event to an average size (200 / 500 / 100 bytes for person / auction /
  bid): its length is ``r - d + U[0, 2d)`` where ``r`` is the average minus the size of the other
  fields (8 bytes per number) and ``d = round(0.2 r)``; its characters are random lower-case
  letters.

Deliberate deviations from the reference
----------------------------------------
* The reference lets a random person id run up to ``PERSON_ID_LEAD = 10`` ahead of the last
  person created (it simulates out-of-order arrival) and the hot bidder of a batch may not exist
  yet.  Here every reference points to an entity created by an *earlier* event: no lead, and the
  hot bidder falls back to the first person of the batch while the batch has only one person.
  The engine's joins therefore see every foreign key.
* Random draws come from counter-based hashing instead of ``java.util.Random`` seeded per
  event, so the values differ from the Java generator's while their distributions match.
* The multi-generator / rate-shape / out-of-order options of the reference are not modelled:
  one generator, a constant rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "AUCTION_SCHEMA",
    "BASE_TIME_MS",
    "BID_SCHEMA",
    "FIRST_AUCTION_ID",
    "FIRST_CATEGORY_ID",
    "FIRST_PERSON_ID",
    "NUM_CATEGORIES",
    "PERSON_SCHEMA",
    "EventReader",
    "NexmarkBatch",
    "NexmarkConfig",
    "NexmarkGenerator",
    "collect_tables",
]

# ---------------------------------------------------------------------------------------------
# Constants of the model
# ---------------------------------------------------------------------------------------------

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5

HOT_AUCTION_RATIO = 100  # a hot auction is the first of each batch of this many auctions
HOT_BIDDER_RATIO = 100  # a hot bidder is the second person of each batch of this many persons
HOT_SELLER_RATIO = 100  # a hot seller is the first person of each batch of this many persons

CHANNELS_NUMBER = 10_000
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")

US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = (
    "Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland",
    "Bend", "Redmond", "Seattle", "Kent", "Cheyenne",
)
FIRST_NAMES = (
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
)
LAST_NAMES = (
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
)

#: Default base time: 2015-07-15T00:00:00Z (a multiple of every window size used by the queries).
BASE_TIME_MS = 1_436_918_400_000

_MIN_STRING_LENGTH = 3
_SPECIAL_ONE_IN = 13  # one character in 13 of a "next string" is the special character
_POOL_SIZE = 1 << 20  # distinct start offsets of random strings

_TS = pa.timestamp("ms")

# Every field of every event is always present: the schemas say so (non-null int64 keys get
# the engine's uint64 key-code fast path).
PERSON_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("email_address", pa.string(), nullable=False),
        pa.field("credit_card", pa.string(), nullable=False),
        pa.field("city", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("date_time", _TS, nullable=False),
        pa.field("extra", pa.string(), nullable=False),
    ]
)
AUCTION_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("item_name", pa.string(), nullable=False),
        pa.field("description", pa.string(), nullable=False),
        pa.field("initial_bid", pa.int64(), nullable=False),
        pa.field("reserve", pa.int64(), nullable=False),
        pa.field("date_time", _TS, nullable=False),
        pa.field("expires", _TS, nullable=False),
        pa.field("seller", pa.int64(), nullable=False),
        pa.field("category", pa.int64(), nullable=False),
        pa.field("extra", pa.string(), nullable=False),
    ]
)
BID_SCHEMA = pa.schema(
    [
        pa.field("auction", pa.int64(), nullable=False),
        pa.field("bidder", pa.int64(), nullable=False),
        pa.field("price", pa.int64(), nullable=False),
        pa.field("channel", pa.string(), nullable=False),
        pa.field("url", pa.string(), nullable=False),
        pa.field("date_time", _TS, nullable=False),
        pa.field("extra", pa.string(), nullable=False),
    ]
)

#: q13's bounded side input: ``key`` 0 .. n-1 with its ``value`` (the key as a string).
SIDE_INPUT_SCHEMA = pa.schema(
    [pa.field("key", pa.int64(), nullable=False), pa.field("value", pa.string(), nullable=False)]
)


def side_input(n: int = 10_000) -> pa.Table:
    """The side input table of q13: keys ``0 .. n-1``, each with its decimal string."""
    if n <= 0:
        raise ValueError(f"side_input needs n > 0, got {n}")
    keys = pa.array(np.arange(n, dtype=np.int64))
    return pa.table([keys, keys.cast(pa.string())], schema=SIDE_INPUT_SCHEMA)


# ---------------------------------------------------------------------------------------------
# Counter-based random numbers
# ---------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_U32 = np.uint64(0xFFFFFFFF)


def _mix_int(x: int) -> int:
    """splitmix64 finaliser on a Python int (used to derive per-field salts)."""
    x &= _M64
    x ^= x >> 30
    x = (x * _MIX1) & _M64
    x ^= x >> 27
    x = (x * _MIX2) & _M64
    x ^= x >> 31
    return x


def _mix_inplace(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array, in place (wrapping arithmetic)."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(_MIX1)
    x ^= x >> np.uint64(27)
    x *= np.uint64(_MIX2)
    x ^= x >> np.uint64(31)
    return x


# Field streams: every random quantity of an event kind has its own salt.  Each hash gives
# 64 bits, used as two independent 32-bit draws (``hi``/``lo``) or one 53-bit float.
_P_NAME, _P_EMAIL_LEN, _P_EMAIL_OFF, _P_CARD, _P_CARD2, _P_PLACE, _P_EXTRA = range(7)
_A_SELLER, _A_MISC, _A_PRICE1, _A_PRICE2, _A_NAME, _A_DESC, _A_EXTRA = range(7, 14)
_B_AUCTION, _B_BIDDER, _B_PRICE, _B_CHANNEL, _B_EXTRA = range(14, 19)
_POOL_LETTERS, _POOL_SPACED, _POOL_UNDERSCORE, _CHANNEL_URL, _CHANNEL_ID = range(19, 24)


def _hashes(n: np.ndarray, salts: np.ndarray) -> np.ndarray:
    """Hash every ``(salts[j], n[i])`` pair: a ``(len(salts), len(n))`` uint64 matrix.

    Row ``j`` is the random stream of field ``j``: ``h[j, i] = mix(n[i] * phi + salts[j])``.
    """
    h = n.astype(np.uint64)[None, :] * np.uint64(_GOLDEN) + salts[:, None]
    return _mix_inplace(h)


def _below(bits32: np.ndarray, m: Any) -> np.ndarray:
    """Uniform integers in ``[0, m)`` from 32 random bits (``m`` < 2**32, scalar or array)."""
    return ((bits32 * np.asarray(m, dtype=np.uint64)) >> np.uint64(32)).astype(np.int64)


def _hi(h: np.ndarray) -> np.ndarray:
    return h >> np.uint64(32)


def _lo(h: np.ndarray) -> np.ndarray:
    return h & _U32


def _unit(h: np.ndarray) -> np.ndarray:
    """Uniform float64 in ``[0, 1)`` from the top 53 bits."""
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _price(h: np.ndarray) -> np.ndarray:
    """Reference price distribution: ``round(10 ** (6u) * 100)`` cents."""
    return np.floor(np.power(10.0, _unit(h) * 6.0) * 100.0 + 0.5).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Strings from pools
# ---------------------------------------------------------------------------------------------

_HAS_STRING_VIEW = hasattr(pa, "string_view")


def _char_pool(salt: int, size: int, special: int | None) -> np.ndarray:
    """``size`` random lower-case ASCII letters; one in 13 is ``special`` when given."""
    h = _hashes(np.arange(size, dtype=np.int64), np.array([salt], dtype=np.uint64))[0]
    chars = (np.uint64(ord("a")) + ((_lo(h) * np.uint64(26)) >> np.uint64(32))).astype(np.uint8)
    if special is not None:
        chars[((_hi(h) * np.uint64(_SPECIAL_ONE_IN)) >> np.uint64(32)) == 0] = special
    return chars


class _Pool:
    """A buffer of random characters; strings are ``pool[offset : offset + length]`` slices."""

    def __init__(self, chars: np.ndarray) -> None:
        self.chars = np.ascontiguousarray(chars, dtype=np.uint8)
        self.buffer = pa.py_buffer(self.chars)
        padded = np.concatenate([self.chars, np.zeros(16, np.uint8)])
        # little-endian 4-byte prefix at every offset (string_view header)
        self._prefix = np.lib.stride_tricks.sliding_window_view(padded, 4)[: len(self.chars)]
        self._prefix = np.ascontiguousarray(self._prefix).view("<i4").ravel()
        self._window12 = np.lib.stride_tricks.sliding_window_view(padded, 12)[: len(self.chars)]

    def slices(self, offsets: np.ndarray, lengths: np.ndarray) -> pa.Array:
        """A string array whose element ``i`` is ``pool[offsets[i] : offsets[i] + lengths[i]]``."""
        n = len(offsets)
        offsets = offsets.astype(np.int32, copy=False)
        lengths = lengths.astype(np.int32, copy=False)
        if not _HAS_STRING_VIEW:  # pragma: no cover - pyarrow < 16
            return self._slices_copy(offsets, lengths)
        views = np.zeros((n, 4), dtype=np.int32)
        views[:, 0] = lengths
        views[:, 1] = self._prefix[offsets]
        views[:, 3] = offsets
        short = lengths <= 12
        if short.any():  # Arrow stores strings of <= 12 bytes inline in the view
            idx = np.flatnonzero(short)
            inline = self._window12[offsets[idx]].copy()
            inline[np.arange(12)[None, :] >= lengths[idx, None]] = 0
            views.view(np.uint8).reshape(n, 16)[idx, 4:16] = inline
        arr = pa.Array.from_buffers(
            pa.string_view(), n, [None, pa.py_buffer(views), self.buffer]
        )
        return arr.cast(pa.string())

    def _slices_copy(self, offsets: np.ndarray, lengths: np.ndarray) -> pa.Array:
        ends = np.zeros(len(offsets) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
        gather = np.repeat(offsets.astype(np.int64) - ends[:-1], lengths)
        gather += np.arange(ends[-1], dtype=np.int64)
        data = self.chars[gather]
        buffers = [None, pa.py_buffer(ends.astype(np.int32)), pa.py_buffer(data)]
        return pa.Array.from_buffers(pa.string(), len(offsets), buffers)


def _fixed_width_strings(matrix: np.ndarray) -> pa.Array:
    """A string array from an ``(n, w)`` uint8 matrix of ASCII bytes (every string w bytes)."""
    n, w = matrix.shape
    offsets = np.arange(0, (n + 1) * w, w, dtype=np.int32)
    data = np.ascontiguousarray(matrix).ravel()
    return pa.Array.from_buffers(
        pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _timestamps(ms: np.ndarray) -> pa.Array:
    ms = np.ascontiguousarray(ms, dtype=np.int64)
    return pa.Array.from_buffers(_TS, len(ms), [None, pa.py_buffer(ms)])


def _int64(values: np.ndarray) -> pa.Array:
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def _reverse_bits32(x: np.ndarray) -> np.ndarray:
    """Bit reversal of 32-bit unsigned integers (``Integer.reverse`` of the reference)."""
    x = x.astype(np.uint32)
    for shift, mask in ((1, 0x55555555), (2, 0x33333333), (4, 0x0F0F0F0F), (8, 0x00FF00FF)):
        s, m = np.uint32(shift), np.uint32(mask)
        x = ((x >> s) & m) | ((x & m) << s)
    return (x >> np.uint32(16)) | (x << np.uint32(16))


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NexmarkConfig:
    """Parameters of the event model; the defaults are those of the reference generator."""

    first_event_rate: int = 10_000  #: events per second of event time
    base_time_ms: int = BASE_TIME_MS  #: ``date_time`` of event 0, epoch milliseconds
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    num_active_people: int = 1000  #: non-hot persons are drawn among this many most recent ones
    num_in_flight_auctions: int = 100  #: non-hot bids go to one of this many most recent auctions
    hot_auction_ratio: int = 2  #: P(bid on the hot auction) = 1 - 1/ratio
    hot_sellers_ratio: int = 4  #: P(auction by the hot seller) = 1 - 1/ratio
    hot_bidders_ratio: int = 4  #: P(bid by the hot bidder) = 1 - 1/ratio
    hot_channels_ratio: int = 100  #: P(bid through a hot channel) = 1 - 1/ratio
    avg_person_byte_size: int = 200
    avg_auction_byte_size: int = 500
    avg_bid_byte_size: int = 100

    def __post_init__(self) -> None:
        if self.first_event_rate <= 0:
            raise ValueError(f"first_event_rate must be positive, got {self.first_event_rate}")
        for name in ("person_proportion", "auction_proportion", "bid_proportion"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in (
            "num_active_people", "num_in_flight_auctions", "hot_auction_ratio",
            "hot_sellers_ratio", "hot_bidders_ratio", "hot_channels_ratio",
        ):
            if not 1 <= getattr(self, name) < 2**31:
                raise ValueError(f"{name} must be in [1, 2**31), got {getattr(self, name)}")
        for name in ("avg_person_byte_size", "avg_auction_byte_size", "avg_bid_byte_size"):
            if not 0 <= getattr(self, name) < 2**24:
                raise ValueError(f"{name} must be in [0, 2**24), got {getattr(self, name)}")

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion


@dataclass(frozen=True)
class NexmarkBatch:
    """The events ``[start_event, start_event + count)``, split by kind (each in event order)."""

    person: pa.RecordBatch
    auction: pa.RecordBatch
    bid: pa.RecordBatch
    start_event: int = 0
    count: int = 0

    def as_dict(self) -> dict[str, pa.RecordBatch]:
        return {"person": self.person, "auction": self.auction, "bid": self.bid}

    @property
    def num_rows(self) -> int:
        return self.person.num_rows + self.auction.num_rows + self.bid.num_rows


class NexmarkGenerator:
    """Seeded Nexmark event generator; see the module documentation for the model.

    ``generate(start, count)`` is a pure function of the seed, the configuration and its
    arguments, so chunks can be generated in any order, size or process.

    >>> gen = NexmarkGenerator(seed=1)
    >>> b = gen.generate(0, 100)
    >>> (b.person.num_rows, b.auction.num_rows, b.bid.num_rows)
    (2, 6, 92)
    >>> b.person.column("id").to_pylist(), b.auction.column("id").to_pylist()
    ([1000, 1001], [1000, 1001, 1002, 1003, 1004, 1005])
    """

    def __init__(
        self,
        seed: int = 0,
        first_event_rate: int = 10_000,
        *,
        config: NexmarkConfig | None = None,
        **overrides: Any,
    ) -> None:
        """Build a generator.

        ``overrides`` are :class:`NexmarkConfig` fields (``base_time_ms=...``,
        ``hot_auction_ratio=...``, ...), applied on top of ``config`` (default: the reference
        configuration) together with ``first_event_rate``.
        """
        base = config if config is not None else NexmarkConfig()
        self.config = replace(base, first_event_rate=first_event_rate, **overrides)
        self.seed = int(seed)
        self.first_event_rate = self.config.first_event_rate
        seed_key = _mix_int(_mix_int(self.seed & _M64) ^ 0x6E65786D61726B)  # "nexmark"
        self._salts = np.array(
            [_mix_int(seed_key + (i + 1) * _GOLDEN) for i in range(_CHANNEL_ID + 1)],
            dtype=np.uint64,
        )
        cfg = self.config
        longest = max(cfg.avg_person_byte_size, cfg.avg_auction_byte_size, cfg.avg_bid_byte_size)
        margin = longest + longest // 4 + 128  # > the longest extra and the longest "next string"
        salt = self._salts
        self._letters = _Pool(_char_pool(int(salt[_POOL_LETTERS]), _POOL_SIZE + margin, None))
        self._spaced = _Pool(_char_pool(int(salt[_POOL_SPACED]), _POOL_SIZE + 128, ord(" ")))
        self._underscored = _Pool(
            _char_pool(int(salt[_POOL_UNDERSCORE]), _POOL_SIZE + 128, ord("_"))
        )
        self._build_tables()

    def __repr__(self) -> str:
        return f"NexmarkGenerator(seed={self.seed}, config={self.config})"

    # -- static tables -------------------------------------------------------------------------

    def _build_tables(self) -> None:
        names = [f"{first} {last}" for first in FIRST_NAMES for last in LAST_NAMES]
        self._names = pa.array(names, pa.string())
        self._name_len = np.array([len(s) for s in names], dtype=np.int64)
        self._cities = pa.array(US_CITIES, pa.string())
        self._city_len = np.array([len(s) for s in US_CITIES], dtype=np.int64)
        self._states = pa.array(US_STATES, pa.string())
        self._state_len = np.array([len(s) for s in US_STATES], dtype=np.int64)
        # Channel table: the hot channels first, then the CHANNELS_NUMBER cached channels.
        n_urls = len(HOT_CHANNELS) + CHANNELS_NUMBER
        rows = np.arange(n_urls, dtype=np.int64)
        has_id_bits = _lo(_hashes(rows, self._salts[[_CHANNEL_ID]])[0])
        dirs = []
        for k in range(3):  # three "next string(5, '_')" path components: 3..4 characters
            hk = _hashes(rows, np.array([self._salts[_CHANNEL_URL] + np.uint64(k + 1)]))[0]
            dirs.append(
                self._underscored.slices(
                    _below(_lo(hk), _POOL_SIZE), _MIN_STRING_LENGTH + _below(_hi(hk), 2)
                )
            )
        base = pc.binary_join_element_wise(
            "https://www.nexmark.com", *dirs, "item.htm?query=1", "/"
        )
        number = np.arange(CHANNELS_NUMBER, dtype=np.int64)
        channel_id = np.abs(_reverse_bits32(number).view(np.int32).astype(np.int64))
        with_id = pc.binary_join_element_wise(
            base[len(HOT_CHANNELS):], _int64(channel_id).cast(pa.string()), "&channel_id="
        )
        has_id = _below(has_id_bits[len(HOT_CHANNELS):], 10) > 0  # nine in ten
        cached_urls = pc.if_else(pa.array(has_id), with_id, base[len(HOT_CHANNELS):])
        self._channels = pa.concat_arrays(
            [
                pa.array(HOT_CHANNELS, pa.string()),
                pc.binary_join_element_wise("channel-", _int64(number).cast(pa.string()), ""),
            ]
        )
        self._urls = pa.concat_arrays([base[: len(HOT_CHANNELS)], cached_urls])
        digits = np.array([f"{i:04d}" for i in range(10_000)], dtype="S4")
        self._four_digits = np.frombuffer(digits.tobytes(), dtype=np.uint8).reshape(10_000, 4)

    # -- event arithmetic ----------------------------------------------------------------------

    def timestamp_ms(self, event_number: np.ndarray | int) -> np.ndarray | int:
        """``date_time`` (epoch ms) of an event number (or array of them)."""
        n = np.asarray(event_number, dtype=np.int64)
        ts = self.config.base_time_ms + (n * 1000) // self.config.first_event_rate
        return int(ts) if ts.ndim == 0 else ts

    def event_kind(self, event_number: np.ndarray | int) -> np.ndarray:
        """0 for person, 1 for auction, 2 for bid events."""
        c = self.config
        r = np.asarray(event_number, dtype=np.int64) % c.total_proportion
        return (r >= c.person_proportion).astype(np.int8) + (
            r >= c.person_proportion + c.auction_proportion
        ).astype(np.int8)

    def person_event_number(self, person_id: np.ndarray | int) -> np.ndarray | int:
        """The event number that created the person ``person_id``."""
        c = self.config
        p = np.asarray(person_id, dtype=np.int64) - FIRST_PERSON_ID
        n = (p // c.person_proportion) * c.total_proportion + p % c.person_proportion
        return int(n) if n.ndim == 0 else n

    def auction_event_number(self, auction_id: np.ndarray | int) -> np.ndarray | int:
        """The event number that created the auction ``auction_id``."""
        c = self.config
        a = np.asarray(auction_id, dtype=np.int64) - FIRST_AUCTION_ID
        n = (a // c.auction_proportion) * c.total_proportion + c.person_proportion
        n = n + a % c.auction_proportion
        return int(n) if n.ndim == 0 else n

    def _recent_person(self, last_person: np.ndarray, bits32: np.ndarray) -> np.ndarray:
        """Uniform among the ``num_active_people`` most recent persons (base 0 ids)."""
        num_people = last_person + 1
        active = np.minimum(num_people, self.config.num_active_people)
        return num_people - active + _below(bits32, active)

    # -- numeric columns -----------------------------------------------------------------------
    #
    # For an auction or bid event of epoch ``e`` (``n = e * T + offset``), the last person
    # created is ``e * PP + PP - 1`` (base 0); for a bid the last auction is ``e * AP + AP - 1``.

    def _person_core(self, n: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        c = self.config
        epoch, offset = np.divmod(n, c.total_proportion)
        fields = [_P_NAME, _P_EMAIL_LEN, _P_EMAIL_OFF, _P_CARD, _P_CARD2, _P_PLACE, _P_EXTRA]
        h = _hashes(n, self._salts[fields])
        cols = {
            "id": epoch * c.person_proportion + offset + FIRST_PERSON_ID,
            "date_time": self.timestamp_ms(n),
        }
        return cols, h

    def _auction_core(self, n: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        c = self.config
        epoch, offset = np.divmod(n, c.total_proportion)
        h = _hashes(
            n, self._salts[[_A_SELLER, _A_MISC, _A_PRICE1, _A_PRICE2, _A_NAME, _A_DESC, _A_EXTRA]]
        )
        last_person = epoch * c.person_proportion + (c.person_proportion - 1)
        seller = np.where(
            _below(_hi(h[0]), c.hot_sellers_ratio) > 0,
            (last_person // HOT_SELLER_RATIO) * HOT_SELLER_RATIO,
            self._recent_person(last_person, _lo(h[0])),
        )
        initial_bid = _price(h[2])
        ts = self.timestamp_ms(n)
        # events it takes to create num_in_flight_auctions more auctions (1666 by default)
        events_for_auctions = c.num_in_flight_auctions * c.total_proportion // c.auction_proportion
        horizon = self.timestamp_ms(n + events_for_auctions) - ts
        cols = {
            "id": epoch * c.auction_proportion + (offset - c.person_proportion) + FIRST_AUCTION_ID,
            "initial_bid": initial_bid,
            "reserve": initial_bid + _price(h[3]),
            "date_time": ts,
            "expires": ts + 1 + _below(_lo(h[1]), np.maximum(2 * horizon, 1)),
            "seller": seller + FIRST_PERSON_ID,
            "category": FIRST_CATEGORY_ID + _below(_hi(h[1]), NUM_CATEGORIES),
        }
        return cols, h

    def _bid_core(self, n: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
        c = self.config
        epoch = n // c.total_proportion
        h = _hashes(n, self._salts[[_B_AUCTION, _B_BIDDER, _B_PRICE, _B_CHANNEL, _B_EXTRA]])
        last_auction = epoch * c.auction_proportion + (c.auction_proportion - 1)
        min_auction = np.maximum(last_auction - c.num_in_flight_auctions, 0)
        auction = np.where(
            _below(_hi(h[0]), c.hot_auction_ratio) > 0,
            (last_auction // HOT_AUCTION_RATIO) * HOT_AUCTION_RATIO,
            min_auction + _below(_lo(h[0]), last_auction - min_auction + 1),
        )
        last_person = epoch * c.person_proportion + (c.person_proportion - 1)
        bidder = np.where(
            _below(_hi(h[1]), c.hot_bidders_ratio) > 0,
            # the second person of the batch, or the first while it is the only one
            np.minimum((last_person // HOT_BIDDER_RATIO) * HOT_BIDDER_RATIO + 1, last_person),
            self._recent_person(last_person, _lo(h[1])),
        )
        cols = {
            "auction": auction + FIRST_AUCTION_ID,
            "bidder": bidder + FIRST_PERSON_ID,
            "price": _price(h[2]),
            "date_time": self.timestamp_ms(n),
        }
        return cols, h

    def _split(self, start_event: int, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if start_event < 0 or count < 0:
            raise ValueError(f"need start_event >= 0 and count >= 0, got {start_event}, {count}")
        n = np.arange(start_event, start_event + count, dtype=np.int64)
        kind = self.event_kind(n)
        return n[kind == 0], n[kind == 1], n[kind == 2]

    def generate_numeric(self, start_event: int, count: int) -> dict[str, dict[str, np.ndarray]]:
        """The numeric columns (ids, prices, epoch-ms times, ...) of events
        ``[start_event, start_event + count)`` as numpy ``int64`` arrays, without building any
        string: ``{"person": {"id", "date_time"}, "auction": {...}, "bid": {...}}``.  Values are
        identical to the same columns of :meth:`generate`.
        """
        n_person, n_auction, n_bid = self._split(start_event, count)
        return {
            "person": self._person_core(n_person)[0],
            "auction": self._auction_core(n_auction)[0],
            "bid": self._bid_core(n_bid)[0],
        }

    # -- strings -------------------------------------------------------------------------------

    def _extra(self, h: np.ndarray, current: np.ndarray, average: int) -> pa.Array:
        """Reference ``nextExtra``: pad an event of ``current`` bytes towards ``average``."""
        rem = average - current
        delta = np.where(rem > 0, np.floor(rem * 0.2 + 0.5).astype(np.int64), 0)
        length = rem - delta + _below(_hi(h), 2 * delta)
        length = np.where(current > average, 0, length)
        return self._letters.slices(_below(_lo(h), _POOL_SIZE), length)

    def _next_strings(self, h: np.ndarray, max_length: int) -> pa.Array:
        """Reference ``nextString(maxLength)``: 3 .. maxLength-1 characters, trimmed."""
        length = _MIN_STRING_LENGTH + _below(_hi(h), max_length - _MIN_STRING_LENGTH)
        raw = self._spaced.slices(_below(_lo(h), _POOL_SIZE), length)
        return pc.ascii_trim(raw, characters=" ")

    def _persons(self, n: np.ndarray) -> pa.RecordBatch:
        cols, h = self._person_core(n)
        name_idx = _below(_hi(h[0]), len(FIRST_NAMES)) * len(LAST_NAMES) + _below(
            _lo(h[0]), len(LAST_NAMES)
        )
        local = self._spaced.slices(  # nextString(7): 3..6 characters
            _below(_hi(h[2]), _POOL_SIZE), _MIN_STRING_LENGTH + _below(_hi(h[1]), 7 - 3)
        )
        domain = self._spaced.slices(  # nextString(5): 3..4 characters
            _below(_lo(h[2]), _POOL_SIZE), _MIN_STRING_LENGTH + _below(_lo(h[1]), 5 - 3)
        )
        email = pc.binary_join_element_wise(
            pc.ascii_trim(local, characters=" "),
            pc.binary_join_element_wise(pc.ascii_trim(domain, characters=" "), ".com", ""),
            "@",
        )
        card = np.full((len(n), 19), ord(" "), dtype=np.uint8)
        for g, bits in enumerate((_hi(h[3]), _lo(h[3]), _hi(h[4]), _lo(h[4]))):
            card[:, 5 * g : 5 * g + 4] = self._four_digits[_below(bits, 10_000)]
        city_idx = _below(_hi(h[5]), len(US_CITIES))
        state_idx = _below(_lo(h[5]), len(US_STATES))
        email_len = pc.binary_length(email).to_numpy(zero_copy_only=False).astype(np.int64)
        current = 8 + self._name_len[name_idx] + email_len + 19
        current += self._city_len[city_idx] + self._state_len[state_idx]
        return pa.RecordBatch.from_arrays(
            [
                _int64(cols["id"]),
                self._names.take(_int64(name_idx)),
                email,
                _fixed_width_strings(card),
                self._cities.take(_int64(city_idx)),
                self._states.take(_int64(state_idx)),
                _timestamps(cols["date_time"]),
                self._extra(h[6], current, self.config.avg_person_byte_size),
            ],
            schema=PERSON_SCHEMA,
        )

    def _auctions(self, n: np.ndarray) -> pa.RecordBatch:
        cols, h = self._auction_core(n)
        item_name = self._next_strings(h[4], 20)
        description = self._next_strings(h[5], 100)
        current = 8 + 5 * 8 + (
            pc.binary_length(item_name).to_numpy(zero_copy_only=False).astype(np.int64)
            + pc.binary_length(description).to_numpy(zero_copy_only=False).astype(np.int64)
        )
        return pa.RecordBatch.from_arrays(
            [
                _int64(cols["id"]),
                item_name,
                description,
                _int64(cols["initial_bid"]),
                _int64(cols["reserve"]),
                _timestamps(cols["date_time"]),
                _timestamps(cols["expires"]),
                _int64(cols["seller"]),
                _int64(cols["category"]),
                self._extra(h[6], current, self.config.avg_auction_byte_size),
            ],
            schema=AUCTION_SCHEMA,
        )

    def _bids(self, n: np.ndarray) -> pa.RecordBatch:
        cols, h = self._bid_core(n)
        channel_idx = _int64(
            np.where(
                _below(_hi(h[3]), self.config.hot_channels_ratio) > 0,
                _below(_lo(h[3]), len(HOT_CHANNELS)),
                len(HOT_CHANNELS) + _below(_lo(h[3]), CHANNELS_NUMBER),
            )
        )
        current = np.full(len(n), 8 * 4, dtype=np.int64)
        return pa.RecordBatch.from_arrays(
            [
                _int64(cols["auction"]),
                _int64(cols["bidder"]),
                _int64(cols["price"]),
                self._channels.take(channel_idx),
                self._urls.take(channel_idx),
                _timestamps(cols["date_time"]),
                self._extra(h[4], current, self.config.avg_bid_byte_size),
            ],
            schema=BID_SCHEMA,
        )

    # -- chunks --------------------------------------------------------------------------------

    def generate(self, start_event: int, count: int) -> NexmarkBatch:
        """The events numbered ``[start_event, start_event + count)``."""
        n_person, n_auction, n_bid = self._split(start_event, count)
        return NexmarkBatch(
            person=self._persons(n_person),
            auction=self._auctions(n_auction),
            bid=self._bids(n_bid),
            start_event=start_event,
            count=count,
        )

    def iter_batches(
        self, total_events: int, chunk: int = 100_000, start_event: int = 0
    ) -> Iterator[NexmarkBatch]:
        """Events ``[start_event, start_event + total_events)`` in chunks of ``chunk`` events.

        Chunks of about 100k events are the fastest (their temporaries stay in cache); the
        events do not depend on the chunk size.
        """
        if chunk <= 0:
            raise ValueError(f"chunk must be positive, got {chunk}")
        end = start_event + total_events
        for lo in range(start_event, end, chunk):
            yield self.generate(lo, min(chunk, end - lo))

    def tables(self, total_events: int, chunk: int = 100_000) -> dict[str, pa.Table]:
        """All events ``[0, total_events)`` as one table per kind (input of the reference)."""
        return collect_tables(self.iter_batches(total_events, chunk))


class EventReader:
    """The events of one kind among the event numbers ``[start, end)`` again, for an input log
    that records event ranges instead of rows (:class:`dbsp.ft.Rereadable`):
    ``EventReader(gen, "bid").reread(start, end)``. Readers of the three kinds made with one
    ``cache`` (a dict) share the last chunk generated, so a replayed step generates its events
    once, not once per kind."""

    def __init__(self, gen: "NexmarkGenerator", kind: str, cache: dict | None = None) -> None:
        if kind not in ("person", "auction", "bid"):
            raise ValueError(f"EventReader: kind must be person, auction or bid, got {kind!r}")
        self.gen, self.kind = gen, kind
        self.cache = cache if cache is not None else {}

    def reread(self, start: int, end: int) -> pa.RecordBatch:
        if not 0 <= start <= end:
            raise ValueError(f"EventReader: bad event range [{start}, {end})")
        b = self.cache.get((start, end))
        if b is None:
            b = self.gen.generate(start, end - start)
            self.cache.clear()
            self.cache[(start, end)] = b
        return getattr(b, self.kind)


def collect_tables(batches: Iterable[NexmarkBatch]) -> dict[str, pa.Table]:
    """Concatenate batches into ``{"person": Table, "auction": Table, "bid": Table}``."""
    parts: dict[str, list[pa.RecordBatch]] = {"person": [], "auction": [], "bid": []}
    for batch in batches:
        for kind, rb in batch.as_dict().items():
            parts[kind].append(rb)
    schemas = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}
    return {kind: pa.Table.from_batches(rbs, schema=schemas[kind]) for kind, rbs in parts.items()}

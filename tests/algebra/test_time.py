"""Event-time helpers (mirrors ``src/dbsp/algebra/time.py``).

``physical_int`` / ``from_physical`` round-trip every time type; ``duration_to_units`` is checked
against Python's own ``timedelta`` arithmetic; ``epoch_ms`` against ``datetime`` (floored
milliseconds, time zones ignored).
"""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from dbsp.algebra.time import (duration_to_units, epoch_ms, from_physical, is_time_type,
                               physical_int)

UNITS = ["s", "ms", "us", "ns"]
PER_SECOND = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}
EPOCH = dt.datetime(1970, 1, 1)

TIME_TYPES = [pa.timestamp(u) for u in UNITS] + [pa.timestamp("ms", tz="Europe/Paris"),
                                                 pa.date32(), pa.int64(), pa.int32(), pa.uint16()]


def test_is_time_type():
    for t in TIME_TYPES:
        assert is_time_type(t), t
    for t in [pa.float64(), pa.string(), pa.date64(), pa.duration("ms"), pa.bool_(),
              pa.time64("us")]:
        assert not is_time_type(t), t


def _values(t: pa.DataType):
    if pa.types.is_date32(t):
        return st.integers(-100_000, 100_000)
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        return st.integers(int(info.min), int(info.max))
    return st.integers(-2**62, 2**62)


@given(st.sampled_from(TIME_TYPES + [pa.duration("us"), pa.date64()]), st.data())
def test_physical_int_round_trips_with_nulls(t, data):
    raw = data.draw(st.lists(st.one_of(st.none(), _values(t)), max_size=20))
    a = pa.array(raw, pa.int64()).cast(t) if not pa.types.is_date32(t) else \
        pa.array(raw, pa.int32()).cast(t)
    p = physical_int(a)
    assert p.type == pa.int64()
    assert p.to_pylist() == raw  # nulls kept where they were
    assert from_physical(p, t).equals(a)


def test_physical_int_keeps_an_int64_column_as_is():
    a = pa.array([1, 2], pa.int64())
    assert physical_int(a) is a


def test_physical_int_refuses_other_types():
    with pytest.raises(TypeError, match="column type double is not a time type"):
        physical_int(pa.array([1.5]))


def test_from_physical_of_a_scalar():
    s = from_physical(pa.scalar(86_400_000, pa.int64()), pa.timestamp("ms"))
    assert s.as_py() == dt.datetime(1970, 1, 2)
    assert from_physical(pa.scalar(3, pa.int64()), pa.date32()).as_py() == dt.date(1970, 1, 4)


@given(st.sampled_from(UNITS), st.timedeltas(min_value=dt.timedelta(days=-10**4),
                                             max_value=dt.timedelta(days=10**4)))
@example("ms", dt.timedelta(microseconds=1500))
@example("s", dt.timedelta(days=1))
def test_duration_in_timestamp_units_is_exact_or_refused(unit, d):
    t = pa.timestamp(unit)
    us = (d.days * 86_400 + d.seconds) * 10**6 + d.microseconds  # exact, unlike total_seconds()
    exact = us * PER_SECOND[unit] % 10**6 == 0
    if exact:
        n = duration_to_units(d, t, "window size")
        assert n == us * PER_SECOND[unit] // 10**6
        assert duration_to_units(d, pa.duration(unit), "x") == n
    else:
        with pytest.raises(ValueError, match=f"window size .* is not a whole number of {unit}"):
            duration_to_units(d, t, "window size")


@given(st.integers(-10**6, 10**6))
def test_duration_of_whole_days_for_dates(days):
    assert duration_to_units(dt.timedelta(days=days), pa.date32(), "gap") == days


@pytest.mark.parametrize("d", [dt.timedelta(hours=36), dt.timedelta(days=1, microseconds=1), 2])
def test_date_durations_must_be_whole_days(d):
    with pytest.raises(ValueError, match="gap for a date column must be a timedelta of whole days"):
        duration_to_units(d, pa.date32(), "gap")


def test_integer_columns_take_ints():
    assert duration_to_units(7, pa.int32(), "size") == 7
    assert duration_to_units(np.int64(7), pa.int64(), "size") == 7
    with pytest.raises(TypeError, match="lateness: the time column is an integer .*not a "
                                        "timedelta"):
        duration_to_units(dt.timedelta(seconds=1), pa.int64(), "lateness")
    with pytest.raises(TypeError, match="size must be an int, got 1.5"):
        duration_to_units(1.5, pa.int64(), "size")


def test_timestamps_refuse_ambiguous_ints_and_other_values():
    with pytest.raises(TypeError, match="give a timedelta for a timestamp.* column .*ambiguous"):
        duration_to_units(1000, pa.timestamp("ms"), "size")
    with pytest.raises(TypeError, match="size must be a timedelta, got '1s'"):
        duration_to_units("1s", pa.timestamp("ms"), "size")
    with pytest.raises(TypeError, match="size: column type string is not a time type"):
        duration_to_units(dt.timedelta(1), pa.string(), "size")


@given(st.sampled_from(UNITS), st.lists(st.one_of(st.none(), st.integers(-2**53, 2**53)),
                                        max_size=20))
@example("us", [-1, -1000, -1001, 999])
@example("ns", [-1, 1_999_999])
def test_epoch_ms_floors_timestamps(unit, raw):
    a = pa.array(raw, pa.int64()).cast(pa.timestamp(unit))
    per_ms = PER_SECOND[unit] / 1000
    want = [None if v is None else (v * 1000 if unit == "s" else v // int(per_ms))
            for v in raw]
    got = epoch_ms(a)
    assert got.type == pa.int64() and got.to_pylist() == want
    assert epoch_ms(a.cast(pa.timestamp(unit, tz="Asia/Tokyo"))).to_pylist() == want


def test_epoch_ms_of_dates_and_scalars():
    days = [0, 1, -1, None, 19_000]
    got = epoch_ms(pa.array(days, pa.int32()).cast(pa.date32())).to_pylist()
    assert got == [None if d is None else d * 86_400_000 for d in days]
    assert epoch_ms(pa.array([5, None], pa.date64())).to_pylist() == [5, None]
    when = dt.datetime(2024, 2, 29, 12, 30, 1, 999_999)
    s = epoch_ms(pa.scalar(when, pa.timestamp("us")))
    assert s.as_py() == (when - EPOCH) // dt.timedelta(milliseconds=1)
    other = pa.array([1.5])
    assert epoch_ms(other) is other  # not a time: unchanged

"""The engine: matching local wall-clock minutes turned into UTC instants under the DST contract.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Final, NamedTuple, TypedDict, Unpack
from zoneinfo import ZoneInfo

from apps.schedules.timerules.base import (
    _MAX_YEAR,
    _MIN_INSTANT,
    SEARCH_HORIZON_YEARS,
    DstFold,
    DstGap,
    _check_count,
    _check_options,
    _to_utc,
    validate_bounds,
)
from apps.schedules.timerules.cron import _compile, _Rule
from apps.schedules.timerules.zones import get_zone

_PLAIN: Final = 0  # a unique local time
_FOLD_FIRST: Final = 1  # first instant of a repeated local time
_FOLD_SECOND: Final = 2  # second instant of a repeated local time (dst_fold="both")
_SHIFTED: Final = 3  # nonexistent local time moved to the end of the gap (dst_gap="shift")
_SKIPPED: Final = 4  # nonexistent local time dropped (reported only for previews)

_ONE_SECOND: Final = timedelta(seconds=1)


class _Event(NamedTuple):
    instant: datetime  # naive UTC
    kind: int
    wall: datetime  # naive local wall time that matched the rule
    other: datetime | None  # fold: the other instant (naive UTC)


class _Query(NamedTuple):
    """A validated evaluation request: the compiled rule, its zone and the DST options."""

    rule: _Rule
    zone: str
    tz: ZoneInfo
    shift: bool  # dst_gap="shift": matching nonexistent times run at the end of the gap
    both: bool  # dst_fold="both": repeated times run at both instants


def _query(expression: object, time_zone: str, dst_gap: str, dst_fold: str) -> _Query:
    """Validate in the order errors are reported: expression, zone, DST options."""
    rule = _compile(expression)
    tz = get_zone(time_zone)
    _check_options(dst_gap, dst_fold)
    return _Query(
        rule,
        time_zone,
        tz,
        shift=dst_gap == DstGap.SHIFT,
        both=dst_fold == DstFold.BOTH,
    )


def _walls(rule: _Rule, start: datetime, last_year: int) -> Iterator[datetime]:
    """Matching naive wall-clock minutes >= ``start`` (minute-aligned), up to ``last_year``."""
    minutes, hours = rule.minutes, rule.hours
    s_date = (start.year, start.month, start.day)
    for year in range(start.year, last_year + 1):
        for month in rule.months:
            if (year, month) < s_date[:2]:
                continue
            days = rule.days(year, month)
            first_day = 0
            if (year, month) == s_date[:2]:
                first_day = bisect.bisect_left(days, start.day)
            for day in days[first_day:]:
                if (year, month, day) == s_date:
                    hi = bisect.bisect_left(hours, start.hour)
                    for hour in hours[hi:]:
                        mi = bisect.bisect_left(minutes, start.minute) if hour == start.hour else 0
                        for minute in minutes[mi:]:
                            yield datetime(year, month, day, hour, minute)  # noqa: DTZ001
                else:
                    for hour in hours:
                        for minute in minutes:
                            yield datetime(year, month, day, hour, minute)  # noqa: DTZ001


def _local_naive(instant: datetime, tz: ZoneInfo) -> datetime:
    """Local wall time (naive) of a naive-UTC instant."""
    return instant.replace(tzinfo=UTC).astimezone(tz).replace(tzinfo=None)


def _transition(tz: ZoneInfo, lo: datetime, hi: datetime) -> datetime:
    """First naive-UTC second in (lo, hi] whose UTC offset differs from the offset at lo."""
    base = tz.utcoffset(lo.replace(tzinfo=UTC).astimezone(tz))
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:
        mid = (lo_s + hi_s) // 2
        probe = (lo + timedelta(seconds=mid)).replace(tzinfo=UTC).astimezone(tz)
        if probe.utcoffset() == base:
            lo_s = mid
        else:
            hi_s = mid
    return lo + timedelta(seconds=hi_s)


def _events(query: _Query, after: datetime, last_year: int, with_skipped: bool) -> Iterator[_Event]:
    """Events in ascending UTC order (duplicates of one instant possible, consumers dedupe).

    ``after`` is aware UTC; events at or before it may still be produced (consumers filter).
    """
    try:
        yield from _events_inner(query, after, last_year, with_skipped)
    except OverflowError:  # near datetime.min / datetime.max: nothing more to find
        return


def _events_inner(
    query: _Query, after: datetime, last_year: int, with_skipped: bool
) -> Iterator[_Event]:
    rule, tz, shift, both = query.rule, query.tz, query.shift, query.both
    start = after.astimezone(tz).replace(tzinfo=None)
    if both:
        # A repeated wall time earlier than wall(after) can still have its second instant after
        # `after` when `after` is in the first pass of a fold: start at the beginning of the fold.
        off0 = start.replace(tzinfo=tz).utcoffset()
        off1 = start.replace(tzinfo=tz, fold=1).utcoffset()
        if off0 is not None and off1 is not None and off0 > off1:
            start -= off0 - off1
    start = start.replace(second=0, microsecond=0)
    pending: deque[_Event] = deque()  # second instants of repeated times, ascending
    gap_cache: tuple[datetime, datetime, datetime] | None = None  # (lo, hi, transition)
    for wall in _walls(rule, start, min(last_year, _MAX_YEAR)):
        aware0 = wall.replace(tzinfo=tz)
        off0 = aware0.utcoffset()
        off1 = wall.replace(tzinfo=tz, fold=1).utcoffset()
        assert off0 is not None and off1 is not None
        if off0 == off1:
            event = _Event(wall - off0, _PLAIN, wall, None)
        elif off0 > off1:  # repeated wall time (fall back)
            first, second = wall - off0, wall - off1
            event = _Event(first, _FOLD_FIRST, wall, second)
            if both:
                pending.append(_Event(second, _FOLD_SECOND, wall, first))
        else:  # nonexistent wall time (spring forward): off0 is the offset before the jump
            if not shift and not with_skipped:
                continue
            lo, hi = wall - off1, wall - off0
            if gap_cache is not None and gap_cache[0] <= hi and lo <= gap_cache[1]:
                moment = gap_cache[2]
            else:
                moment = _transition(tz, lo, hi)
                gap_cache = (lo, hi, moment)
            event = _Event(moment, _SHIFTED if shift else _SKIPPED, wall, None)
        while pending and pending[0].instant <= event.instant:
            yield pending.popleft()
        yield event
    while pending:
        yield pending.popleft()


def _window(
    after: datetime, start_at: datetime | None, end_at: datetime | None
) -> tuple[datetime, datetime | None]:
    """Effective (exclusive lower bound, exclusive upper bound) in aware UTC."""
    low = _to_utc(after, "after")
    end = None
    if start_at is not None or end_at is not None:
        validate_bounds(start_at, end_at)
    if start_at is not None:
        start = _to_utc(start_at, "start_at") - timedelta(microseconds=1)
        low = max(low, start)
    if end_at is not None:
        end = _to_utc(end_at, "end_at")
    return low, end


def _collect(
    query: _Query,
    low: datetime,
    count: int,
    last_year: int | None,
    stop: datetime | None,
    stop_inclusive: bool,
) -> list[datetime]:
    """Up to ``count`` instants after ``low`` (aware UTC).

    ``last_year=None`` means a rolling horizon: the search gives up only when no instant is
    found within ``SEARCH_HORIZON_YEARS`` after the previous one (or after ``low``).
    """
    out: list[datetime] = []
    if count <= 0:
        return out
    stop_naive = stop.replace(tzinfo=None) if stop is not None else None
    cursor = max(low, _MIN_INSTANT)
    while True:
        low_naive = cursor.replace(tzinfo=None)
        segment_end = last_year if last_year is not None else cursor.year + SEARCH_HORIZON_YEARS + 1
        found = False
        for event in _events(query, cursor, segment_end, False):
            instant = event.instant
            if instant <= low_naive:
                continue
            if stop_naive is not None and (
                instant > stop_naive or (instant == stop_naive and not stop_inclusive)
            ):
                return out
            low_naive = instant  # also drops duplicates of one instant
            found = True
            out.append(instant.replace(tzinfo=UTC))
            if len(out) >= count:
                return out
        if last_year is not None or not found:
            return out
        cursor = out[-1]


class FireOptions(TypedDict, total=False):
    """The keyword options of `next_fire_times`, `next_fire_time` and `preview`, one
    declaration for all three; left out: `dst_gap` skip, `dst_fold` first, no bounds."""

    dst_gap: str
    dst_fold: str
    start_at: datetime | None
    end_at: datetime | None


def _options_query(expression: str, time_zone: str, options: FireOptions) -> _Query:
    return _query(
        expression,
        time_zone,
        options.get("dst_gap", DstGap.SKIP),
        options.get("dst_fold", DstFold.FIRST),
    )


def _options_window(after: datetime, options: FireOptions) -> tuple[datetime, datetime | None]:
    return _window(after, options.get("start_at"), options.get("end_at"))


def next_fire_times(
    expression: str, time_zone: str, after: datetime, count: int, **options: Unpack[FireOptions]
) -> list[datetime]:
    """The next ``count`` fire instants strictly after ``after``: aware UTC, ascending.

    Fewer are returned only when the rule does not fire again within ``SEARCH_HORIZON_YEARS``
    (or before ``end_at``). ``start_at``/``end_at`` bound the result to ``[start_at, end_at)``.
    Not memoised (see ``NextFireCache`` for the materializer's path).
    """
    query = _options_query(expression, time_zone, options)
    count = _check_count(count)
    low, end = _options_window(after, options)
    return _collect(query, low, count, None, end, False)


def next_fire_time(
    expression: str, time_zone: str, after: datetime, **options: Unpack[FireOptions]
) -> datetime | None:
    """The next fire instant strictly after ``after`` (aware UTC), or None within the horizon."""
    query = _options_query(expression, time_zone, options)
    low, end = _options_window(after, options)
    found = _collect(query, low, 1, None, end, False)
    return found[0] if found else None

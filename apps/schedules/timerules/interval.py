"""Fixed-rate rules: every N seconds of elapsed time from an anchor instant.

Part of ``apps.schedules.timerules`` (docs/timerules.md "Fixed-rate schedules"). A fixed rate
counts elapsed time in UTC and never moves with DST: its instants are ``anchor + k * period``
(k = 0, 1, 2, ...), so two consecutive runs are exactly ``period`` apart whatever the clocks
of the schedule's zone do. The zone only words the local times of a preview.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

from apps.schedules.timerules.base import (
    MAX_LIMIT,
    TimeRuleError,
    _check_count,
    _check_year,
    _to_utc,
)
from apps.schedules.timerules.preview import PreviewEntry, _entry, _offset_text
from apps.schedules.timerules.zones import get_zone

#: The shortest period: a minute, the finest a cron rule can fire, which the planning window,
#: the outbox and the per-tenant quotas are sized for (a tenant's ``min_interval_s`` may ask
#: for more).
MIN_INTERVAL_S: Final = 60
#: The longest period: 366 days (a leap year), so every schedule runs at least once a year.
MAX_INTERVAL_S: Final = 366 * 86_400

_UNITS: Final = ((86_400, "day"), (3_600, "hour"), (60, "minute"), (1, "second"))


def validate_interval(interval_s: object) -> int:
    """The period in whole seconds, MIN_INTERVAL_S to MAX_INTERVAL_S, else
    ``TimeRuleError("interval_s")``."""
    field = "interval_s"
    if isinstance(interval_s, bool) or not isinstance(interval_s, int):
        raise TimeRuleError(field, "interval_s must be a whole number of seconds.")
    if interval_s < MIN_INTERVAL_S:
        raise TimeRuleError(
            field,
            f"interval_s is {interval_s} s; a fixed-rate schedule runs at most once a minute "
            f"(interval_s >= {MIN_INTERVAL_S}).",
        )
    if interval_s > MAX_INTERVAL_S:
        raise TimeRuleError(
            field,
            f"interval_s is {interval_s} s; the longest period is 366 days "
            f"({MAX_INTERVAL_S} s). Use a cron rule for yearly runs.",
        )
    return interval_s


def _anchor(anchor: object) -> datetime:
    return _check_year(_to_utc(anchor, "start_at"), "start_at")


def _first_index(anchor: datetime, period: timedelta, after: datetime) -> int:
    """The smallest k >= 0 with anchor + k * period > after (integer arithmetic, exact)."""
    if after < anchor:
        return 0
    return (after - anchor) // period + 1


def interval_fire_times(
    interval_s: int,
    anchor: datetime,
    after: datetime,
    count: int,
    *,
    end_at: datetime | None = None,
) -> list[datetime]:
    """The next ``count`` instants ``anchor + k * interval_s`` strictly after ``after`` and
    before ``end_at`` (half-open bounds, like cron's): aware UTC, ascending."""
    period = timedelta(seconds=validate_interval(interval_s))
    start = _anchor(anchor)
    low = _to_utc(after, "after")
    end = _to_utc(end_at, "end_at") if end_at is not None else None
    return _between(start, period, low, end, _check_count(count), inclusive_end=False)


def interval_fire_times_between(
    interval_s: int, anchor: datetime, after: datetime, until: datetime, *, limit: int = 1000
) -> list[datetime]:
    """Every instant in ``(after, until]`` (aware UTC, ascending), at most ``limit``: the
    materializer's path. Pure arithmetic, so it needs no memo (a cron rule's does)."""
    period = timedelta(seconds=validate_interval(interval_s))
    limit = _check_count(limit, "limit", MAX_LIMIT)
    return _between(
        _anchor(anchor), period, _to_utc(after, "after"), _to_utc(until, "until"), limit, True
    )


def _between(
    anchor: datetime,
    period: timedelta,
    low: datetime,
    high: datetime | None,
    count: int,
    inclusive_end: bool,
) -> list[datetime]:
    k = _first_index(anchor, period, low)
    try:
        first = anchor + k * period
        if high is not None:
            if first > high:
                return []
            # How many instants fit up to `high`: one division, not a comparison per instant.
            fit = (high - first) // period + 1
            if not inclusive_end and first + (fit - 1) * period == high:
                fit -= 1
            count = min(count, fit)
        return [first + i * period for i in range(count)]
    except OverflowError:  # near datetime.max: step until the range ends
        out: list[datetime] = []
        while len(out) < count:
            try:
                instant = anchor + k * period
            except OverflowError:
                break
            if high is not None and (instant > high or (instant == high and not inclusive_end)):
                break
            out.append(instant)
            k += 1
        return out


def interval_preview(times: list[datetime], interval_s: int, time_zone: str) -> list[PreviewEntry]:
    """A fixed rate's instants (``interval_fire_times``) with local time and offset in
    ``time_zone``; an entry after which the zone's offset changed says so: the runs stay
    ``interval_s`` apart in elapsed time while the wall clock between them differs by the DST
    change."""
    tz = get_zone(time_zone)
    entries: list[PreviewEntry] = []
    previous_offset: timedelta | None = None
    for instant in times:
        offset = instant.astimezone(tz).utcoffset()
        notes: tuple[str, ...] = ()
        if previous_offset is not None and offset != previous_offset:
            notes = (
                f"UTC offset changes from {_offset_text(previous_offset)} to "
                f"{_offset_text(offset)} in {time_zone} since the previous run — still "
                f"{interval_words(interval_s).removeprefix('every ')} after it in elapsed "
                "time (a fixed rate does not move with DST)",
            )
        entries.append(_entry(instant, tz, notes))
        previous_offset = offset
    return entries


def interval_words(interval_s: int) -> str:
    """``every 90 minutes``, ``every 36 hours``, ``every 2 days``: the largest unit that
    divides the period exactly."""
    for size, unit in _UNITS:
        if interval_s % size == 0:
            n = interval_s // size
            return f"every {unit}" if n == 1 else f"every {n:,} {unit}s"
    raise AssertionError("unreachable: a second divides every period")


def interval_rule_words(interval_s: int, anchor: datetime) -> str:
    """The rule in words: ``every 90 minutes from 2026-12-04 09:00 UTC``."""
    start = anchor.astimezone(UTC)
    stamp = f"{start:%Y-%m-%d %H:%M:%S}".removesuffix(":00")
    return f"{interval_words(interval_s)} from {stamp} UTC"

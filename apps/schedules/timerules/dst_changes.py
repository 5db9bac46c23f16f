"""The DST changes ahead at which a rule's local times are skipped, shifted or repeated.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from apps.schedules.timerules.base import DstFold, DstGap
from apps.schedules.timerules.engine import (
    _FOLD_FIRST,
    _SHIFTED,
    _SKIPPED,
    _Event,
    _events,
    _local_naive,
    _Query,
    _query,
    _transition,
    _window,
)
from apps.schedules.timerules.preview import _fold_note, _gap_note, _hm, _jump


@dataclass(frozen=True)
class DstChange:
    """A DST change the rule meets: the local date of the change and what happens to the
    rule's runs then, worded like the preview's notes."""

    on: date
    text: str


def _transitions(tz: ZoneInfo, low: datetime, high: datetime) -> list[datetime]:
    """The zone's offset changes in (low, high], as naive-UTC instants (a day-step scan,
    then a bisection: zones change offset at most a few times a year)."""
    out = []
    day = timedelta(days=1)
    # Whole seconds: the bisection then lands on the transition's own second, the instant
    # the events of its gap carry.
    lo = low.replace(tzinfo=None, microsecond=0)
    end = high.replace(tzinfo=None)
    while lo < end:
        hi = min(lo + day, end)
        if tz.utcoffset(lo.replace(tzinfo=UTC).astimezone(tz)) != tz.utcoffset(
            hi.replace(tzinfo=UTC).astimezone(tz)
        ):
            out.append(_transition(tz, lo, hi))
        lo = hi
    return out


def _fold_text(walls: list[datetime], events: list[_Event], query: _Query) -> str:
    if len(walls) == 1:
        return _fold_note(events[0], query)
    first = events[0]
    assert first.other is not None
    moment = _transition(query.tz, first.instant, first.other)
    before, after_fall = _jump(query.tz, moment)
    head = (
        f"{_hm(walls)} occur twice on {walls[0]:%Y-%m-%d} in {query.zone} "
        f"(clocks fall back from {before} to {after_fall})"
    )
    if query.both:
        return f"{head} — each runs twice, at both instants"
    return f"{head} — each runs once, at its first occurrence"


def dst_changes(
    expression: str,
    time_zone: str,
    after: datetime,
    *,
    days: int = 366,
    dst_gap: str = DstGap.SKIP,
    dst_fold: str = DstFold.FIRST,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> list[DstChange]:
    """The DST changes of the ``days`` after ``after`` at which the rule has local times that
    do not exist (skipped or shifted, per ``dst_gap``) or happen twice (run once or twice, per
    ``dst_fold``): whatever the preview's count would show. Only the day around each change is
    evaluated, so a rule firing every minute costs a few thousand events per change."""
    query = _query(expression, time_zone, dst_gap, dst_fold)
    low, end = _window(after, start_at, end_at)
    high = low + timedelta(days=days)
    if end is not None:
        high = min(high, end)
    low_naive, high_naive = low.replace(tzinfo=None), high.replace(tzinfo=None)
    out: list[DstChange] = []
    for moment in _transitions(query.tz, low, high):
        gap: list[datetime] = []
        fold: list[_Event] = []
        start = max(moment - timedelta(days=1), low_naive).replace(tzinfo=UTC)
        stop = moment + timedelta(days=1)
        for event in _events(query, start, stop.year + 1, True):
            if event.instant > stop:
                break
            if not low_naive < event.instant < high_naive:
                continue
            if event.kind in (_SKIPPED, _SHIFTED) and event.instant == moment:
                gap.append(event.wall)
            elif event.kind == _FOLD_FIRST and event.other is not None:
                if event.instant < moment <= event.other and event.wall not in {
                    e.wall for e in fold
                }:
                    fold.append(event)
        on = _local_naive(moment, query.tz).date()
        if gap:
            out.append(DstChange(on, _gap_note(gap, query, moment, query.shift)))
        if fold:
            out.append(DstChange(on, _fold_text([e.wall for e in fold], fold, query)))
    return out

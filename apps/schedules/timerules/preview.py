"""Previews: the engine's instants with local time, offset and DST notes.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Unpack
from zoneinfo import ZoneInfo

from apps.schedules.timerules.base import TimeRuleError, _check_count, instant_text
from apps.schedules.timerules.engine import (
    _FOLD_FIRST,
    _FOLD_SECOND,
    _ONE_SECOND,
    _SHIFTED,
    _SKIPPED,
    FireOptions,
    _collect,
    _Event,
    _events,
    _local_naive,
    _options_query,
    _options_window,
    _Query,
    _transition,
)
from apps.schedules.timerules.zones import get_zone


@dataclass(frozen=True)
class PreviewEntry:
    """One fire instant of a preview.

    ``notes`` explains DST effects: a moved or deduplicated run, and any matching local times
    that were skipped since the previous entry (skipped times get no entry of their own).
    """

    at_utc: datetime
    local_time: datetime
    utc_offset: str
    abbreviation: str
    notes: tuple[str, ...] = ()

    @property
    def note(self) -> str | None:
        return "; ".join(self.notes) if self.notes else None

    @property
    def local_wall(self) -> str:
        return self.local_time.strftime("%Y-%m-%d %H:%M")

    def as_dict(self) -> dict[str, object]:
        return {
            "at_utc": instant_text(self.at_utc),
            "local_time": self.local_time.isoformat(),
            "local_wall": self.local_wall,
            "utc_offset": self.utc_offset,
            "abbreviation": self.abbreviation,
            "note": self.note,
            "notes": list(self.notes),
        }


def preview_one_shot(run_at: datetime, time_zone: str) -> PreviewEntry:
    """The single entry of a one-shot schedule's preview (``run_at`` aware, any zone)."""
    if run_at.tzinfo is None:
        raise TimeRuleError("run_at", "run_at must be timezone-aware here.")
    tz = get_zone(time_zone)
    return _entry(run_at.astimezone(UTC), tz, ())


def _entry(at_utc: datetime, tz: ZoneInfo, notes: tuple[str, ...]) -> PreviewEntry:
    local = at_utc.astimezone(tz)
    return PreviewEntry(
        at_utc=at_utc,
        local_time=local,
        utc_offset=_offset_text(local.utcoffset()),
        abbreviation=local.tzname() or "",
        notes=notes,
    )


def _offset_text(offset: timedelta | None) -> str:
    if offset is None:
        return "+00:00"
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    seconds = abs(seconds)
    text = f"{sign}{seconds // 3600:02d}:{seconds % 3600 // 60:02d}"
    if seconds % 60:
        text += f":{seconds % 60:02d}"
    return text


def _hm(values: list[datetime]) -> str:
    shown = [f"{v:%H:%M}" for v in values[:6]]
    if len(values) > 6:
        shown.append(f"... ({len(values)} times)")
    return ", ".join(shown)


def _jump(tz: ZoneInfo, moment: datetime) -> tuple[str, str]:
    """Local wall clock just before and at a transition, as 'HH:MM' (with dates if they differ)."""
    before = _local_naive(moment - _ONE_SECOND, tz) + _ONE_SECOND
    after = _local_naive(moment, tz)
    if abs(after - before) >= timedelta(hours=12):  # e.g. a skipped calendar day
        return f"{before:%Y-%m-%d %H:%M}", f"{after:%Y-%m-%d %H:%M}"
    return f"{before:%H:%M}", f"{after:%H:%M}"


def _gap_note(walls: list[datetime], query: _Query, moment: datetime, shift: bool) -> str:
    before, after_jump = _jump(query.tz, moment)
    verb = "does" if len(walls) == 1 else "do"
    head = (
        f"{_hm(walls)} {verb} not exist on {walls[0]:%Y-%m-%d} in {query.zone} "
        f"(clocks jump from {before} to {after_jump})"
    )
    if shift:
        return f"{head} — runs once at {after_jump} local ({moment:%H:%M} UTC) instead"
    return f"{head} — skipped"


def preview(
    expression: str, time_zone: str, after: datetime, count: int, **options: Unpack[FireOptions]
) -> list[PreviewEntry]:
    """The next ``count`` fire instants with local time, offset and DST notes.

    The instants are exactly those of ``next_fire_times`` with the same arguments.
    """
    query = _options_query(expression, time_zone, options)
    count = _check_count(count)
    low, end = _options_window(after, options)
    times = _collect(query, low, count, None, end, False)
    if not times:
        return []
    # Walk the events again, skipped times included, to word the notes of those instants.
    last_year = times[-1].astimezone(query.tz).year + 1
    low_naive = low.replace(tzinfo=None)
    end_naive = end.replace(tzinfo=None) if end is not None else None
    entries = _PreviewEntries(query, count)
    for event in _events(query, low, last_year, True):
        if event.instant <= low_naive:
            continue
        if end_naive is not None and event.instant >= end_naive:
            break
        if not entries.add(event):
            break
    return entries.finish()


class _PreviewEntries:
    """Turns events into entries: one per instant, with the notes of its events, and the notes
    of skipped times carried to the next entry (skipped times get no entry of their own)."""

    def __init__(self, query: _Query, count: int) -> None:
        self.query = query
        self.count = count
        self.entries: list[PreviewEntry] = []
        self.skipped: dict[datetime, list[datetime]] = {}  # transition -> walls, not yet shown
        self.current: datetime | None = None  # the instant of the entry being collected
        self.current_skipped: dict[datetime, list[datetime]] = {}
        self.notes: list[str] = []
        self.shifted: list[datetime] = []

    def add(self, event: _Event) -> bool:
        """Take the next event; False once ``count`` entries are complete."""
        if event.kind == _SKIPPED:
            self.skipped.setdefault(event.instant, []).append(event.wall)
            return True
        if event.instant != self.current:
            self._flush()
            if len(self.entries) >= self.count:
                self.current = None
                return False
            self.current = event.instant
            self.current_skipped = dict(self.skipped)
            self.skipped.clear()
            self.notes = []
            self.shifted = []
        if event.kind == _SHIFTED:
            self.shifted.append(event.wall)
        elif event.kind in (_FOLD_FIRST, _FOLD_SECOND):
            self.notes.append(_fold_note(event, self.query))
        return True

    def finish(self) -> list[PreviewEntry]:
        self._flush()
        return self.entries[: self.count]

    def _flush(self) -> None:
        if self.current is None:
            return
        notes = [
            _gap_note(walls, self.query, moment, False)
            for moment, walls in self.current_skipped.items()
        ]
        if self.shifted:
            notes.append(_gap_note(self.shifted, self.query, self.current, True))
        notes.extend(self.notes)
        self.entries.append(_entry(self.current.replace(tzinfo=UTC), self.query.tz, tuple(notes)))


def _fold_note(event: _Event, query: _Query) -> str:
    assert event.other is not None
    first, second = sorted((event.instant, event.other))
    moment = _transition(query.tz, first, second)
    before, after_fall = _jump(query.tz, moment)
    head = (
        f"{event.wall:%H:%M} occurs twice on {event.wall:%Y-%m-%d} in {query.zone} "
        f"(clocks fall back from {before} to {after_fall})"
    )
    if not query.both:
        return f"{head} — runs once, at {first:%H:%M} UTC; not again at {second:%H:%M} UTC"
    if event.kind == _FOLD_FIRST:
        return f"{head} — first of two runs ({first:%H:%M} UTC; again at {second:%H:%M} UTC)"
    return f"{head} — second of two runs ({second:%H:%M} UTC; first was {first:%H:%M} UTC)"

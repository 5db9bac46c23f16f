"""The second cron evaluator: the oracle of the reconciliation audit and of the time-rule
property tests (docs/timerules.md, "Proof"; docs/operations.md, "Independence").

`apps.schedules.timerules` is the production engine. This module answers the same question -
at which UTC instants does a rule fire inside a window - a second time, deliberately naive and
written apart from it, so that a bug in one shows up as a disagreement with the other. It
imports neither timerules nor croniter and shares none of their code or techniques:

* Parsing splits each list item with `str.partition` on "/" and "-" (no regular expression)
  and trusts that the expression passed `timerules.validate` when it was stored: anything it
  cannot read raises ValueError, without timerules' explanations.
* Enumeration walks the local wall clock minute by minute, stepping over whole days and hours
  the rule excludes; timerules enumerates from sorted value lists with bisection.
* DST is decided by reading the clock back: the instants of a wall time are those UTC instants
  (of the `fold=0` and `fold=1` guesses) that the zone shows as that wall time. None: the time
  lies in a gap. Two: it is repeated. The end of a gap is found by walking forward to the first
  real minute and back second by second to the offset change; timerules compares offsets and
  bisects.

The rules it applies (docs/timerules.md, "DST contract"):

* a wall time that happens once fires at that instant;
* a repeated wall time fires at its first instant, and with dst_fold="both" at its second too;
* a nonexistent wall time does not fire; with dst_gap="shift" all matching wall times of one gap
  fire together, once, at the instant the clocks jump (once also when that instant matches).

Zones are read from the `tzdata` package, the data production uses.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from zoneinfo import ZoneInfo

from apps.schedules.models import Schedule

_SECOND = timedelta(seconds=1)
_MINUTE = timedelta(minutes=1)
_DAY = timedelta(days=1)
# The longest gap in the zone data (Pacific/Apia skipped 2011-12-30) with room to spare.
_LONGEST_GAP_MINUTES = 2 * 24 * 60

# Each macro with the five fields it stands for; aliases share an entry.
_MACROS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("@yearly", "@annually"), "0 0 1 1 *"),
    (("@monthly",), "0 0 1 * *"),
    (("@weekly",), "0 0 * * 0"),
    (("@daily", "@midnight"), "0 0 * * *"),
    (("@hourly",), "0 * * * *"),
)
# Names count from the field's lowest value: January is 1, Sunday is 0.
_MONTH_NAMES = tuple("jan feb mar apr may jun jul aug sep oct nov dec".split())
_WEEKDAY_NAMES = tuple("sun mon tue wed thu fri sat".split())


@functools.cache
def load_zone(name: str) -> ZoneInfo:
    """The zone as shipped in the `tzdata` package (never the host's zone files)."""
    data = resources.files("tzdata").joinpath("zoneinfo", *name.split("/")).read_bytes()
    return ZoneInfo.from_file(io.BytesIO(data), key=name)


def _without_macro(text: str) -> str:
    for aliases, fields in _MACROS:
        if text.lower() in aliases:
            return fields
    return text


def _number(token: str, allowed: range, names: tuple[str, ...] = ()) -> int:
    if token.isascii() and token.isdigit():
        value = int(token)
    elif token.lower() in names:
        value = allowed.start + names.index(token.lower())
    else:
        raise ValueError(f"cannot read {token!r} as a cron value")
    if value not in allowed:
        raise ValueError(f"cron value {value} is outside {allowed.start}-{allowed.stop - 1}")
    return value


def _walk(first: int, last: int, cycle: int) -> list[int]:
    """The values from `first` round to `last` on a dial of `cycle` values (a wrapped range)."""
    out = [first]
    while out[-1] != last:
        out.append(out[-1] % cycle + 1 if cycle == 12 else (out[-1] + 1) % cycle)
    return out


def _values(
    text: str, allowed: range, names: tuple[str, ...] = (), cycle: int = 0
) -> frozenset[int]:
    """The values one field lists. Items are "*", "a" or "a-b", each optionally "/step";
    "a/step" runs from a to the field's highest value. With a `cycle` (day of week: 7,
    month: 12) a range whose end lies before its start goes round the dial."""
    found: set[int] = set()
    for item in text.split(","):
        span, slash, step_text = item.partition("/")
        step = _number(step_text, range(1, 10_000)) if slash else 1
        if span == "*":
            first, last = allowed.start, allowed.stop - 1
        else:
            head, dash, tail = span.partition("-")
            first = _number(head, allowed, names)
            if dash:
                last = _number(tail, allowed, names)
            else:
                last = allowed.stop - 1 if slash else first
        if last >= first:
            found.update(range(first, last + 1, step))
        elif cycle:
            found.update(_walk(first % cycle if cycle == 7 else first, last, cycle)[::step])
        else:
            raise ValueError(f"cron range {item!r} runs backwards")
    return frozenset(found)


@dataclass(frozen=True)
class DayForms:
    """The calendar-relative day items: Quartz's L, W and # (docs/timerules.md)."""

    before_last: frozenset[int] = frozenset()  # "L" is 0, "L-n" is n
    near: frozenset[int] = frozenset()  # "nW"
    last_working_day: bool = False  # "LW"
    final_weekdays: frozenset[int] = frozenset()  # "dL", Sunday == 0
    numbered: frozenset[tuple[int, int]] = frozenset()  # "d#n" as (weekday, n)

    def matches(self, day: date) -> bool:
        weekday = (day.weekday() + 1) % 7
        next_month = (day.replace(day=28) + 4 * _DAY).replace(day=1)
        days_left = (next_month - day).days - 1  # 0 on the last day of the month
        if days_left in self.before_last:
            return True
        if self.last_working_day and day == _working_days(day)[-1]:
            return True
        if self.near and any(day == _nearest_working_day(day, n) for n in self.near):
            return True
        if weekday in self.final_weekdays and days_left < 7:
            return True
        return (weekday, (day.day + 6) // 7) in self.numbered


def _working_days(day: date) -> list[date]:
    """Monday-to-Friday dates of `day`'s month."""
    first = day.replace(day=1)
    out = []
    probe = first
    while probe.month == first.month:
        if probe.weekday() < 5:
            out.append(probe)
        probe += _DAY
    return out


def _nearest_working_day(day: date, n: int) -> date | None:
    """The Monday-to-Friday date of `day`'s month closest to its day `n` (none if the month
    has no day `n`); never a tie, since only a weekend day is moved."""
    try:
        target = day.replace(day=n)
    except ValueError:
        return None
    return min(_working_days(day), key=lambda d: abs((d - target).days))


def _day_forms(text: str, weekday_field: bool) -> tuple[str, DayForms]:
    """Split the L/W/# items off a day field: the rest (or "*") and the forms."""
    rest: list[str] = []
    before_last: set[int] = set()
    near: set[int] = set()
    last_working = False
    final: set[int] = set()
    numbered: set[tuple[int, int]] = set()
    for item in text.split(","):
        upper = item.upper()
        if weekday_field and "#" in item:
            name, _, nth = item.partition("#")
            numbered.add((_number(name, range(8), _WEEKDAY_NAMES) % 7, _number(nth, range(1, 6))))
        elif weekday_field and upper.endswith("L"):
            final.add(_number(item[:-1], range(8), _WEEKDAY_NAMES) % 7)
        elif not weekday_field and upper == "LW":
            last_working = True
        elif not weekday_field and upper.startswith("L"):
            before_last.add(_number(upper[2:], range(1, 31)) if upper != "L" else 0)
        elif not weekday_field and upper.endswith("W"):
            near.add(_number(upper[:-1], range(1, 32)))
        else:
            rest.append(item)
    forms = DayForms(
        frozenset(before_last), frozenset(near), last_working, frozenset(final), frozenset(numbered)
    )
    return ",".join(rest), forms


@dataclass(frozen=True)
class CronRule:
    """The five fields of a rule, each as the set of values it allows."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]  # of the month
    months: frozenset[int]
    weekdays: frozenset[int]  # Sunday == 0
    either_day: bool  # both day fields restricted: classic cron lets either one match
    date_forms: DayForms = DayForms()  # L, L-n, nW, LW of the day-of-month field
    weekday_forms: DayForms = DayForms()  # dL, d#n of the day-of-week field

    @classmethod
    def parse(cls, expression: str) -> CronRule:
        fields = _without_macro(expression.strip()).split()
        if len(fields) != 5:
            raise ValueError(f"cron expression {expression!r} does not have five fields")
        minute, hour, day, month, weekday = fields
        # "?" is "no specific value": the same as "*".
        day, weekday = ("*" if f == "?" else f for f in (day, weekday))
        day_rest, date_forms = _day_forms(day, weekday_field=False)
        weekday_rest, weekday_forms = _day_forms(weekday, weekday_field=True)
        weekdays = _values(weekday_rest, range(8), _WEEKDAY_NAMES, 7) if weekday_rest else set()
        return cls(
            minutes=_values(minute, range(60)),
            hours=_values(hour, range(24)),
            days=_values(day_rest, range(1, 32)) if day_rest else frozenset(),
            months=_values(month, range(1, 13), _MONTH_NAMES, cycle=12),
            weekdays=frozenset(v % 7 for v in weekdays),  # 7 is Sunday too
            # Only exactly "*" (or "?") leaves a day field unrestricted.
            either_day=day != "*" and weekday != "*",
            date_forms=date_forms,
            weekday_forms=weekday_forms,
        )

    def matches_day(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        by_date = day.day in self.days or self.date_forms.matches(day)
        by_weekday = (day.weekday() + 1) % 7 in self.weekdays or self.weekday_forms.matches(day)
        if self.either_day:
            return by_date or by_weekday
        return by_date and by_weekday


def _matching_walls(rule: CronRule, first_day: date, last_day: date) -> Iterator[datetime]:
    """The rule's local wall-clock minutes (naive) from `first_day` to `last_day`, in order."""
    day = first_day
    while day <= last_day:
        if rule.matches_day(day):
            for hour in range(24):
                if hour not in rule.hours:
                    continue
                for minute in range(60):
                    if minute in rule.minutes:
                        yield datetime(day.year, day.month, day.day, hour, minute)  # noqa: DTZ001
        day += _DAY


def _wall_of(instant: datetime, tz: ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


def _instants_of(wall: datetime, tz: ZoneInfo) -> list[datetime]:
    """The UTC instants at which the local clock reads `wall`, ascending: one for an ordinary
    time, two for a repeated one (fall back), none for one inside a gap (spring forward)."""
    guesses = {wall.replace(tzinfo=tz, fold=fold).astimezone(UTC) for fold in (0, 1)}
    return sorted(u for u in guesses if _wall_of(u, tz) == wall)


def _gap_end(wall: datetime, tz: ZoneInfo) -> tuple[datetime, datetime]:
    """For a nonexistent `wall`: the first real wall minute after the gap, and the instant the
    clocks jump (to the second: historic offsets are not whole minutes)."""
    later = wall
    for _ in range(_LONGEST_GAP_MINUTES):
        later += _MINUTE
        instants = _instants_of(later, tz)
        if instants:
            break
    else:
        raise ValueError(f"no end of the gap after {wall} in {tz.key}")
    jump = instants[0]
    offset = jump.astimezone(tz).utcoffset()
    while (jump - _SECOND).astimezone(tz).utcoffset() == offset:
        jump -= _SECOND
    return later, jump


def fire_times(
    expression: str,
    time_zone: str,
    start: datetime,
    end: datetime,
    *,
    dst_gap: str,
    dst_fold: str,
) -> tuple[datetime, ...]:
    """Every instant in `[start, end)` (aware) at which the rule fires: aware UTC, ascending."""
    if end <= start:
        return ()
    rule = CronRule.parse(expression)
    tz = load_zone(time_zone)
    shift = dst_gap == Schedule.DstGap.SHIFT
    both = dst_fold == Schedule.DstFold.BOTH
    fires: set[datetime] = set()
    gap: tuple[datetime, datetime] | None = None  # (first real wall after it, jump instant)
    # A day either side: a repeated time's second instant, or the jump of a gap, can lie in
    # the window while the wall time that caused it lies outside.
    first_day = _wall_of(start, tz).date() - _DAY
    last_day = _wall_of(end, tz).date() + _DAY
    for wall in _matching_walls(rule, first_day, last_day):
        instants = _instants_of(wall, tz)
        if instants:
            fires.update(instants if both else instants[:1])
        elif shift:
            if gap is None or wall >= gap[0]:  # walls ascend: a new gap
                gap = _gap_end(wall, tz)
            fires.add(gap[1])
    return tuple(sorted(t for t in fires if start <= t < end))

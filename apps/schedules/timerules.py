"""Tick's time rules: everything Tick promises about *when*.

Pure computation (no database; from Django only the ``Schedule.DstGap`` / ``Schedule.DstFold``
enums that name the DST options). Used by the API (validation, previews) and the materializer
(memoised next-fire computation); the audit checks it with an evaluator of its own.

Semantics (see ``docs/timerules.md`` for the full contract and examples):

* Five-field cron (minute hour day-of-month month day-of-week) plus the macros ``@hourly``,
  ``@daily``, ``@midnight``, ``@weekly``, ``@monthly``, ``@yearly`` and ``@annually``, evaluated
  on the **local wall clock** of an IANA zone loaded from the ``tzdata`` package.
* The day forms of Quartz and EventBridge: ``L``, ``L-n``, ``nW``, ``LW`` in day-of-month,
  ``dL`` and ``d#n`` in day-of-week, ``?`` for either day field; day-of-week and month ranges
  may wrap (``FRI-MON``, ``NOV-MAR``) and a day-of-week range ending at Sunday includes it.
* Classic day rule: when both day fields are restricted (neither is exactly ``*`` or ``?``), a
  day matches if *either* field matches; otherwise both must match. The forms are days like
  any other under it.
* DST: a local time that does not exist is skipped (``dst_gap="skip"``) or, with
  ``dst_gap="shift"``, all matching nonexistent times of one gap collapse into one run at the
  first instant after the jump. A local time that happens twice fires once at its first instant
  (``dst_fold="first"``) or at both instants (``dst_fold="both"``).

The engine iterates *naive* local wall-clock times that match the rule, classifies each one as
unique / ambiguous / nonexistent by asking the zone for its offset with ``fold=0`` and ``fold=1``,
and turns it into UTC instants by explicit offset arithmetic. Instants are compared in UTC only.
"""

from __future__ import annotations

import bisect
import calendar
import functools
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from dataclasses import field as _field_default
from datetime import UTC, date, datetime, timedelta
from importlib import resources
from typing import Final, Literal, NamedTuple, TypeVar
from zoneinfo import ZoneInfo

from apps.schedules.models import Schedule

__all__ = [
    "DST_FOLD_CHOICES",
    "DST_GAP_CHOICES",
    "MAX_COUNT",
    "MAX_EXPRESSION_LENGTH",
    "MAX_LIMIT",
    "SEARCH_HORIZON_YEARS",
    "CacheStats",
    "NextFireCache",
    "PreviewEntry",
    "TimeRuleError",
    "ZoneDescription",
    "available_zones",
    "default_cache",
    "describe_zone",
    "fire_times_between",
    "get_zone",
    "instant_text",
    "next_fire_time",
    "next_fire_times",
    "preview",
    "resolve_one_shot",
    "validate",
    "validate_bounds",
    "validate_expression",
    "validate_zone",
]


#: Longest accepted cron expression (characters).
MAX_EXPRESSION_LENGTH: Final = 200
#: Longest accepted zone name (the longest IANA name is 32 characters).
MAX_ZONE_LENGTH: Final = 64
#: Longest accepted one-shot ``run_at`` string.
MAX_RUN_AT_LENGTH: Final = 64
#: ``next_fire_times`` / ``preview`` return at most this many instants per call.
MAX_COUNT: Final = 10_000
#: ``fire_times_between`` returns at most this many instants per call.
MAX_LIMIT: Final = 100_000
#: ``next_fire_times`` looks at local calendar years ``Y .. Y + SEARCH_HORIZON_YEARS`` where
#: ``Y`` is the local year of ``after``. The rarest satisfiable rule (``0 0 29 2 *``) has a gap of
#: 8 years (2096 -> 2104), so every rule that ``validate`` accepts fires within the horizon.
SEARCH_HORIZON_YEARS: Final = 10

DST_GAP_CHOICES: Final = tuple(Schedule.DstGap.values)
DST_FOLD_CHOICES: Final = tuple(Schedule.DstFold.values)

_T = TypeVar("_T")

_MAX_YEAR: Final = 9998  # keep a margin below datetime.max for offset arithmetic
#: Instants a definition may name (start_at, end_at, run_at): from 1970 to 9998, so offset and
#: window arithmetic never leaves the datetime range (docs/timerules.md).
MIN_INSTANT_YEAR: Final = 1970
MAX_INSTANT_YEAR: Final = _MAX_YEAR
_MIN_INSTANT: Final = datetime(2, 1, 1, tzinfo=UTC)  # and above datetime.min


class TimeRuleError(ValueError):
    """The one error type of this module: ``field`` names the offending input."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


# --------------------------------------------------------------------------------------------
# Zones
# --------------------------------------------------------------------------------------------

_ZONE_NAME_RE: Final = re.compile(r"[A-Za-z0-9_+\-]+(?:/[A-Za-z0-9_+\-]+)*")
_REFUSED_ZONES: Final = frozenset({"Factory", "posixrules", "localtime", "posix", "right"})


@functools.cache
def available_zones() -> frozenset[str]:
    """Zone names Tick accepts: the ``tzdata`` package's list, minus ``Factory``."""
    text = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    names = {line.strip() for line in text.splitlines() if line.strip()}
    return frozenset(n for n in names if n not in _REFUSED_ZONES)


@functools.cache
def _zones_by_folded_name() -> dict[str, str]:
    return {name.casefold(): name for name in available_zones()}


def validate_zone(time_zone: object) -> str:
    """Return the zone name if Tick accepts it, else raise ``TimeRuleError("time_zone")``."""
    field = "time_zone"
    if not isinstance(time_zone, str):
        raise TimeRuleError(field, "The time zone must be a string such as 'Europe/Berlin'.")
    if not time_zone:
        raise TimeRuleError(field, "The time zone is empty; give an IANA name such as 'UTC'.")
    if len(time_zone) > MAX_ZONE_LENGTH:
        raise TimeRuleError(
            field,
            f"The time zone name is too long (over {MAX_ZONE_LENGTH} characters).",
        )
    if not time_zone.isascii() or not _ZONE_NAME_RE.fullmatch(time_zone):
        raise TimeRuleError(
            field,
            "The time zone must be an IANA name such as 'America/New_York' "
            "(letters, digits, '_', '+', '-' and '/'; no paths).",
        )
    if time_zone in _REFUSED_ZONES:
        raise TimeRuleError(field, f"'{time_zone}' is not a real time zone; use an IANA name.")
    if time_zone not in available_zones():
        hint = _zones_by_folded_name().get(time_zone.casefold())
        extra = f" Did you mean '{hint}'?" if hint else ""
        raise TimeRuleError(field, f"Unknown time zone '{time_zone}'.{extra}")
    return time_zone


@functools.lru_cache(maxsize=1024)
def _load_zone(name: str) -> ZoneInfo:
    parts = name.split("/")
    resource = resources.files("tzdata").joinpath("zoneinfo", *parts)
    with resource.open("rb") as fh:
        return ZoneInfo.from_file(fh, key=name)


def get_zone(time_zone: str) -> ZoneInfo:
    """The validated zone, read from the ``tzdata`` package (never from host zone files)."""
    return _load_zone(validate_zone(time_zone))


@dataclass(frozen=True)
class ZoneDescription:
    name: str
    kind: Literal["region", "fixed-offset", "link"]
    same_rules_as: tuple[str, ...]
    note: str | None


@functools.cache
def _zone_groups() -> dict[bytes, tuple[str, ...]]:
    groups: dict[bytes, list[str]] = {}
    root = resources.files("tzdata").joinpath("zoneinfo")
    for name in sorted(available_zones()):
        data = root.joinpath(*name.split("/")).read_bytes()
        groups.setdefault(data, []).append(name)
    return {k: tuple(v) for k, v in groups.items()}


# Well-known names kept by IANA only for backward compatibility ("backward" file).
_LEGACY_PREFIXES: Final = ("US/", "Canada/", "Mexico/", "Brazil/", "Chile/")
_LEGACY_NAMES: Final = {
    "Asia/Calcutta": "Asia/Kolkata",
    "Asia/Saigon": "Asia/Ho_Chi_Minh",
    "Asia/Katmandu": "Asia/Kathmandu",
    "Asia/Rangoon": "Asia/Yangon",
    "Asia/Ulan_Bator": "Asia/Ulaanbaatar",
    "Europe/Kiev": "Europe/Kyiv",
    "America/Buenos_Aires": "America/Argentina/Buenos_Aires",
    "America/Godthab": "America/Nuuk",
    "Pacific/Truk": "Pacific/Chuuk",
    "Atlantic/Faeroe": "Atlantic/Faroe",
    "GB": "Europe/London",
    "Japan": "Asia/Tokyo",
    "Singapore": "Asia/Singapore",
    "Israel": "Asia/Jerusalem",
    "Turkey": "Europe/Istanbul",
    "Egypt": "Africa/Cairo",
    "Eire": "Europe/Dublin",
    "Hongkong": "Asia/Hong_Kong",
    "Iran": "Asia/Tehran",
    "NZ": "Pacific/Auckland",
    "PRC": "Asia/Shanghai",
    "ROC": "Asia/Taipei",
    "ROK": "Asia/Seoul",
}
_ETC_GMT_RE: Final = re.compile(r"Etc/GMT([+-])(\d{1,2})")


def describe_zone(time_zone: str) -> ZoneDescription:
    """Explain a zone name: fixed offsets (with the inverted POSIX sign), legacy aliases."""
    name = validate_zone(time_zone)
    same = tuple(n for n in _zone_groups()[_zone_bytes(name)] if n != name)
    match = _ETC_GMT_RE.fullmatch(name)
    if match:
        sign = "-" if match.group(1) == "+" else "+"
        hours = int(match.group(2))
        note = (
            f"{name} is a fixed offset of UTC{sign}{hours:02d}:00 with no DST. POSIX-style "
            f"'Etc/GMT' names invert the sign: {name} is {hours} hours "
            f"{'behind' if sign == '-' else 'ahead of'} UTC."
        )
        return ZoneDescription(name, "fixed-offset", same, note)
    legacy = _LEGACY_NAMES.get(name)
    if legacy is None and name.startswith(_LEGACY_PREFIXES) and same:
        legacy = next((n for n in same if "/" in n and not n.startswith(_LEGACY_PREFIXES)), None)
    if legacy is not None:
        note = (
            f"{name} is a backward-compatible IANA alias of {legacy}; it behaves identically. "
            f"Tick keeps the name as given."
        )
        return ZoneDescription(name, "link", same, note)
    if name in ("UTC", "Etc/UTC", "Etc/UCT", "UCT", "Zulu", "Etc/Zulu", "Universal"):
        return ZoneDescription(name, "fixed-offset", same, None)
    return ZoneDescription(name, "region", same, None)


def _zone_bytes(name: str) -> bytes:
    return resources.files("tzdata").joinpath("zoneinfo", *name.split("/")).read_bytes()


# --------------------------------------------------------------------------------------------
# Cron parsing (strict; see docs/timerules.md for why croniter's expander is not used)
# --------------------------------------------------------------------------------------------

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES: Final = {
    name: i + 1
    for i, name in enumerate(
        [
            "jan",
            "feb",
            "mar",
            "apr",
            "may",
            "jun",
            "jul",
            "aug",
            "sep",
            "oct",
            "nov",
            "dec",
        ]
    )
}
_DOW_NAMES: Final = {
    name: i for i, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
}


class _FieldSpec(NamedTuple):
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS: Final = (
    _FieldSpec("minute", 0, 59, {}),
    _FieldSpec("hour", 0, 23, {}),
    _FieldSpec("day-of-month", 1, 31, {}),
    _FieldSpec("month", 1, 12, _MONTH_NAMES),
    _FieldSpec("day-of-week", 0, 7, _DOW_NAMES),
)
_VALUE: Final = r"(?:[0-9]{1,4}|[A-Za-z]{3})"
_ELEMENT_RE: Final = re.compile(
    rf"(?P<star>\*)(?:/(?P<sstep>[0-9]{{1,4}}))?"
    rf"|(?P<a>{_VALUE})(?:-(?P<b>{_VALUE}))?(?:/(?P<step>[0-9]{{1,4}}))?"
)
_MONTH_LONG: Final = (
    "",
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)
_MAX_DAYS: Final = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _field_value(spec: _FieldSpec, token: str) -> int:
    if token.isdigit():
        value = int(token)
    else:
        lowered = token.lower()
        if lowered not in spec.names:
            if spec.names:
                allowed = ", ".join(spec.names)
                msg = f"'{token}' is not a valid {spec.name} name (use {allowed} or numbers)."
            else:
                msg = f"'{token}' is not a number; the {spec.name} field takes numbers only."
            raise TimeRuleError("expression", msg)
        value = spec.names[lowered]
    if not spec.low <= value <= spec.high:
        raise TimeRuleError(
            "expression",
            f"The {spec.name} value {value} is out of range ({spec.low}-{spec.high}).",
        )
    return value


class _Field(NamedTuple):
    """One parsed field: its plain values and, in the day fields, the calendar-relative forms
    (docs/timerules.md "Last, nearest and nth days")."""

    values: frozenset[int]
    star: bool  # exactly '*' or '?': the field does not restrict
    wraps: bool  # some range is not plain 'a-b' order (a wrap, or a weekday range to Sunday)
    last: frozenset[int] = frozenset()  # day-of-month 'L' (0) and 'L-n' (n): days before the last
    nearest: frozenset[int] = frozenset()  # day-of-month 'nW': the weekday nearest day n
    last_weekday: bool = False  # day-of-month 'LW'
    last_of: frozenset[int] = frozenset()  # day-of-week 'dL': the last weekday d of the month
    nth: frozenset[tuple[int, int]] = frozenset()  # day-of-week 'd#n': the nth weekday d


_DOM_LAST_RE: Final = re.compile(r"L(?:-(?P<offset>[0-9]{1,4}))?")
_DOM_NEAREST_RE: Final = re.compile(r"(?P<day>[0-9]{1,4})W")
_DOW_LAST_RE: Final = re.compile(rf"(?P<day>{_VALUE})L")
_DOW_NTH_RE: Final = re.compile(rf"(?P<day>{_VALUE})#(?P<nth>[0-9]{{1,4}})")
_EXTENSION_RE: Final = re.compile(r"[0-9]*[LW](?:-[0-9]*)?|LW|[A-Za-z0-9]*#[0-9]*|\?")
_DAY_FORMS: Final = (
    "the day-of-month field takes L, L-n, nW and LW; the day-of-week field takes dL "
    "(e.g. 5L or FRIL) and d#n (e.g. FRI#3); '?' may stand alone for either day field"
)


def _day_forms_error(spec: _FieldSpec, element: str) -> TimeRuleError:
    return TimeRuleError(
        "expression",
        f"'{element}' is not valid in the {spec.name} field: {_DAY_FORMS}.",
    )


@dataclass
class _Specials:
    """The day forms of one field while it is parsed (see ``_Field``)."""

    last: set[int] = _field_default(default_factory=set)
    nearest: set[int] = _field_default(default_factory=set)
    last_weekday: bool = False
    last_of: set[int] = _field_default(default_factory=set)
    nth: set[tuple[int, int]] = _field_default(default_factory=set)


def _dom_special(spec: _FieldSpec, element: str, into: _Specials) -> bool:
    """Read 'L', 'L-n', 'LW' or 'nW' into ``into``; False if the element is none of them."""
    upper = element.upper()
    if upper == "LW":
        into.last_weekday = True
        return True
    m = _DOM_LAST_RE.fullmatch(upper)
    if m is not None:
        offset = int(m.group("offset") or 0)
        if not (m.group("offset") is None or 1 <= offset <= 30):
            raise TimeRuleError(
                "expression",
                f"'{element}' in the {spec.name} field: L-n counts n = 1-30 days back from "
                f"the last day of the month (L-1 is the day before the last).",
            )
        into.last.add(offset)
        return True
    m = _DOM_NEAREST_RE.fullmatch(upper)
    if m is not None:
        day = int(m.group("day"))
        if not 1 <= day <= 31:
            raise TimeRuleError(
                "expression",
                f"'{element}' in the {spec.name} field: the day of nW must be 1-31 "
                f"(e.g. 15W, the weekday nearest the 15th).",
            )
        into.nearest.add(day)
        return True
    return False


def _dow_special(spec: _FieldSpec, element: str, into: _Specials) -> bool:
    """Read 'dL' or 'd#n' into ``into``; False if the element is neither."""
    upper = element.upper()
    if upper == "L":
        raise TimeRuleError(
            "expression",
            f"'L' alone in the {spec.name} field is refused (Quartz reads it as Saturday): "
            f"write SAT, or e.g. 5L or FRIL for the last Friday of the month.",
        )
    m = _DOW_NTH_RE.fullmatch(upper)
    if m is not None:
        day = _field_value(spec, m.group("day")) % 7
        nth = int(m.group("nth"))
        if not 1 <= nth <= 5:
            raise TimeRuleError(
                "expression",
                f"'{element}' in the {spec.name} field: the n of d#n must be 1-5 (a month has "
                f"at most five of a weekday; e.g. FRI#3 is the third Friday).",
            )
        into.nth.add((day, nth))
        return True
    m = _DOW_LAST_RE.fullmatch(upper)
    if m is not None:
        into.last_of.add(_field_value(spec, m.group("day")) % 7)
        return True
    return False


def _range_values(spec: _FieldSpec, element: str, low: int, high: int, step: int) -> list[int]:
    """The values of 'a-b/n'. In day-of-week and month a range may wrap ('FRI-MON',
    'NOV-MAR'); a day-of-week range ending at Sunday (0) runs to 7 ('MON-SUN')."""
    if spec.name == "day-of-week":
        if high == 0 and low > 0:
            high = 7
        if low == 7 and high < 7:
            low = 0
    if low <= high:
        return list(range(low, high + 1, step))
    if spec.name not in ("day-of-week", "month"):
        raise TimeRuleError(
            "expression",
            f"The range '{element}' in the {spec.name} field runs backwards; "
            f"write it as two ranges (e.g. '{low}-{spec.high},{spec.low}-{high}'). "
            f"Only day-of-week and month ranges wrap around (FRI-MON, NOV-MAR).",
        )
    top = 6 if spec.name == "day-of-week" else spec.high
    cycle = [*range(low, top + 1), *range(spec.low, high + 1)]
    return cycle[::step]


def _parse_field(spec: _FieldSpec, text: str) -> _Field:
    is_dom, is_dow = spec.name == "day-of-month", spec.name == "day-of-week"
    if text == "?":
        if not (is_dom or is_dow):
            raise TimeRuleError(
                "expression",
                f"'?' (no specific value) is allowed only in the day-of-month and day-of-week "
                f"fields, not in the {spec.name} field.",
            )
        return _Field(
            frozenset(range(spec.low, min(spec.high, 6 if is_dow else 31) + 1)), True, False
        )
    values: set[int] = set()
    special = _Specials()
    wraps = False
    for element in text.split(","):
        if not element:
            raise TimeRuleError(
                "expression", f"The {spec.name} field '{text}' has an empty list item."
            )
        if is_dom and _dom_special(spec, element, special):
            continue
        if is_dow and _dow_special(spec, element, special):
            continue
        m = _ELEMENT_RE.fullmatch(element)
        if m is None:
            if _EXTENSION_RE.fullmatch(element.upper()) or "#" in element:
                raise _day_forms_error(spec, element)
            raise TimeRuleError(
                "expression",
                f"'{element}' is not valid in the {spec.name} field: use numbers, names, "
                f"'*', ranges 'a-b', lists 'a,b' and steps '*/n' or 'a-b/n'.",
            )
        step_text = m.group("sstep") or m.group("step")
        step = int(step_text) if step_text is not None else 1
        if step == 0:
            raise TimeRuleError(
                "expression",
                f"'{element}': a step of 0 in the {spec.name} field never advances.",
            )
        if m.group("star"):
            low, high = spec.low, spec.high
        else:
            low = _field_value(spec, m.group("a"))
            if m.group("b") is not None:
                high = _field_value(spec, m.group("b"))
                found = _range_values(spec, element, low, high, step)
                wraps = wraps or found != list(range(low, high + 1, step))
                values.update(found)
                continue
            if step_text is not None:
                high = spec.high  # 'a/n' means 'a-max/n' (day of week: to 7; docs/timerules.md)
            else:
                high = low
        values.update(range(low, high + 1, step))
    if is_dow and 7 in values:
        values.discard(7)
        values.add(0)
    return _Field(
        frozenset(values),
        star=text == "*",
        wraps=wraps,
        last=frozenset(special.last),
        nearest=frozenset(special.nearest),
        last_weekday=special.last_weekday,
        last_of=frozenset(special.last_of),
        nth=frozenset(special.nth),
    )


def _month_days(dom: _Field, dow: _Field, year: int, month: int) -> tuple[int, ...]:
    """The days of one month that the two day fields select, under the OR rule."""
    first_weekday, ndays = calendar.monthrange(year, month)  # Monday == 0
    first = (first_weekday + 1) % 7  # cron weekday of the 1st: Sunday == 0

    def weekday(day: int) -> int:
        return (first + day - 1) % 7

    by_date = {day for day in dom.values if day <= ndays}
    by_date.update(ndays - offset for offset in dom.last if offset < ndays)
    for day in dom.nearest:
        if day > ndays:
            continue  # a month without day n has no weekday nearest it
        wd = weekday(day)
        if wd == 6:  # Saturday: the Friday before, unless that leaves the month
            day = day - 1 if day > 1 else day + 2
        elif wd == 0:  # Sunday: the Monday after, unless that leaves the month
            day = day + 1 if day < ndays else day - 2
        by_date.add(day)
    if dom.last_weekday:
        wd = weekday(ndays)
        by_date.add(ndays - (1 if wd == 6 else 2 if wd == 0 else 0))
    by_weekday = {day for day in range(1, ndays + 1) if weekday(day) in dow.values}
    by_weekday.update(ndays - (weekday(ndays) - d) % 7 for d in dow.last_of)
    for d, nth in dow.nth:
        day = 1 + (d - first) % 7 + 7 * (nth - 1)
        if day <= ndays:
            by_weekday.add(day)
    if dom.star or dow.star:
        chosen = by_date & by_weekday
    else:
        chosen = by_date | by_weekday
    return tuple(sorted(chosen))


class _Rule:
    """A compiled five-field rule with a small per-month day cache."""

    __slots__ = (
        "_days",
        "dom",
        "dom_field",
        "dom_star",
        "dow",
        "dow_field",
        "dow_star",
        "hours",
        "minutes",
        "months",
        "relative",
    )

    def __init__(
        self,
        minutes: frozenset[int],
        hours: frozenset[int],
        dom: _Field,
        months: frozenset[int],
        dow: _Field,
    ) -> None:
        self.minutes: tuple[int, ...] = tuple(sorted(minutes))
        self.hours: tuple[int, ...] = tuple(sorted(hours))
        self.dom = dom.values
        self.months: tuple[int, ...] = tuple(sorted(months))
        self.dow = dow.values
        self.dom_star = dom.star
        self.dow_star = dow.star
        self.dom_field = dom
        self.dow_field = dow
        # Some day depends on the month's length or weekdays (L, W, #).
        self.relative = bool(dom.last or dom.nearest or dom.last_weekday or dow.last_of or dow.nth)
        self._days: dict[tuple[int, int], tuple[int, ...]] = {}

    def days(self, year: int, month: int) -> tuple[int, ...]:
        key = (year, month)
        cached = self._days.get(key)
        if cached is not None:
            return cached
        result = _month_days(self.dom_field, self.dow_field, year, month)
        if len(self._days) >= 600:
            self._days.clear()
        self._days[key] = result
        return result

    def ever_fires(self) -> str | None:
        """None if the rule fires at least once every ``SEARCH_HORIZON_YEARS``, else a human
        reason why it never does (or too rarely)."""
        if self.relative:
            return self._relative_fires()
        if not (self.dom_star or self.dow_star):
            return None  # OR rule with a non-empty weekday set: every month has every weekday
        if self.dom_star:
            return None  # weekdays in every month
        possible = [m for m in self.months if any(d <= _MAX_DAYS[m] for d in self.dom)]
        if possible:
            return None
        days = ", ".join(str(d) for d in sorted(self.dom))
        months = ", ".join(_MONTH_LONG[m] for m in self.months)
        return (
            f"never fires: day {days} does not exist in {months} "
            f"(February has at most 29 days; April, June, September and November have 30)."
        )

    def _relative_fires(self) -> str | None:
        """L, W and # depend on a month's length and the weekday of its 1st, so the rule is
        checked over one 400-year Gregorian cycle, which then repeats day for day: each
        month shape (month, length, first weekday) is evaluated once."""
        shapes: dict[tuple[int, int, int], bool] = {}
        years: list[int] = []
        for year in range(2000, 2400):
            for month in self.months:
                first_weekday, ndays = calendar.monthrange(year, month)
                shape = (month, ndays, first_weekday)
                fires = shapes.get(shape)
                if fires is None:
                    fires = shapes[shape] = bool(
                        _month_days(self.dom_field, self.dow_field, year, month)
                    )
                if fires:
                    years.append(year)
                    break
        if not years:
            return "never fires: no month it names has the day it asks for."
        gaps = [b - a for a, b in zip(years, [*years[1:], years[0] + 400], strict=True)]
        if max(gaps) > SEARCH_HORIZON_YEARS:
            return (
                f"fires too rarely: it can go {max(gaps)} years without a run (e.g. a fifth "
                f"weekday in February); Tick accepts rules that run at least once every "
                f"{SEARCH_HORIZON_YEARS} years."
            )
        return None


def _normalise_expression(expression: object) -> str:
    field = "expression"
    if not isinstance(expression, str):
        raise TimeRuleError(field, "The cron expression must be a string.")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise TimeRuleError(
            field,
            f"The cron expression is too long (over {MAX_EXPRESSION_LENGTH} characters).",
        )
    if not expression.isascii():
        raise TimeRuleError(
            field,
            "The cron expression may only contain ASCII characters "
            "(digits 0-9, letters, '*', ',', '-', '/' and spaces).",
        )
    if any(not (ch.isprintable() or ch == "\t") for ch in expression):
        raise TimeRuleError(
            field,
            "The cron expression contains control characters (newlines, NUL, ...).",
        )
    text = expression.strip()
    if not text:
        raise TimeRuleError(field, "The cron expression is empty.")
    return text


def _compile(expression: object) -> _Rule:
    if not isinstance(expression, str):
        raise TimeRuleError("expression", "The cron expression must be a string.")
    return _compile_cached(expression)


@functools.lru_cache(maxsize=4096)
def _compile_cached(expression: str) -> _Rule:
    text = _normalise_expression(expression)
    if text.startswith("@"):
        macro = text.lower()
        if macro == "@reboot":
            raise TimeRuleError(
                "expression",
                "@reboot is not supported: Tick schedules run at clock times.",
            )
        if macro not in _MACROS:
            known = ", ".join(_MACROS)
            raise TimeRuleError("expression", f"Unknown macro '{text}'; use one of {known}.")
        text = _MACROS[macro]
    parts = text.split()
    if len(parts) != 5:
        if len(parts) in (6, 7):
            msg = (
                f"Expected 5 fields (minute hour day-of-month month day-of-week), got "
                f"{len(parts)}: Tick does not support seconds or year fields."
            )
        else:
            msg = (
                f"Expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}."
            )
        raise TimeRuleError("expression", msg)
    fields = [_parse_field(spec, part) for spec, part in zip(_FIELDS, parts, strict=True)]
    rule = _Rule(fields[0].values, fields[1].values, fields[2], fields[3].values, fields[4])
    reason = rule.ever_fires()
    if reason is not None:
        raise TimeRuleError("expression", f"'{expression.strip()}' {reason}")
    return rule


def validate_expression(expression: str) -> None:
    """Raise ``TimeRuleError("expression")`` unless the cron expression is acceptable."""
    _compile(expression)


def _ranges(values: Iterable[int]) -> str:
    """Sorted values as cron list items, runs of three or more as ranges: ``1-5,7``."""
    items: list[str] = []
    run: list[int] = []
    for value in sorted(values):
        if run and value == run[-1] + 1:
            run.append(value)
            continue
        if run:
            items.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
        run = [value]
    if run:
        items.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(map(str, run)))
    return ",".join(items)


def expanded_fields(expression: str) -> tuple[str, str, str, str, str]:
    """The five fields of a valid expression (macros expanded), written so that a standard
    cron reader describes what Tick runs (docs/ui.md "Rules in words"). The day of week is
    written from the parsed days, Sunday as 0: Tick reads ``7`` as Sunday and ``a/n`` as
    ``a-7/n``, where readers say "every n weeks" or "Sunday through Sunday"; all seven days
    make every day match under the OR rule, so both day fields then read ``*``. A stepped
    field that names one value is written as that value (``*/60`` is minute 0, not "every 60
    minutes"). Raises ``TimeRuleError``."""
    rule = _compile(expression)
    text = expression.strip()
    fields = (_MACROS[text.lower()] if text.startswith("@") else text).split()
    minute, hour, dom, month, dow = fields
    sets = (rule.minutes, rule.hours, rule.dom, rule.months)
    minute, hour, dom, month = (
        str(next(iter(values))) if "/" in field and len(values) == 1 else field
        for field, values in zip((minute, hour, dom, month), sets, strict=True)
    )
    day_field, weekday_field = rule.dom_field, rule.dow_field
    if rule.dom_star:
        dom = "*"  # '?' too
    elif day_field.last or day_field.nearest or day_field.last_weekday:
        items = [_ranges(day_field.values)] if day_field.values else []
        items += [f"L-{n}" if n else "L" for n in sorted(day_field.last)]
        items += [f"{n}W" for n in sorted(day_field.nearest)]
        items += ["LW"] if day_field.last_weekday else []
        dom = ",".join(items)
    if _parse_field(_FIELDS[3], month).wraps:
        month = _ranges(rule.months)  # a wrapped range ('NOV-MAR') as plain ranges
    if rule.dow_star:
        dow = "*"
    elif len(rule.dow) == 7:
        dom, dow = "*", "*"
    else:
        items = []
        if rule.dow:
            # Sunday as 0 or as 7, whichever reads shorter ("5-7" = Friday through Sunday).
            as_seven = {7 if day == 0 else day for day in rule.dow}
            items.append(min(_ranges(as_seven), _ranges(rule.dow), key=lambda t: t.count(",")))
        items += [f"{d}L" for d in sorted(weekday_field.last_of)]
        items += [f"{d}#{n}" for d, n in sorted(weekday_field.nth)]
        dow = ",".join(items)
    return minute, hour, dom, month, dow


def validate(expression: str, time_zone: str) -> None:
    """Validate a cron rule and its zone; raises ``TimeRuleError`` naming the field."""
    _compile(expression)
    get_zone(time_zone)


def _check_options(dst_gap: str, dst_fold: str) -> None:
    for field, value, choices in (
        ("dst_gap", dst_gap, DST_GAP_CHOICES),
        ("dst_fold", dst_fold, DST_FOLD_CHOICES),
    ):
        if value not in choices:
            allowed = " or ".join(repr(choice) for choice in choices)
            raise TimeRuleError(field, f"{field} must be {allowed}, not {value!r}.")


def _to_utc(value: object, field: str) -> datetime:
    if not isinstance(value, datetime):
        raise TimeRuleError(field, f"{field} must be a datetime.")
    if value.tzinfo is UTC:
        return value
    if value.tzinfo is None or value.utcoffset() is None:
        raise TimeRuleError(field, f"{field} must be timezone-aware (naive datetimes are refused).")
    return value.astimezone(UTC)


def _check_year(value: datetime, field: str) -> datetime:
    if not MIN_INSTANT_YEAR <= value.year <= MAX_INSTANT_YEAR:
        raise TimeRuleError(
            field,
            f"{field} must be between the years {MIN_INSTANT_YEAR} and {MAX_INSTANT_YEAR}, "
            f"not {value.year}.",
        )
    return value


def instant_text(instant: datetime) -> str:
    """An instant as the API writes it: RFC 3339 in UTC with ``Z``, microseconds only when it
    has a sub-second part (``2026-12-03T06:00:00Z``) — DRF's own output in this project's
    UTC time zone, so hand-made and serializer timestamps read alike (docs/api.md)."""
    return instant.astimezone(UTC).isoformat().removesuffix("+00:00") + "Z"


def validate_bounds(start_at: datetime | None, end_at: datetime | None) -> None:
    """``start_at``/``end_at`` must be aware; ``end_at`` must be strictly after ``start_at``.

    Bounds are half-open: a schedule fires at instants ``t`` with ``start_at <= t < end_at``.
    """
    start = _check_year(_to_utc(start_at, "start_at"), "start_at") if start_at is not None else None
    end = _check_year(_to_utc(end_at, "end_at"), "end_at") if end_at is not None else None
    if start is not None and end is not None and end <= start:
        raise TimeRuleError(
            "end_at",
            f"end_at ({instant_text(end)}) must be after start_at ({instant_text(start)}).",
        )


# --------------------------------------------------------------------------------------------
# Engine
# --------------------------------------------------------------------------------------------

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
        shift=dst_gap == Schedule.DstGap.SHIFT,
        both=dst_fold == Schedule.DstFold.BOTH,
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


def _check_count(count: object, field: str = "count", maximum: int = MAX_COUNT) -> int:
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= maximum:
        raise TimeRuleError(field, f"{field} must be an integer between 0 and {maximum}.")
    return count


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


def next_fire_times(
    expression: str,
    time_zone: str,
    after: datetime,
    count: int,
    *,
    dst_gap: str = Schedule.DstGap.SKIP,
    dst_fold: str = Schedule.DstFold.FIRST,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> list[datetime]:
    """The next ``count`` fire instants strictly after ``after``: aware UTC, ascending.

    Fewer are returned only when the rule does not fire again within ``SEARCH_HORIZON_YEARS``
    (or before ``end_at``). ``start_at``/``end_at`` bound the result to ``[start_at, end_at)``.
    Not memoised (see ``NextFireCache`` for the materializer's path).
    """
    query = _query(expression, time_zone, dst_gap, dst_fold)
    count = _check_count(count)
    low, end = _window(after, start_at, end_at)
    return _collect(query, low, count, None, end, False)


def next_fire_time(
    expression: str,
    time_zone: str,
    after: datetime,
    *,
    dst_gap: str = Schedule.DstGap.SKIP,
    dst_fold: str = Schedule.DstFold.FIRST,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> datetime | None:
    """The next fire instant strictly after ``after`` (aware UTC), or None within the horizon."""
    query = _query(expression, time_zone, dst_gap, dst_fold)
    low, end = _window(after, start_at, end_at)
    found = _collect(query, low, 1, None, end, False)
    return found[0] if found else None


# --------------------------------------------------------------------------------------------
# One-shot
# --------------------------------------------------------------------------------------------


def resolve_one_shot(
    run_at: datetime | str,
    time_zone: str,
    *,
    dst_gap: str = Schedule.DstGap.SKIP,
    dst_fold: str = Schedule.DstFold.FIRST,
) -> datetime:
    """The UTC instant of a one-shot schedule.

    * An aware ``run_at`` (or an ISO string with an offset or ``Z``) is an absolute instant:
      returned in UTC as is; ``time_zone`` is still validated (previews show local time in it).
    * A naive ``run_at`` is a local wall time in ``time_zone``. If it happens twice, the first
      instant is used (a one-shot runs once, so ``dst_fold="both"`` also means the first). If it
      does not exist, ``dst_gap="skip"`` refuses it with ``TimeRuleError("run_at")`` (skipping the
      only run would silently drop the job) and ``dst_gap="shift"`` runs it at the first instant
      after the clocks jump.
    """
    tz = get_zone(time_zone)
    _check_options(dst_gap, dst_fold)
    if isinstance(run_at, str):
        run_at = _parse_run_at(run_at)
    if not isinstance(run_at, datetime):
        raise TimeRuleError("run_at", "run_at must be a datetime or an ISO 8601 string.")
    _check_year(run_at, "run_at")  # before any offset arithmetic (near datetime.min/max)
    if run_at.tzinfo is not None and run_at.utcoffset() is not None:
        return _check_year(run_at.astimezone(UTC), "run_at")
    wall = run_at.replace(tzinfo=None)
    off0 = wall.replace(tzinfo=tz).utcoffset()
    off1 = wall.replace(tzinfo=tz, fold=1).utcoffset()
    assert off0 is not None and off1 is not None
    if off0 >= off1:  # unique, or repeated: the first instant uses the pre-transition offset
        return _check_year((wall - off0).replace(tzinfo=UTC), "run_at")
    moment = _transition(tz, wall - off1, wall - off0)
    if dst_gap == Schedule.DstGap.SHIFT:
        return _check_year(moment.replace(tzinfo=UTC), "run_at")
    before, after_jump = _jump(tz, moment)
    raise TimeRuleError(
        "run_at",
        f"{wall:%Y-%m-%d %H:%M} does not exist in {time_zone}: clocks jump from "
        f"{before} to {after_jump} that day. Choose another time, or set "
        f"dst_gap={Schedule.DstGap.SHIFT.value!r} to run at {after_jump}.",
    )


def _parse_run_at(text: str) -> datetime:
    if len(text) > MAX_RUN_AT_LENGTH or not text.isascii() or not text.strip():
        raise TimeRuleError("run_at", "run_at must be an ISO 8601 date-time string.")
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        raise TimeRuleError(
            "run_at",
            f"'{text}' is not an ISO 8601 date-time (e.g. 2026-03-08T09:30:00-05:00 or "
            f"2026-03-08T09:30 for a local time in the schedule's zone).",
        ) from None


# --------------------------------------------------------------------------------------------
# Preview
# --------------------------------------------------------------------------------------------


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
    expression: str,
    time_zone: str,
    after: datetime,
    count: int,
    *,
    dst_gap: str = Schedule.DstGap.SKIP,
    dst_fold: str = Schedule.DstFold.FIRST,
    start_at: datetime | None = None,
    end_at: datetime | None = None,
) -> list[PreviewEntry]:
    """The next ``count`` fire instants with local time, offset and DST notes.

    The instants are exactly those of ``next_fire_times`` with the same arguments.
    """
    query = _query(expression, time_zone, dst_gap, dst_fold)
    count = _check_count(count)
    low, end = _window(after, start_at, end_at)
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


# --------------------------------------------------------------------------------------------
# DST changes ahead
# --------------------------------------------------------------------------------------------


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
    dst_gap: str = Schedule.DstGap.SKIP,
    dst_fold: str = Schedule.DstFold.FIRST,
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


# --------------------------------------------------------------------------------------------
# Memoised path for the materializer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evaluations: int
    size: int
    maxsize: int


class NextFireCache:
    """Bounded LRU memo of rule evaluations keyed by ``(expression, zone, dst_gap, dst_fold,
    after)`` (``after`` normalised to UTC) and, for ranges, ``(…, until, limit)``.

    500,000 schedules sharing 50 (expression, zone) pairs and one ``after`` cost 50 evaluations.
    Thread-safe (``functools.lru_cache``); invalid input raises ``TimeRuleError`` and is not
    cached.
    """

    def __init__(self, maxsize: int = 100_000) -> None:
        if maxsize <= 0:
            raise ValueError("maxsize must be positive")
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._evaluations = 0
        self._next = functools.lru_cache(maxsize=maxsize)(self._compute_next)
        self._range = functools.lru_cache(maxsize=max(1, maxsize // 4))(self._compute_range)

    def _count(self) -> None:
        with self._lock:
            self._evaluations += 1

    # The memo keys: flat argument lists (a nested tuple would cost every lookup a rehash).
    def _compute_next(
        self, expression: str, time_zone: str, dst_gap: str, dst_fold: str, after: datetime
    ) -> datetime | None:
        self._count()
        query = _query(expression, time_zone, dst_gap, dst_fold)
        found = _collect(query, after, 1, None, None, False)
        return found[0] if found else None

    def _compute_range(
        self,
        expression: str,
        time_zone: str,
        dst_gap: str,
        dst_fold: str,
        after: datetime,
        until: datetime,
        limit: int,
    ) -> tuple[datetime, ...]:
        self._count()
        query = _query(expression, time_zone, dst_gap, dst_fold)
        limit = _check_count(limit, "limit", MAX_LIMIT)
        low = _to_utc(after, "after")
        high = _to_utc(until, "until")
        if high <= low:
            return ()
        try:
            last_year = high.astimezone(query.tz).year + 1
        except OverflowError:
            last_year = _MAX_YEAR
        return tuple(_collect(query, low, limit, last_year, high, True))

    def next_after(
        self,
        expression: str,
        time_zone: str,
        after: datetime,
        *,
        dst_gap: str = Schedule.DstGap.SKIP,
        dst_fold: str = Schedule.DstFold.FIRST,
    ) -> datetime | None:
        """Memoised ``next_fire_time`` (aware UTC or None)."""
        if after.tzinfo is not UTC:
            after = _to_utc(after, "after")
        return _lookup(self._next, expression, time_zone, dst_gap, dst_fold, after)

    def fire_times_between(
        self,
        expression: str,
        time_zone: str,
        after: datetime,
        until: datetime,
        *,
        dst_gap: str = Schedule.DstGap.SKIP,
        dst_fold: str = Schedule.DstFold.FIRST,
        limit: int = 1000,
    ) -> list[datetime]:
        """Memoised: all fire instants in ``(after, until]`` (aware UTC, ascending), at most
        ``limit``. Apply a schedule's ``start_at``/``end_at`` by narrowing ``after``/``until``
        before calling."""
        after = _to_utc(after, "after")
        until = _to_utc(until, "until")
        key = (expression, time_zone, dst_gap, dst_fold, after, until, limit)
        return list(_lookup(self._range, *key))

    def next_after_many(
        self, items: Iterable[tuple[str, str, str, str, datetime]]
    ) -> list[datetime | None]:
        """Batch ``next_after`` over ``(expression, time_zone, dst_gap, dst_fold, after)``."""
        compute = self._next
        out: list[datetime | None] = []
        append = out.append
        for expression, time_zone, dst_gap, dst_fold, after in items:
            if after.tzinfo is not UTC:
                after = _to_utc(after, "after")
            append(compute(expression, time_zone, dst_gap, dst_fold, after))
        return out

    def fire_times_many(
        self,
        items: Iterable[tuple[str, str, str, str, datetime]],
        until: datetime,
        *,
        limit: int = 1000,
    ) -> list[list[datetime]]:
        """Batch ``fire_times_between`` with one horizon ``until`` for all items."""
        until = _to_utc(until, "until")
        compute = self._range
        out: list[list[datetime]] = []
        for expression, time_zone, dst_gap, dst_fold, after in items:
            if after.tzinfo is not UTC:
                after = _to_utc(after, "after")
            out.append(list(compute(expression, time_zone, dst_gap, dst_fold, after, until, limit)))
        return out

    def stats(self) -> CacheStats:
        a, b = self._next.cache_info(), self._range.cache_info()
        return CacheStats(
            hits=a.hits + b.hits,
            misses=a.misses + b.misses,
            evaluations=self._evaluations,
            size=a.currsize + b.currsize,
            maxsize=self.maxsize,
        )

    def clear(self) -> None:
        self._next.cache_clear()
        self._range.cache_clear()
        with self._lock:
            self._evaluations = 0


def _lookup(memo: Callable[..., _T], *key: object) -> _T:
    """``memo(*key)``; an unhashable key means an expression or zone that is not a string."""
    try:
        return memo(*key)
    except TypeError:
        raise TimeRuleError("expression", "expression and time_zone must be strings.") from None


default_cache: Final = NextFireCache()
#: All fire instants in ``(after, until]`` (aware UTC, ascending), at most ``limit``: the
#: memoised ``NextFireCache.fire_times_between`` of ``default_cache``.
fire_times_between: Final = default_cache.fire_times_between

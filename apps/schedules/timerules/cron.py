"""Cron parsing and validation: Tick's strict five-field dialect and the day forms.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as _field_default
from typing import Final, NamedTuple

from apps.schedules.timerules.base import SEARCH_HORIZON_YEARS, TimeRuleError
from apps.schedules.timerules.zones import get_zone

#: Longest accepted cron expression (characters).
MAX_EXPRESSION_LENGTH: Final = 200

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


def _within(spec: _FieldSpec, element: str, value: int, low: int, high: int, rule: str) -> int:
    """`value` when in `low`-`high`, else the element's error with `rule` in words."""
    if not low <= value <= high:
        raise TimeRuleError("expression", f"'{element}' in the {spec.name} field: {rule}")
    return value


def _dom_special(spec: _FieldSpec, element: str, into: _Specials) -> bool:
    """Read 'L', 'L-n', 'LW' or 'nW' into ``into``; False if the element is none of them."""
    upper = element.upper()
    if upper == "LW":
        into.last_weekday = True
        return True
    m = _DOM_LAST_RE.fullmatch(upper)
    if m is not None:
        offset = 0
        if m.group("offset") is not None:
            offset = _within(spec, element, int(m.group("offset")), 1, 30, (
                "L-n counts n = 1-30 days back from the last day of the month (L-1 is the day "
                "before the last)."
            ))  # fmt: skip
        into.last.add(offset)
        return True
    m = _DOM_NEAREST_RE.fullmatch(upper)
    if m is not None:
        day = _within(spec, element, int(m.group("day")), 1, 31, (
            "the day of nW must be 1-31 (e.g. 15W, the weekday nearest the 15th)."
        ))  # fmt: skip
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
        nth = _within(spec, element, int(m.group("nth")), 1, 5, (
            "the n of d#n must be 1-5 (a month has at most five of a weekday; e.g. FRI#3 is "
            "the third Friday)."
        ))  # fmt: skip
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

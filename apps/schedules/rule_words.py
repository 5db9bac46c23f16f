"""A schedule's rule in words ("At 09:00, Monday through Friday") for the pages and the API.
The words come from cron-descriptor (docs/decisions.md "Rules in words"); the expression is
first validated and rewritten by `timerules.expanded_fields`, so only what Tick accepts is
described, in the sense Tick runs it. Whatever the library cannot describe falls back to the
expression itself."""

from __future__ import annotations

from datetime import datetime

from cron_descriptor import ExpressionDescriptor, Options

from apps.schedules import timerules
from apps.schedules.models import Schedule


def _options() -> Options:
    options = Options()
    options.use_24hour_time_format = True
    options.locale_code = "en_US"
    options.verbose = False
    return options


def cron_in_words(expression: str) -> str:
    """The rule in words; raises `timerules.TimeRuleError` when Tick refuses the expression,
    and answers the expression unchanged when the library cannot describe it."""
    fields = timerules.expanded_fields(expression)
    try:
        minute, hour, dom, month, dow = fields
        own = _day_forms_in_words(dom, dow)
        if own is not None:
            # The library misreads lists mixing L, W or # ("1,L": "on day 1 and L"): it
            # describes the rest of the rule, Tick the days.
            left, days = own
            rest = ExpressionDescriptor(" ".join((minute, hour, left, month, "*")), _options())
            joiner = ", or " if left != "*" else ", "
            return f"{rest.get_description()}{joiner}{days}"
        return str(ExpressionDescriptor(" ".join(fields), _options()).get_description())
    except Exception:  # noqa: BLE001 — any failure of the describer: show the expression
        return expression.strip()


_WEEKDAYS = ("Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_ORDINALS = ("", "first", "second", "third", "fourth", "fifth")
_FORM_LETTERS = ("L", "W", "#")


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _day_item(item: str) -> str:
    if item == "L":
        return "the last day"
    if item == "LW":
        return "the last weekday"
    if item == "L-1":
        return "the day before the last day"
    if item.startswith("L-"):
        return f"{item[2:]} days before the last day"
    if item.endswith("W"):
        return f"the weekday nearest day {item[:-1]}"
    return f"day {item}"


def _weekday_item(item: str) -> str:
    if item.endswith("L"):
        return f"the last {_WEEKDAYS[int(item[:-1]) % 7]}"
    if "#" in item:
        day, _, nth = item.partition("#")
        return f"the {_ORDINALS[int(nth)]} {_WEEKDAYS[int(day) % 7]}"
    first, _, last = item.partition("-")
    if last:
        return f"{_WEEKDAYS[int(first) % 7]} through {_WEEKDAYS[int(last) % 7]}"
    return _WEEKDAYS[int(first) % 7]


def _day_forms_in_words(dom: str, dow: str) -> tuple[str, str] | None:
    """Tick's words for day fields (as `timerules.expanded_fields` writes them) whose L, W or
    # items the library misdescribes: in a list, `L-1` ("1 days before"), or beside a
    restricted other day field (it drops the "or"). Answers the day-of-month field left for
    the library (a stepped one it words well) and the words; None when the library is right."""
    forms = [f for f in (dom, dow) if any(c in f for c in _FORM_LETTERS)]
    both = dom != "*" and dow != "*"  # the OR rule: say "or"
    if not forms or not (both or any("," in f or f == "L-1" for f in forms)):
        return None
    parts = []
    left = "*"
    if any(c in dom for c in "*/") and dom != "*":
        left = dom  # a stepped day of month: the library words it
    elif dom != "*":
        parts.append(f"on {_joined([_day_item(i) for i in dom.split(',')])} of the month")
    if dow != "*":
        of_month = " of the month" if any(c in dow for c in _FORM_LETTERS) else ""
        parts.append(f"on {_joined([_weekday_item(i) for i in dow.split(',')])}{of_month}")
    return left, ", or ".join(parts)


def one_shot_in_words(run_at: datetime, time_zone: str) -> str:
    """The one-shot's instant on the zone's wall clock: "Once at 2026-12-24 09:00 EST
    (America/New_York)"."""
    local = run_at.astimezone(timerules.get_zone(time_zone))
    zone = "UTC" if time_zone == "UTC" else f"{local.tzname()} ({time_zone})"
    return f"Once at {local:%Y-%m-%d %H:%M} {zone}"


def schedule_in_words(schedule: Schedule) -> str:
    if schedule.kind == Schedule.Kind.ONE_SHOT:
        if schedule.run_at is None:
            return "Once"
        return one_shot_in_words(schedule.run_at, schedule.time_zone)
    if schedule.kind == Schedule.Kind.INTERVAL:
        if schedule.interval_s is None or schedule.start_at is None:
            return "Fixed rate"
        # "Every 90 minutes from 2026-12-04 09:00 UTC": elapsed time, so no local clock.
        words = timerules.interval_rule_words(schedule.interval_s, schedule.start_at)
        return words[:1].upper() + words[1:]
    try:
        return cron_in_words(schedule.expression)
    except timerules.TimeRuleError:  # a saved rule is valid; a stored oddity shows as is
        return schedule.expression

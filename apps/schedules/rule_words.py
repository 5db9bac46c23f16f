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
        return str(ExpressionDescriptor(" ".join(fields), _options()).get_description())
    except Exception:  # noqa: BLE001 — any failure of the describer: show the expression
        return expression.strip()


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
    try:
        return cron_in_words(schedule.expression)
    except timerules.TimeRuleError:  # a saved rule is valid; a stored oddity shows as is
        return schedule.expression

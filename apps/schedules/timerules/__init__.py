"""Tick's time rules: everything Tick promises about *when*.

Pure computation: no database and nothing from Django (``python -c "import
apps.schedules.timerules"`` works without settings), so the DST options are enums of this
package (``DstGap``, ``DstFold``) that the schedule model imports. Used by the API
(validation, previews) and the materializer (memoised next-fire computation); the audit checks
it with an evaluator of its own. This module is the public entry; the parts, in reading order:

* ``base`` — the shared limits, the DST option enums, ``TimeRuleError``, bounds;
* ``zones`` — IANA zones from the ``tzdata`` package;
* ``cron`` — the strict five-field parser, the day forms, validation;
* ``engine`` — local wall-clock minutes to UTC instants under the DST contract;
* ``preview`` — instants with local time, offset and DST notes;
* ``one_shot`` — a one-shot's instant;
* ``dst_changes`` — the DST changes ahead that touch a rule;
* ``interval`` — fixed-rate rules: every N seconds of elapsed time from an anchor;
* ``cache`` — the memoised path for the materializer.

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
* Fixed rate (``interval``): ``anchor + k * period``, by elapsed time in UTC, never moved by
  DST.
* DST: a local time that does not exist is skipped (``dst_gap="skip"``) or, with
  ``dst_gap="shift"``, all matching nonexistent times of one gap collapse into one run at the
  first instant after the jump. A local time that happens twice fires once at its first instant
  (``dst_fold="first"``) or at both instants (``dst_fold="both"``).

The engine iterates *naive* local wall-clock times that match the rule, classifies each one as
unique / ambiguous / nonexistent by asking the zone for its offset with ``fold=0`` and ``fold=1``,
and turns it into UTC instants by explicit offset arithmetic. Instants are compared in UTC only.
"""

from __future__ import annotations

from apps.schedules.timerules.base import (
    DST_FOLD_CHOICES,
    DST_GAP_CHOICES,
    MAX_COUNT,
    MAX_INSTANT_YEAR,
    MAX_LIMIT,
    MIN_INSTANT_YEAR,
    SEARCH_HORIZON_YEARS,
    DstFold,
    DstGap,
    TimeRuleError,
    instant_text,
    validate_bounds,
)
from apps.schedules.timerules.cache import (
    CacheStats,
    NextFireCache,
    default_cache,
    fire_times_between,
)
from apps.schedules.timerules.cron import (
    MAX_EXPRESSION_LENGTH,
    _compile_cached,
    expanded_fields,
    validate,
    validate_expression,
)
from apps.schedules.timerules.dst_changes import DstChange, dst_changes
from apps.schedules.timerules.engine import next_fire_time, next_fire_times
from apps.schedules.timerules.interval import (
    MAX_INTERVAL_S,
    MIN_INTERVAL_S,
    interval_fire_times,
    interval_fire_times_between,
    interval_preview,
    interval_rule_words,
    interval_words,
    validate_interval,
)
from apps.schedules.timerules.one_shot import resolve_one_shot
from apps.schedules.timerules.preview import PreviewEntry, preview, preview_one_shot
from apps.schedules.timerules.zones import (
    ZoneDescription,
    available_zones,
    describe_zone,
    get_zone,
    validate_zone,
)

__all__ = [
    "DST_FOLD_CHOICES",
    "DST_GAP_CHOICES",
    "MAX_COUNT",
    "MAX_EXPRESSION_LENGTH",
    "MAX_INSTANT_YEAR",
    "MAX_INTERVAL_S",
    "MAX_LIMIT",
    "MIN_INSTANT_YEAR",
    "MIN_INTERVAL_S",
    "SEARCH_HORIZON_YEARS",
    "CacheStats",
    "DstChange",
    "DstFold",
    "DstGap",
    "NextFireCache",
    "PreviewEntry",
    "TimeRuleError",
    "ZoneDescription",
    "_compile_cached",
    "available_zones",
    "default_cache",
    "describe_zone",
    "dst_changes",
    "expanded_fields",
    "fire_times_between",
    "get_zone",
    "instant_text",
    "interval_fire_times",
    "interval_fire_times_between",
    "interval_preview",
    "interval_rule_words",
    "interval_words",
    "next_fire_time",
    "next_fire_times",
    "preview",
    "preview_one_shot",
    "resolve_one_shot",
    "validate",
    "validate_bounds",
    "validate_expression",
    "validate_interval",
    "validate_zone",
]

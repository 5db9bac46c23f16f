"""What every part of the time rules shares: the limits of more than one part (how many
instants a call may ask for, how far a search looks), the DST options and the one error type.
A part's own limit stands in that part (``cron``, ``zones``, ``one_shot``, ``interval``).

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final, TypeVar

from apps.schedules.rule_options import DstFold as DstFold
from apps.schedules.rule_options import DstGap as DstGap

#: ``next_fire_times`` / ``preview`` return at most this many instants per call.
MAX_COUNT: Final = 10_000
#: ``fire_times_between`` returns at most this many instants per call.
MAX_LIMIT: Final = 100_000
#: ``next_fire_times`` looks at local calendar years ``Y .. Y + SEARCH_HORIZON_YEARS`` where
#: ``Y`` is the local year of ``after``. The rarest satisfiable rule (``0 0 29 2 *``) has a gap of
#: 8 years (2096 -> 2104), so every rule that ``validate`` accepts fires within the horizon.
SEARCH_HORIZON_YEARS: Final = 10

DST_GAP_CHOICES: Final = tuple(DstGap)
DST_FOLD_CHOICES: Final = tuple(DstFold)

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


def _check_options(dst_gap: str, dst_fold: str) -> None:
    for field, value, choices in (
        ("dst_gap", dst_gap, DST_GAP_CHOICES),
        ("dst_fold", dst_fold, DST_FOLD_CHOICES),
    ):
        if value not in choices:
            allowed = " or ".join(repr(choice) for choice in choices)
            raise TimeRuleError(field, f"{field} must be {allowed}, not {value!r}.")


def _check_count(count: object, field: str = "count", maximum: int = MAX_COUNT) -> int:
    """How many instants a call may ask for (``count``, or ``limit`` up to ``MAX_LIMIT``): a
    whole number from 0 to ``maximum``, else ``TimeRuleError(field)``."""
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= maximum:
        raise TimeRuleError(field, f"{field} must be an integer between 0 and {maximum}.")
    return count


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

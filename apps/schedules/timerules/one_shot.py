"""One-shot schedules: an absolute instant, or a local wall time in a zone.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from apps.schedules.timerules.base import (
    DstFold,
    DstGap,
    TimeRuleError,
    _check_options,
    _check_year,
)
from apps.schedules.timerules.engine import _transition
from apps.schedules.timerules.preview import _jump
from apps.schedules.timerules.zones import get_zone

#: Longest accepted one-shot ``run_at`` string.
MAX_RUN_AT_LENGTH: Final = 64


def resolve_one_shot(
    run_at: datetime | str,
    time_zone: str,
    *,
    dst_gap: str = DstGap.SKIP,
    dst_fold: str = DstFold.FIRST,
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
    if dst_gap == DstGap.SHIFT:
        return _check_year(moment.replace(tzinfo=UTC), "run_at")
    before, after_jump = _jump(tz, moment)
    raise TimeRuleError(
        "run_at",
        f"{wall:%Y-%m-%d %H:%M} does not exist in {time_zone}: clocks jump from "
        f"{before} to {after_jump} that day. Choose another time, or set "
        f"dst_gap={DstGap.SHIFT.value!r} to run at {after_jump}.",
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

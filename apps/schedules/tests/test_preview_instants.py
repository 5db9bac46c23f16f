"""The entries of chosen instants of a saved schedule (its next fires on its page): worded
as the rule's preview words them, whichever instants are left out between them."""

from __future__ import annotations

from datetime import UTC, datetime

from apps.schedules.models import Schedule
from apps.schedules.services import schedule_preview_instants


def _daily_new_york() -> Schedule:
    return Schedule(
        kind=Schedule.Kind.CRON, expression="30 2 * * *", time_zone="America/New_York",
        dst_gap=Schedule.DstGap.SKIP, dst_fold=Schedule.DstFold.FIRST,
    )  # fmt: skip


def test_each_instant_is_worded_with_its_local_time_and_dst_note():
    # 02:30 does not exist on 2026-03-08 in New York: the next entry says it was skipped
    instants = [datetime(2026, 3, 7, 7, 30, tzinfo=UTC), datetime(2026, 3, 9, 6, 30, tzinfo=UTC)]

    entries = schedule_preview_instants(schedule=_daily_new_york(), instants=instants)

    assert [e.at_utc for e in entries] == instants
    assert [e.local_wall for e in entries] == ["2026-03-07 02:30", "2026-03-09 02:30"]
    assert entries[0].note is None
    assert entries[1].note is not None and "skipped" in entries[1].note


def test_an_instant_left_out_between_them_takes_no_place():
    # the 6th already ran out of turn: the 5th and 7th are listed, nothing else
    instants = [datetime(2026, 1, 5, 7, 30, tzinfo=UTC), datetime(2026, 1, 7, 7, 30, tzinfo=UTC)]

    entries = schedule_preview_instants(schedule=_daily_new_york(), instants=instants)

    assert [(e.at_utc, e.abbreviation) for e in entries] == [(t, "EST") for t in instants]


def test_no_instant_no_entry():
    assert schedule_preview_instants(schedule=_daily_new_york(), instants=[]) == []

"""Fixed-rate rules (docs/timerules.md "Fixed-rate schedules"): instants anchor + k * period,
by elapsed time in UTC, never moved by DST; checked against the audit's own arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.occurrences.audit.reconcile import expected_interval_instants
from apps.schedules import timerules as tr

# (zone, an instant a few hours before one of its 2026 DST changes)
TRANSITIONS = [
    ("America/New_York", datetime(2026, 3, 8, 3, 0, tzinfo=UTC)),  # spring forward 07:00Z
    ("America/New_York", datetime(2026, 11, 1, 2, 0, tzinfo=UTC)),  # fall back 06:00Z
    ("Europe/Berlin", datetime(2026, 3, 28, 22, 0, tzinfo=UTC)),  # 01:00Z
    ("Europe/Berlin", datetime(2026, 10, 24, 22, 0, tzinfo=UTC)),  # 01:00Z
    ("Australia/Lord_Howe", datetime(2026, 10, 3, 10, 0, tzinfo=UTC)),  # 30-minute shift
    ("Australia/Lord_Howe", datetime(2026, 4, 4, 10, 0, tzinfo=UTC)),
    ("America/Santiago", datetime(2026, 9, 5, 22, 0, tzinfo=UTC)),  # at local midnight
    ("Pacific/Chatham", datetime(2026, 4, 4, 10, 0, tzinfo=UTC)),  # 45-minute zone
]
PERIODS = [60, 900, 5400, 3600 * 36, 86400, 7 * 86400, 4321]


@pytest.mark.parametrize(("zone", "before"), TRANSITIONS)
@pytest.mark.parametrize("period", PERIODS)
def test_instants_across_a_dst_change_are_exactly_the_period_apart_in_utc(zone, before, period):
    anchor = before - timedelta(days=3, seconds=17)
    count = 400  # reaches past the change (within 7 hours) even at one run a minute
    times = tr.interval_fire_times(period, anchor, before, count)
    entries = tr.interval_preview(times, period, zone)

    assert [e.at_utc for e in entries] == times
    assert all(b - a == timedelta(seconds=period) for a, b in zip(times, times[1:], strict=False))
    assert all((t - anchor) % timedelta(seconds=period) == timedelta(0) for t in times)
    assert times[0] > before >= times[0] - timedelta(seconds=period)
    # The zone's offset changes inside the window of the shorter periods; the preview says so
    # on the first run after it, and the runs stay the period apart.
    offsets = [e.utc_offset for e in entries]
    changes = [i for i in range(1, len(offsets)) if offsets[i] != offsets[i - 1]]
    assert [i for i, e in enumerate(entries) if e.notes] == changes
    if period <= 5400:
        assert changes, "the window crosses the DST change"
    # The audit's independent arithmetic agrees.
    end = times[-1] + timedelta(microseconds=1)
    assert list(expected_interval_instants(period, anchor, times[0], end)) == times


def test_new_york_every_90_minutes_through_spring_forward_pinned():
    anchor = datetime(2026, 3, 7, 9, 0, tzinfo=UTC)
    times = tr.interval_fire_times(5400, anchor, anchor.replace(day=8, hour=5), 3)
    entries = tr.interval_preview(times, 5400, "America/New_York")

    assert [(e.at_utc.isoformat(), e.local_wall) for e in entries] == [
        ("2026-03-08T06:00:00+00:00", "2026-03-08 01:00"),  # EST
        ("2026-03-08T07:30:00+00:00", "2026-03-08 03:30"),  # EDT: 150 wall minutes later
        ("2026-03-08T09:00:00+00:00", "2026-03-08 05:00"),
    ]
    assert entries[1].note is not None and "-05:00 to -04:00" in entries[1].note


def test_every_24_hours_is_not_daily_at_a_local_time():
    # The product contract: "every 24 h" counts elapsed time; "daily at 09:00" is cron.
    anchor = datetime(2026, 3, 7, 14, 0, tzinfo=UTC)  # 09:00 EST
    times = tr.interval_fire_times(86400, anchor, anchor, 2)
    cron = tr.next_fire_times("0 9 * * *", "America/New_York", anchor, 2)

    assert times == [
        datetime(2026, 3, 8, 14, 0, tzinfo=UTC),
        datetime(2026, 3, 9, 14, 0, tzinfo=UTC),
    ]
    assert cron == [
        datetime(2026, 3, 8, 13, 0, tzinfo=UTC),
        datetime(2026, 3, 9, 13, 0, tzinfo=UTC),
    ]


def test_the_anchor_is_the_first_run_and_end_at_is_exclusive():
    anchor = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    before = anchor - timedelta(days=1)

    assert tr.interval_fire_times(3600, anchor, before, 2) == [anchor, anchor + timedelta(hours=1)]
    assert tr.interval_fire_times(3600, anchor, anchor, 1) == [anchor + timedelta(hours=1)]
    end = anchor + timedelta(hours=2)
    assert tr.interval_fire_times(3600, anchor, before, 10, end_at=end) == [
        anchor,
        anchor + timedelta(hours=1),
    ]
    # (after, until]: the materializer's window includes its upper end.
    assert tr.interval_fire_times_between(3600, anchor, anchor, end) == [
        anchor + timedelta(hours=1),
        end,
    ]
    assert tr.interval_fire_times_between(3600, anchor, anchor, end, limit=1) == [
        anchor + timedelta(hours=1)
    ]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (59, "at most once a minute"),
        (0, "at most once a minute"),
        (-60, "at most once a minute"),
        (366 * 86400 + 1, "366 days"),
        (True, "whole number"),
        (90.0, "whole number"),
        ("5400", "whole number"),
        (None, "whole number"),
    ],
)
def test_a_bad_period_is_refused_on_interval_s(value, fragment):
    with pytest.raises(tr.TimeRuleError) as err:
        tr.validate_interval(value)
    assert err.value.field == "interval_s"
    assert fragment in err.value.message


def test_bounds_of_the_period_are_accepted():
    assert tr.validate_interval(tr.MIN_INTERVAL_S) == 60
    assert tr.validate_interval(tr.MAX_INTERVAL_S) == 366 * 86400


@pytest.mark.parametrize(
    ("period", "words"),
    [
        (60, "every minute"),
        (5400, "every 90 minutes"),
        (129600, "every 36 hours"),
        (86400, "every day"),
        (172800, "every 2 days"),
        (3661, "every 3,661 seconds"),
    ],
)
def test_the_period_in_words(period, words):
    assert tr.interval_words(period) == words


def test_the_rule_in_words_names_its_anchor_in_utc():
    anchor = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
    assert tr.interval_rule_words(5400, anchor) == "every 90 minutes from 2026-12-04 10:00 UTC"
    odd = anchor.replace(second=30)
    assert tr.interval_rule_words(5400, odd) == "every 90 minutes from 2026-12-04 10:00:30 UTC"


def test_naive_instants_are_refused():
    with pytest.raises(tr.TimeRuleError) as err:
        tr.interval_fire_times(60, datetime(2026, 1, 1), datetime(2026, 1, 1, tzinfo=UTC), 1)  # noqa: DTZ001
    assert err.value.field == "start_at"


def test_instants_stop_before_the_end_of_the_datetime_range():
    anchor = datetime(9998, 6, 1, tzinfo=UTC)
    times = tr.interval_fire_times(tr.MAX_INTERVAL_S, anchor, anchor, 10)

    assert times == [anchor + timedelta(days=366)]  # the next would pass year 9999

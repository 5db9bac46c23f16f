"""DST changes ahead (`timerules.dst_changes`) and rules in words (`rule_words`), pinned to
real transitions: New York springs forward on 2027-03-14 and falls back on 2027-11-07."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from apps.schedules import timerules
from apps.schedules.rule_words import cron_in_words, one_shot_in_words

AFTER = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
NY = "America/New_York"


def _texts(expression: str, zone: str = NY, **options: object) -> list[tuple[str, str]]:
    changes = timerules.dst_changes(expression, zone, AFTER, **options)  # type: ignore[arg-type]
    return [(c.on.isoformat(), c.text) for c in changes]


def test_a_skipped_time_is_reported_once_for_the_spring_forward_day():
    assert _texts("30 2 * * *") == [(
        "2027-03-14",
        "02:30 does not exist on 2027-03-14 in America/New_York (clocks jump from 02:00 to "
        "03:00) — skipped",
    )]  # fmt: skip


def test_any_instant_of_now_finds_the_change():
    # `now` is never minute-aligned: a clock read at 09:08:55.123456 must find it too.
    odd = datetime(2026, 12, 3, 9, 8, 55, 123456, tzinfo=UTC)
    [change] = timerules.dst_changes("30 2 * * *", NY, odd)
    assert change.on.isoformat() == "2027-03-14" and change.text.endswith("— skipped")


def test_the_shift_policy_is_worded_as_a_moved_run():
    [(on, text)] = _texts("30 2 * * *", dst_gap="shift")
    assert on == "2027-03-14"
    assert text.endswith("— runs once at 03:00 local (07:00 UTC) instead")


def test_a_repeated_time_says_once_or_twice_per_the_fold_policy():
    [(on, first)] = _texts("30 1 * * *")
    [(_, both)] = _texts("30 1 * * *", dst_fold="both")
    assert on == "2027-11-07"
    assert first.startswith("01:30 occurs twice on 2027-11-07") and "runs once" in first
    assert "first of two runs" in both


def test_a_rule_away_from_the_changes_meets_none_and_an_end_before_them_hides_them():
    assert _texts("0 9 * * *") == []
    assert _texts("30 2 * * *", end_at=datetime(2027, 3, 1, tzinfo=UTC)) == []
    assert _texts("30 2 * * *", zone="UTC") == []


def test_a_rule_every_minute_is_summarised_per_change_not_listed_per_minute():
    changes = _texts("* * * * *", zone="Europe/Berlin")
    assert [on for on, _ in changes] == ["2027-03-28", "2027-10-31"]
    assert "(60 times) do not exist on 2027-03-28" in changes[0][1]
    assert "(60 times) occur twice on 2027-10-31" in changes[1][1]


def test_the_warning_looks_a_year_ahead_whatever_the_preview_count():
    # The next ten fires of a daily rule end in December; the change is in March.
    preview = timerules.preview("30 2 * * *", NY, AFTER, 10)
    assert not any(e.note for e in preview)
    assert len(_texts("30 2 * * *")) == 1


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("0 9 * * 1-5", "At 09:00, Monday through Friday"),
        ("@daily", "At 00:00"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("0 0 * * 7", "At 00:00, only on Sunday"),
        # all seven days under the OR rule: every day, not "Sunday through Sunday"
        ("0 0 13 * 0-7", "At 00:00"),
        ("0 0 13 * fri", "At 00:00, on day 13 of the month, or on Friday"),
        # Tick's a/n runs to the field's maximum, 7 (Sunday): Saturday and Sunday
        ("0 0 * * 6/1", "At 00:00, only on Saturday and Sunday"),
        ("0 0 * * 5/3", "At 00:00, only on Friday"),  # not "every 3 weeks"
        ("0 0 * * 5-7", "At 00:00, Friday through Sunday"),
        ("*/60 * * * *", "Every hour"),  # minute 0 only, not "every 60 minutes"
        ("5/10 * * * *", "Every 10 minutes, starting at 5 minutes past the hour"),
    ],
)
def test_cron_in_words_describes_tick_s_dialect(expression, words):
    assert cron_in_words(expression) == words


def test_cron_in_words_refuses_what_tick_refuses():
    with pytest.raises(timerules.TimeRuleError) as err:
        cron_in_words("0 0 30 2 *")
    assert "never fires" in err.value.message


def test_a_one_shot_says_once_at_its_local_time():
    at = datetime(2026, 12, 24, 14, 0, tzinfo=UTC)
    assert one_shot_in_words(at, NY) == "Once at 2026-12-24 09:00 EST (America/New_York)"
    assert one_shot_in_words(at, "UTC") == "Once at 2026-12-24 14:00 UTC"

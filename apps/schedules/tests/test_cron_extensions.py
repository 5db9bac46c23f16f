"""The day forms other schedulers use (L, L-n, nW, LW, dL, d#n, ?) and the ranges Tick now
reads as they do (MON-SUN, FRI-MON, NOV-MAR): docs/timerules.md "Last, nearest and nth days".
Checked against the documented examples of Quartz and Amazon EventBridge, and against the
independent matcher (apps/occurrences/audit/cron_matcher.py) across DST transitions."""

from __future__ import annotations

import calendar
import functools
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.occurrences.audit import cron_matcher
from apps.schedules import timerules as tr
from apps.schedules.rule_words import cron_in_words

JAN_2026 = datetime(2026, 1, 1, tzinfo=UTC)
WEEKDAY_NAMES = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]


def dates(expression: str, count: int, after: datetime = JAN_2026, zone: str = "UTC") -> list[str]:
    """The local dates of the next `count` fires, as "MM-DD" (a year other than 2026 in full)."""
    tz = tr.get_zone(zone)
    out = []
    for instant in tr.next_fire_times(expression, zone, after, count):
        local = instant.astimezone(tz)
        out.append(f"{local:%m-%d}" if local.year == 2026 else f"{local:%Y-%m-%d}")
    return out


def fire_in(expression: str, year: int, month: int) -> list[int]:
    """The days of one month (UTC) on which the rule fires."""
    start = datetime(year, month, 1, tzinfo=UTC)
    end = (start + timedelta(days=32)).replace(day=1)
    found = tr.next_fire_times(expression, "UTC", start - timedelta(seconds=1), 40, end_at=end)
    return sorted({t.day for t in found})


# ---------------------------------------------------------------------------------------------
# Quartz's documented examples. Source: Quartz Scheduler 2.3.0, "CronTrigger Tutorial"
# (quartz-scheduler.org/documentation/quartz-2.3.0/tutorials/crontrigger.html), sections
# "Special characters" and "Example Cron Expressions". Quartz has a seconds field and numbers
# the days of the week 1-7 from Sunday; Tick has no seconds and numbers them 0-7 from Sunday
# (docs/timerules.md), so "6L" (Quartz: last Friday) is "5L" or "FRIL" in Tick.
# ---------------------------------------------------------------------------------------------

QUARTZ_EXAMPLES = [
    # "0 15 10 L * ?": 10:15 on the last day of every month.
    ("15 10 L * ?", ["01-31", "02-28", "03-31", "04-30"]),
    # "0 15 10 L-2 * ?": 10:15 two days before the last day (Quartz counts back from it).
    ("15 10 L-2 * ?", ["01-29", "02-26", "03-29", "04-28"]),
    # "0 15 10 ? * 6L": 10:15 on the last Friday of every month.
    ("15 10 ? * 5L", ["01-30", "02-27", "03-27", "04-24"]),
    ("15 10 ? * FRIL", ["01-30", "02-27", "03-27", "04-24"]),
    # "0 15 10 ? * 6#3": 10:15 on the third Friday of every month.
    ("15 10 ? * 5#3", ["01-16", "02-20", "03-20", "04-17"]),
    ("15 10 ? * FRI#3", ["01-16", "02-20", "03-20", "04-17"]),
    # "2#1": the first Monday of the month.
    ("0 0 ? * MON#1", ["01-05", "02-02", "03-02", "04-06"]),
    # "4#5": the fifth Wednesday; "if there is not 5 of the given day-of-week in the month,
    # then no firing will occur that month".
    ("0 0 ? * WED#5", ["04-29", "07-29", "09-30", "12-30"]),
    # "0 0 12 1/5 * ?": 12:00 every 5 days, starting on the first day of the month.
    ("0 12 1/5 * ?", ["01-01", "01-06", "01-11", "01-16", "01-21", "01-26", "01-31", "02-01"]),
    # "0 15 10 ? * MON-FRI": 10:15 every Monday to Friday.
    ("15 10 ? * MON-FRI", ["01-01", "01-02", "01-05", "01-06"]),
]


@pytest.mark.parametrize(("expression", "expected"), QUARTZ_EXAMPLES)
def test_quartz_documented_examples(expression: str, expected: list[str]) -> None:
    assert dates(expression, len(expected)) == expected


def test_quartz_nearest_weekday_examples() -> None:
    # Quartz: "15W": "if the 15th is a Saturday, the trigger will fire on Friday the 14th. If
    # the 15th is a Sunday, the trigger will fire on Monday the 16th. If the 15th is a Tuesday,
    # then it will fire on Tuesday the 15th." (2026: August 15 is a Saturday, February 15 a
    # Sunday, September 15 a Tuesday.)
    assert fire_in("0 9 15W * *", 2026, 8) == [14]
    assert fire_in("0 9 15W * *", 2026, 2) == [16]
    assert fire_in("0 9 15W * *", 2026, 9) == [15]
    # "if you specify '1W' ... and the 1st is a Saturday, the trigger will fire on Monday the
    # 3rd, as it will not 'jump' over the boundary of a month's days" (2026-08-01 is a Saturday).
    assert fire_in("0 9 1W * *", 2026, 8) == [3]
    # The same at the month's end: the 31st on a Sunday goes back to Friday the 29th
    # (2026-05-31), not on to June.
    assert fire_in("0 9 31W * *", 2026, 5) == [29]
    # A month without day n has no weekday nearest it (no fire in April for 31W).
    assert fire_in("0 9 31W * *", 2026, 4) == []
    # "LW": "the last weekday of the month" (2026-01-31 is a Saturday, 2026-05-31 a Sunday,
    # 2026-03-31 a Tuesday).
    assert fire_in("0 18 LW * *", 2026, 1) == [30]
    assert fire_in("0 18 LW * *", 2026, 5) == [29]
    assert fire_in("0 18 LW * *", 2026, 3) == [31]


# ---------------------------------------------------------------------------------------------
# Amazon EventBridge's documented examples. Sources: "Cron expressions" in the Amazon
# EventBridge User Guide (docs.aws.amazon.com/eventbridge/latest/userguide/
# eb-scheduled-rule-pattern.html, "Wildcards" and "Examples") and the EventBridge Scheduler
# guide (docs.aws.amazon.com/scheduler/latest/UserGuide/schedule-types.html). EventBridge
# has a year field and numbers the days 1-7 from Sunday; the year field is dropped here.
# ---------------------------------------------------------------------------------------------

EVENTBRIDGE_EXAMPLES = [
    # "0 18 ? * MON-FRI *": 18:00 Monday to Friday.
    ("0 18 ? * MON-FRI", "2026-01-02 18:00", ["01-01", "01-02", "01-05"]),
    # "0 8 1 * ? *": 08:00 on the first day of every month.
    ("0 8 1 * ?", "", ["01-01", "02-01", "03-01"]),
    # "3W": "the weekday closest to the third day of the month" (2026-01-03 is a Saturday,
    # 2026-05-03 a Sunday).
    ("0 0 3W * ?", "", ["01-02", "02-03", "03-03", "04-03", "05-04"]),
    # "3#2": "the second Tuesday of the month" (3 is Tuesday in EventBridge, 2 in Tick).
    ("0 0 ? * 2#2", "", ["01-13", "02-10", "03-10"]),
    ("0 0 ? * TUE#2", "", ["01-13", "02-10", "03-10"]),
    # "L" in the day-of-month field: "the last day of the month".
    ("0 0 L * ?", "", ["01-31", "02-28", "03-31"]),
]


@pytest.mark.parametrize(("expression", "_", "expected"), EVENTBRIDGE_EXAMPLES)
def test_eventbridge_documented_examples(expression: str, _: str, expected: list[str]) -> None:
    assert dates(expression, len(expected)) == expected


def test_eventbridge_every_ten_minutes_on_weekdays() -> None:
    # "0/10 * ? * MON-FRI *": every 10 minutes, Monday to Friday.
    got = tr.next_fire_times(
        "0/10 * ? * MON-FRI", "UTC", datetime(2026, 1, 2, 23, 45, tzinfo=UTC), 3
    )
    assert got == [
        datetime(2026, 1, 2, 23, 50, tzinfo=UTC),
        datetime(2026, 1, 5, 0, 0, tzinfo=UTC),  # Saturday and Sunday skipped
        datetime(2026, 1, 5, 0, 10, tzinfo=UTC),
    ]


# ---------------------------------------------------------------------------------------------
# How the forms combine with the other day field (Tick's classic OR rule)
# ---------------------------------------------------------------------------------------------


def test_forms_follow_the_or_rule_and_question_mark_is_star() -> None:
    # One day field restricted: it alone decides ("?" is "*").
    assert dates("0 0 L * ?", 2) == dates("0 0 L * *", 2) == ["01-31", "02-28"]
    assert dates("0 0 ? * FRI#3", 2) == dates("0 0 * * FRI#3", 2) == ["01-16", "02-20"]
    assert dates("0 0 ? * ?", 2) == ["01-02", "01-03"]
    # Both restricted: either matches - the last day of the month, and every Friday.
    assert dates("0 0 L * FRI", 6) == ["01-02", "01-09", "01-16", "01-23", "01-30", "01-31"]
    # ... and the 1st, and the third Friday.
    assert dates("0 0 1 * FRI#3", 4) == ["01-16", "02-01", "02-20", "03-01"]
    # Lists mix plain days and forms: the first and the last day of each month.
    assert dates("0 0 1,L * *", 4) == ["01-31", "02-01", "02-28", "03-01"]
    # The month field still restricts: the last Friday of each quarter's last month.
    assert dates("0 0 * 3,6,9,12 5L", 4) == ["03-27", "06-26", "09-25", "12-25"]


def test_a_missing_fifth_weekday_is_no_fire_and_a_rule_too_rare_is_refused() -> None:
    # January 2026 has five Thursdays and Fridays and Saturdays, only four Wednesdays.
    assert fire_in("0 0 * * WED#5", 2026, 1) == []
    assert fire_in("0 0 * * THU#5", 2026, 1) == [29]
    # February has a fifth Monday only in a leap year starting on a Monday (2016, 2044): a
    # rule that can go decades without a run is refused, like one that never runs.
    with pytest.raises(tr.TimeRuleError) as err:
        tr.validate_expression("0 0 * 2 MON#5")
    assert err.value.field == "expression" and "too rarely" in err.value.message
    with pytest.raises(tr.TimeRuleError) as err:
        tr.validate_expression("0 0 30W 2 *")
    assert "never fires" in err.value.message


def test_every_fifth_weekday_of_one_month_is_found_within_the_horizon() -> None:
    """The rarest rules with forms: a fifth weekday in one month. February's (a leap year
    whose 1st is that weekday, 28+ years apart) are refused; the others run at most 6 years
    apart, and the search finds each next run from the previous one."""
    for month in range(1, 13):
        for weekday in range(7):
            expression = f"0 0 * {month} {weekday}#5"
            if month == 2:
                with pytest.raises(tr.TimeRuleError):
                    tr.validate_expression(expression)
                continue
            fires = tr.next_fire_times(expression, "UTC", datetime(2000, 1, 1, tzinfo=UTC), 60)
            years = [f.year for f in fires]
            assert (
                len(fires) == 60 and max(b - a for a, b in zip(years, years[1:], strict=False)) <= 6
            )
            assert all(
                tr.next_fire_time(expression, "UTC", a) == b
                for a, b in zip(fires, fires[1:], strict=False)
            )
            assert all(f.day > 28 and (f.weekday() + 1) % 7 == weekday for f in fires)


# ---------------------------------------------------------------------------------------------
# Ranges: Sunday at the end, wrap-around in day-of-week and month, and 'a/n'
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "weekdays"),
    [
        ("0 0 * * MON-SUN", {0, 1, 2, 3, 4, 5, 6}),
        ("0 0 * * 1-0", {0, 1, 2, 3, 4, 5, 6}),
        ("0 0 * * 1-7", {0, 1, 2, 3, 4, 5, 6}),
        ("0 0 * * SAT-SUN", {6, 0}),
        ("0 0 * * SUN-SUN", {0}),
        ("0 0 * * FRI-MON", {5, 6, 0, 1}),
        ("0 0 * * FRI-MON/2", {5, 0}),
        ("0 0 * * 7-1", {0, 1}),
        ("0 0 * * SAT-TUE/3", {6, 2}),
        # 'a/n' runs to 7 (Sunday): Tick's reading, as cronsim's; croniter runs it to 6 and
        # reads 7/2 as Sunday, Tuesday, Thursday, Saturday and 6/1 as Saturday alone.
        ("0 0 * * 7/2", {0}),
        ("0 0 * * 6/1", {6, 0}),
        ("0 0 * * 1/2", {1, 3, 5, 0}),
    ],
)
def test_day_of_week_ranges(expression: str, weekdays: set[int]) -> None:
    fired = {(date.fromisoformat(f"2026-{d}").weekday() + 1) % 7 for d in dates(expression, 21)}
    assert fired == weekdays


def test_month_ranges_wrap() -> None:
    assert dates("0 0 1 NOV-MAR *", 5) == ["02-01", "03-01", "11-01", "12-01", "2027-01-01"]
    assert dates("0 0 1 NOV-MAR/2 *", 4) == ["03-01", "11-01", "2027-01-01", "2027-03-01"]
    assert dates("0 0 1 12-1 *", 3) == ["12-01", "2027-01-01", "2027-12-01"]


def test_other_backwards_ranges_are_refused_with_what_tick_accepts() -> None:
    with pytest.raises(tr.TimeRuleError) as err:
        tr.validate_expression("0 22-2 * * *")
    assert "'22-23,0-2'" in err.value.message
    assert "Only day-of-week and month ranges wrap around" in err.value.message


# ---------------------------------------------------------------------------------------------
# Malformed forms: one clear message naming the field
# ---------------------------------------------------------------------------------------------

MALFORMED = [
    ("L * * * *", "'L' is not valid in the minute field"),
    ("0 L * * *", "'L' is not valid in the hour field"),
    ("0 0 * L *", "'L' is not valid in the month field"),
    ("0 9 * * MON#6", "the n of d#n must be 1-5"),
    ("0 9 * * MON#0", "the n of d#n must be 1-5"),
    ("0 9 * * 8#2", "out of range"),
    ("0 9 * * #2", "'#2' is not valid in the day-of-week field"),
    ("0 9 32W * *", "the day of nW must be 1-31"),
    ("0 9 0W * *", "the day of nW must be 1-31"),
    ("0 9 W * *", "'W' is not valid in the day-of-month field"),
    ("0 9 L-31 * *", "L-n counts n = 1-30"),
    ("0 9 L-0 * *", "L-n counts n = 1-30"),
    ("0 9 L/2 * *", "'L/2' is not valid in the day-of-month field"),
    ("0 9 5L * *", "'5L' is not valid in the day-of-month field"),
    ("0 9 * * 15W", "'15W' is not valid in the day-of-week field"),
    ("0 9 * * L", "'L' alone in the day-of-week field is refused"),
    ("0 9 * * FRI#3-5", "not valid in the day-of-week field"),
    ("0 9 1,? * *", "'?' is not valid in the day-of-month field"),
    ("? 9 * * *", "'?' (no specific value) is allowed only in the day-of-month"),
    ("0 9 * ? *", "not in the month field"),
]


@pytest.mark.parametrize(("expression", "fragment"), MALFORMED)
def test_malformed_forms_are_refused_naming_the_field(expression: str, fragment: str) -> None:
    with pytest.raises(tr.TimeRuleError) as err:
        tr.validate(expression, "UTC")
    assert err.value.field == "expression"
    assert fragment in err.value.message, err.value.message


# ---------------------------------------------------------------------------------------------
# Words, preview notes and DST warnings for the new forms
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("0 0 L * *", "At 00:00, on the last day of the month"),
        ("0 0 L-2 * ?", "At 00:00, 2 days before the last day of the month"),
        ("0 9 15W * *", "At 09:00, on the weekday nearest day 15 of the month"),
        ("0 18 LW * *", "At 18:00, on the last weekday of the month"),
        ("0 9 * * 5L", "At 09:00, on the last Friday of the month"),
        ("0 9 ? * MON#2", "At 09:00, on the second Monday of the month"),
        ("0 0 * * MON-SUN", "At 00:00"),
        # Lists with forms and the OR rule, which the library misreads, in Tick's own words.
        ("0 0 1,L * *", "At 00:00, on day 1 and the last day of the month"),
        ("0 0 L-1 * *", "At 00:00, on the day before the last day of the month"),
        ("0 9 * * MON#1,FRI#3", "At 09:00, on the first Monday and the third Friday of the month"),
        ("0 0 1W,15W * *",
         "At 00:00, on the weekday nearest day 1 and the weekday nearest day 15 of the month"),
        ("0 0 L * 1-5", "At 00:00, on the last day of the month, or on Monday through Friday"),
        ("0 0 1,L 3 SUN#1",
         "At 00:00, only in March, on day 1 and the last day of the month, or on the first "
         "Sunday of the month"),
        ("0 0 * * FRI-MON", "At 00:00, only on Monday and Friday through Sunday"),
        ("0 0 1 NOV-MAR/2 *",
         "At 00:00, on day 1 of the month, only in January, March, and November"),
    ],
)  # fmt: skip
def test_rule_in_words(expression: str, words: str) -> None:
    assert cron_in_words(expression) == words


def test_words_of_every_day_field_pairing_leave_no_raw_form() -> None:
    doms = ["*", "?", "L", "L-1", "L-3", "15W", "LW", "1,L", "1-5,L", "*/2", "1-10/3", "13"]
    dows = ["*", "?", "5L", "MON#2", "1-5", "FRI-MON", "MON#1,FRI#3", "1-5,5L", "SUN#5"]
    for dom in doms:
        for dow in dows:
            expression = f"0 9 {dom} * {dow}"
            words = cron_in_words(expression)
            assert words.startswith("At 09:00"), (expression, words)
            assert "#" not in words and " L" not in words and "  " not in words, words
            has_form = any(c in dom + dow for c in "LW#")
            if has_form and dom not in ("*", "?") and dow not in ("*", "?"):
                assert ", or " in words, (expression, words)  # the OR rule, said


def test_preview_and_dst_warning_of_a_last_sunday_rule() -> None:
    # Europe/London springs forward on the last Sunday of March at 01:00 local: a rule for
    # 01:30 on the last Sunday of every month meets the gap every March.
    rule, zone = "30 1 * * SUNL", "Europe/London"
    entries = tr.preview(rule, zone, datetime(2026, 2, 1, tzinfo=UTC), 2)
    assert [e.local_wall for e in entries] == ["2026-02-22 01:30", "2026-04-26 01:30"]
    assert entries[1].note is not None and "01:30 does not exist on 2026-03-29" in entries[1].note
    shifted = tr.preview(rule, zone, datetime(2026, 2, 1, tzinfo=UTC), 2, dst_gap="shift")
    assert shifted[1].at_utc == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    changes = tr.dst_changes(rule, zone, datetime(2026, 2, 1, tzinfo=UTC))
    assert [(c.on.isoformat(), c.text.split(" — ")[1]) for c in changes] == [
        ("2026-03-29", "skipped"),
        ("2026-10-25", "runs once, at 00:30 UTC; not again at 01:30 UTC"),
    ]


# ---------------------------------------------------------------------------------------------
# Property test against the independent matcher, around real DST transitions
# ---------------------------------------------------------------------------------------------

# Both hemispheres, a 30-minute shift (Lord Howe), a midnight switch (Santiago), a 45-minute
# offset (Chatham), and Casablanca's Ramadan changes.
ZONES = [
    "America/New_York",
    "Europe/London",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "America/Santiago",
    "Pacific/Chatham",
    "Africa/Casablanca",
]
OPTIONS = [(g, f) for g in ("skip", "shift") for f in ("first", "both")]


@functools.cache
def transitions(zone: str, year: int) -> tuple[datetime, ...]:
    """UTC instants (to the minute) at which the zone's offset changes during `year`."""
    tz = cron_matcher.load_zone(zone)
    at, end = datetime(year, 1, 1, tzinfo=UTC), datetime(year + 1, 1, 1, tzinfo=UTC)
    found: list[datetime] = []
    offset = at.astimezone(tz).utcoffset()
    while at < end:
        later = at + timedelta(hours=1)
        if later.astimezone(tz).utcoffset() != offset:
            probe = at
            while probe.astimezone(tz).utcoffset() == offset:
                probe += timedelta(minutes=1)
            found.append(probe)
            offset = later.astimezone(tz).utcoffset()
        at = later
    return tuple(found)


def _forms_for(day: date) -> tuple[list[str], list[str]]:
    """Day-of-month and day-of-week items that select `day`, or a neighbour of it."""
    ndays = calendar.monthrange(day.year, day.month)[1]
    weekday = (day.weekday() + 1) % 7
    nth = (day.day + 6) // 7
    dom = ["L", "LW", f"{day.day}W", f"{max(1, day.day - 1)}W", f"{min(31, day.day + 1)}W"]
    if ndays - day.day:
        dom.append(f"L-{ndays - day.day}")
    name = WEEKDAY_NAMES[weekday]
    dow = [f"{weekday}L", f"{name}L", f"{name}#{nth}", f"{weekday}#{nth}", f"{weekday}#5"]
    dow += [f"{WEEKDAY_NAMES[(weekday + 1) % 7]}#{nth}", f"{name}-{WEEKDAY_NAMES[weekday - 2]}"]
    return dom, dow


@st.composite
def _case(draw: st.DrawFn) -> tuple[str, str, datetime]:
    zone = draw(st.sampled_from(ZONES))
    moments: tuple[datetime, ...] = ()
    while not moments:
        year = draw(st.integers(2019, 2032))
        moments = transitions(zone, year)
    moment = draw(st.sampled_from(moments))
    tz = cron_matcher.load_zone(zone)
    walls = [(moment + timedelta(minutes=d)).astimezone(tz) for d in (-61, -1, 0, 30, 60)]
    hours = sorted({w.hour for w in walls})
    minutes = sorted({0, 30, *(w.minute for w in walls)})
    dom_forms, dow_forms = _forms_for(walls[2].date())
    hour = draw(st.sampled_from(["*", *map(str, hours), ",".join(map(str, hours))]))
    minute = draw(st.sampled_from(["*/15", "*/30", *map(str, minutes)]))
    dom = draw(st.sampled_from(["*", "?", *dom_forms, f"1,{draw(st.sampled_from(dom_forms))}"]))
    dow = draw(st.sampled_from(["*", "?", *dow_forms]))
    if dom in ("*", "?") and dow in ("*", "?"):
        dow = draw(st.sampled_from(dow_forms))
    month = draw(st.sampled_from(["*", "*", str(walls[2].month), "NOV-MAR", "MAR-NOV/2"]))
    after = moment - timedelta(minutes=draw(st.integers(0, 2880)))
    return f"{minute} {hour} {dom} {month} {dow}", zone, after


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(_case())
def test_forms_match_the_independent_matcher_across_dst(case: tuple[str, str, datetime]) -> None:
    expression, zone, after = case
    try:
        tr.validate(expression, zone)
    except tr.TimeRuleError:
        return  # too rare (a fifth weekday in a short month only): refused, tested above
    until = after + timedelta(days=3)
    for gap, fold in OPTIONS:
        expected = list(
            cron_matcher.fire_times(expression, zone, after, until, dst_gap=gap, dst_fold=fold)
        )
        got = tr.next_fire_times(
            expression, zone, after - timedelta(microseconds=1), 2000,
            dst_gap=gap, dst_fold=fold, end_at=until,
        )  # fmt: skip
        assert got == expected, (gap, fold)


@pytest.mark.parametrize("zone", ZONES)
def test_a_year_of_every_form_matches_the_independent_matcher(zone: str) -> None:
    """Whole years (every month length and weekday of the 1st), each form at 02:30, which
    the zone's transitions skip or repeat in several of them."""
    start, end = datetime(2027, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC)
    for expression in [
        "30 2 L * *",
        "30 2 L-3 * ?",
        "30 2 15W * *",
        "30 2 1W,31W * *",
        "30 2 LW * *",
        "30 2 ? * SUNL",
        "30 2 * * 0#1,6#5",
        "30 2 L * SAT",
        "30 2 1 NOV-MAR FRI#2",
    ]:
        for gap, fold in OPTIONS:
            expected = cron_matcher.fire_times(
                expression, zone, start, end, dst_gap=gap, dst_fold=fold
            )
            got = tr.next_fire_times(
                expression, zone, start - timedelta(microseconds=1), 1000,
                dst_gap=gap, dst_fold=fold, end_at=end,
            )  # fmt: skip
            assert got == list(expected), (expression, gap, fold)


# ---------------------------------------------------------------------------------------------
# croniter as a third reader, in UTC, where its dialect and Tick's agree
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expression",
    [
        "0 0 L * *",
        "30 6 15W * *",
        "0 9 * * 5#3",
        "0 9 * * MON#1,FRI#5",
        "0 0 * * FRI-MON",
        "0 0 * * MON-SUN",
        "0 0 * * FRI-MON/2",
        "0 12 1 NOV-MAR/2 *",
    ],
)
def test_agrees_with_croniter_in_utc(expression: str) -> None:
    from croniter import croniter

    after = datetime(2026, 1, 1)
    it = croniter(expression, after)
    expected = [it.get_next(datetime).replace(tzinfo=UTC) for _ in range(40)]
    assert tr.next_fire_times(expression, "UTC", after.replace(tzinfo=UTC), 40) == expected


def test_day_of_week_steps_differ_from_croniter_as_documented() -> None:
    """docs/timerules.md: Tick runs 'a/n' in day-of-week to 7 (Sunday); croniter to 6."""
    from croniter import croniter

    def croniter_days(expression: str) -> set[str]:
        it = croniter(expression, datetime(2026, 1, 1))
        return {it.get_next(datetime).strftime("%a") for _ in range(14)}

    def tick_days(expression: str) -> set[str]:
        return {t.strftime("%a") for t in tr.next_fire_times(expression, "UTC", JAN_2026, 14)}

    assert tick_days("0 0 * * 7/2") == {"Sun"}
    assert croniter_days("0 0 * * 7/2") == {"Sun", "Tue", "Thu", "Sat"}
    assert tick_days("0 0 * * 6/1") == {"Sat", "Sun"}
    assert croniter_days("0 0 * * 6/1") == {"Sat"}

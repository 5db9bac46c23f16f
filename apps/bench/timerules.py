"""Benchmarks for ``apps.schedules.timerules`` (pure Python; wrapped by ``manage.py
bench_timerules``).

``bench_timerules()`` returns a dict of figures; ``format_results()`` turns it into lines for a
terminal.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from apps.schedules import timerules
from apps.schedules.models import Schedule

# (expression, time_zone, dst_gap, dst_fold, after): what NextFireCache's batch calls take.
_CacheItem = tuple[str, str, str, str, datetime]
_Result = TypeVar("_Result")

# Realistic rules and zones: most schedules use a handful of popular rules in popular zones.
_EXPRESSIONS = (
    "0 * * * *",
    "*/5 * * * *",
    "*/15 * * * *",
    "0 9 * * *",
    "30 2 * * *",
    "0 0 * * *",
    "0 9 * * 1-5",
    "0 0 1 * *",
    "15 */2 * * *",
    "0 8,12,18 * * *",
    "0 0 * * 0",
    "45 23 * * 5",
    "0 0 29 2 *",
)
# The day forms and wrapped ranges (docs/timerules.md "Last, nearest and nth days"), measured
# apart so that the figures of the plain mix above stay comparable from run to run.
_FORM_EXPRESSIONS = (
    "0 0 L * *",
    "0 18 LW * *",
    "0 9 15W * *",
    "0 0 L-2 * ?",
    "0 9 ? * FRI#3",
    "0 9 * * MON#2",
    "30 2 * * SUNL",
    "0 9 * * 5L",
    "0 0 1,L * *",
    "0 6 * NOV-MAR FRI-MON",
    "0 0 L * FRI",
    "*/15 * * * WED#5",
    "0 12 1W * ?",
)
_ZONES = (
    "UTC",
    "America/New_York",
    "Europe/London",
    "Europe/Berlin",
    "Asia/Kolkata",
    "Asia/Tokyo",
    "Australia/Sydney",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
)


def _rules(
    distinct_rules: int, rng: random.Random, expressions: tuple[str, ...] = _EXPRESSIONS
) -> list[tuple[str, str]]:
    pairs = [(e, z) for e in expressions for z in _ZONES]
    rng.shuffle(pairs)
    if distinct_rules > len(pairs):
        raise ValueError(f"distinct_rules must be at most {len(pairs)}")
    return pairs[:distinct_rules]


def _uncached_us_per_call(
    rules: list[tuple[str, str]], afters: list[datetime], calls: int, count: int
) -> float:
    """µs per ``next_fire_times(…, count)`` call, cycling through the rules and ``afters``."""
    started = time.perf_counter()
    for i in range(calls):
        expression, zone = rules[i % len(rules)]
        timerules.next_fire_times(expression, zone, afters[i % len(afters)], count)
    return (time.perf_counter() - started) / calls * 1e6


def _uncached_figures(
    rules: list[tuple[str, str]], base: datetime, calls: int, rng: random.Random
) -> tuple[float, float]:
    """µs per uncached call for ``count=1`` (``calls`` calls) and ``count=10`` (a fifth)."""
    afters = [base + timedelta(minutes=rng.randrange(0, 60 * 24 * 365)) for _ in range(997)]
    for expression, zone in rules:  # warm the compiled-rule and zone caches
        timerules.next_fire_times(expression, zone, base, 1)
    return (
        _uncached_us_per_call(rules, afters, calls, 1),
        _uncached_us_per_call(rules, afters, max(1, calls // 5), 10),
    )


def _cache_items(
    rules: list[tuple[str, str]],
    schedules: int,
    rng: random.Random,
    pick_after: Callable[[], datetime],
) -> list[_CacheItem]:
    """``schedules`` cache items, each a random rule with the ``after`` that ``pick_after`` gives.

    Item by item the rule is drawn first, then the ``after``: the same seed gives the same
    items, hence the same evaluation counts, from run to run.
    """
    items: list[_CacheItem] = []
    for _ in range(schedules):
        expression, zone = rules[rng.randrange(len(rules))]
        items.append((expression, zone, Schedule.DstGap.SKIP, Schedule.DstFold.FIRST, pick_after()))
    return items


def _on_cold_cache(
    run: Callable[[timerules.NextFireCache], _Result],
) -> tuple[float, int, _Result]:
    """Seconds ``run`` takes on a fresh cache, the rule evaluations it caused, its result."""
    cache = timerules.NextFireCache(maxsize=200_000)
    started = time.perf_counter()
    result = run(cache)
    return time.perf_counter() - started, cache.stats().evaluations, result


def _memoised_figures(
    rules: list[tuple[str, str]],
    base: datetime,
    schedules: int,
    distinct_afters: int,
    rng: random.Random,
) -> dict[str, object]:
    """The ``memoised_*`` figures: seconds and rule evaluations of three cold-cache batches."""
    # Memoised, same `after` for everybody (e.g. the materializer at the top of the hour).
    items_same = _cache_items(rules, schedules, rng, lambda: base)
    same_s, same_evaluations, nexts = _on_cold_cache(
        lambda cache: cache.next_after_many(items_same)
    )
    assert len(nexts) == schedules

    # Memoised, `after` spread over `distinct_afters` minute boundaries.
    spread = [base + timedelta(minutes=i) for i in range(distinct_afters)]
    items_spread = _cache_items(
        rules, schedules, rng, lambda: spread[rng.randrange(distinct_afters)]
    )
    spread_s, spread_evaluations, _ = _on_cold_cache(
        lambda cache: cache.next_after_many(items_spread)
    )

    # Memoised range path (materializer window of 10 minutes, at most 1000 per schedule).
    until = base + timedelta(minutes=10)
    window_s, window_evaluations, _ = _on_cold_cache(
        lambda cache: cache.fire_times_many(items_same, until, limit=1000)
    )

    return {
        "memoised_same_after_s": round(same_s, 3),
        "memoised_same_after_evaluations": same_evaluations,
        "memoised_spread_after_s": round(spread_s, 3),
        "memoised_spread_after_evaluations": spread_evaluations,
        "memoised_window_10min_s": round(window_s, 3),
        "memoised_window_10min_evaluations": window_evaluations,
    }


def bench_timerules(
    schedules: int = 500_000,
    distinct_rules: int = 50,
    *,
    distinct_afters: int = 60,
    uncached_calls: int = 2_000,
    seed: int = 1,
) -> dict[str, object]:
    """Measure the uncached and memoised paths.

    * ``uncached_us_per_call``: µs per ``next_fire_times(expr, zone, after, 1)`` call (compiled
      rules and zones are cached, fire times are not), over varied rules and ``after`` values;
      ``uncached_us_per_call_10`` for ``count=10``.
    * ``memoised_same_after_s``: seconds for ``NextFireCache.next_after_many`` over ``schedules``
      items sharing ``distinct_rules`` (expression, zone) pairs, all with the same ``after`` (the
      top of an hour), from a cold cache.
    * ``memoised_spread_after_s``: the same with ``after`` spread over ``distinct_afters``
      minute boundaries (so ``distinct_rules * distinct_afters`` evaluations).
    """
    rng = random.Random(seed)  # noqa: S311 (benchmark data, not security)
    rules = _rules(distinct_rules, rng)
    base = datetime(2026, 3, 8, 6, 0, tzinfo=UTC)  # NY spring-forward night: DST paths too

    uncached_us, uncached_us_10 = _uncached_figures(rules, base, uncached_calls, rng)
    forms = _form_figures(base, schedules, distinct_rules, uncached_calls, rng)
    intervals = _interval_figures(base, schedules, uncached_calls, rng)

    return {
        "schedules": schedules,
        "distinct_rules": distinct_rules,
        "distinct_afters": distinct_afters,
        "uncached_calls": uncached_calls,
        "uncached_us_per_call": round(uncached_us, 1),
        "uncached_us_per_call_10": round(uncached_us_10, 1),
        **_memoised_figures(rules, base, schedules, distinct_afters, rng),
        **forms,
        **intervals,
    }


# Fixed-rate periods (seconds) of the interval mix: a minute to a week.
_PERIODS = (60, 300, 900, 3600, 5400, 7200, 36 * 3600, 86400, 7 * 86400)


def _interval_figures(
    base: datetime, schedules: int, calls: int, rng: random.Random
) -> dict[str, object]:
    """Fixed-rate schedules (docs/timerules.md "Fixed-rate schedules"): the next fire of one
    uncached, and the materializer's 10-minute window for ``schedules`` of them, each with
    its own period and anchor (no memo: pure arithmetic), to set beside the memoised cron
    window above."""
    items = [
        (_PERIODS[rng.randrange(len(_PERIODS))], base - timedelta(seconds=rng.randrange(86400)))
        for _ in range(schedules)
    ]
    started = time.perf_counter()
    for period, anchor in items[:calls]:
        timerules.interval_fire_times(period, anchor, base, 1)
    uncached_us = (time.perf_counter() - started) / max(1, min(calls, len(items))) * 1e6
    until = base + timedelta(minutes=10)
    started = time.perf_counter()
    found = 0
    for period, anchor in items:
        found += len(timerules.interval_fire_times_between(period, anchor, base, until))
    return {
        "interval_us_per_call": round(uncached_us, 1),
        "interval_window_10min_s": round(time.perf_counter() - started, 3),
        "interval_window_10min_instants": found,
    }


def _form_figures(
    base: datetime, schedules: int, distinct_rules: int, calls: int, rng: random.Random
) -> dict[str, object]:
    """The day-form rules: validation from cold (their 400-year check), uncached next fires,
    and the memoised next fire of ``schedules`` schedules sharing ``distinct_rules`` of them."""
    started = time.perf_counter()
    for expression in _FORM_EXPRESSIONS:
        timerules._compile_cached.cache_clear()  # noqa: SLF001 (measure the cold compile)
        timerules.validate_expression(expression)
    validate_ms = (time.perf_counter() - started) / len(_FORM_EXPRESSIONS) * 1e3
    rules = _rules(distinct_rules, rng, _FORM_EXPRESSIONS)
    uncached_us, uncached_us_10 = _uncached_figures(rules, base, calls, rng)
    items = _cache_items(rules, schedules, rng, lambda: base)
    same_s, same_evaluations, _ = _on_cold_cache(lambda cache: cache.next_after_many(items))
    return {
        "forms_validate_ms": round(validate_ms, 2),
        "forms_uncached_us_per_call": round(uncached_us, 1),
        "forms_uncached_us_per_call_10": round(uncached_us_10, 1),
        "forms_memoised_same_after_s": round(same_s, 3),
        "forms_memoised_same_after_evaluations": same_evaluations,
    }


def format_results(results: dict[str, object]) -> list[str]:
    """Human-readable lines for ``manage.py bench_timerules``."""
    r = results
    return [
        f"timerules benchmark: {r['schedules']:,} schedules, {r['distinct_rules']} distinct "
        f"(expression, zone) pairs",
        f"  uncached next_fire_times(count=1):  {r['uncached_us_per_call']} µs/call "
        f"({r['uncached_calls']:,} calls)",
        f"  uncached next_fire_times(count=10): {r['uncached_us_per_call_10']} µs/call",
        f"  memoised next fire, same after:     {r['memoised_same_after_s']} s "
        f"({r['memoised_same_after_evaluations']} evaluations)",
        f"  memoised next fire, {r['distinct_afters']} afters:       "
        f"{r['memoised_spread_after_s']} s ({r['memoised_spread_after_evaluations']} evaluations)",
        f"  memoised 10-minute window, same after: {r['memoised_window_10min_s']} s "
        f"({r['memoised_window_10min_evaluations']} evaluations)",
        f"day forms (L, W, #, wrapped ranges), {len(_FORM_EXPRESSIONS)} rules:",
        f"  validate from cold (400-year check): {r['forms_validate_ms']} ms/rule",
        f"  uncached next_fire_times(count=1):  {r['forms_uncached_us_per_call']} µs/call",
        f"  uncached next_fire_times(count=10): {r['forms_uncached_us_per_call_10']} µs/call",
        f"  memoised next fire, same after:     {r['forms_memoised_same_after_s']} s "
        f"({r['forms_memoised_same_after_evaluations']} evaluations)",
        "fixed rates (interval), periods of a minute to a week, each its own anchor:",
        f"  next fire, no memo:                 {r['interval_us_per_call']} µs/call",
        f"  10-minute window, {r['schedules']:,} schedules: {r['interval_window_10min_s']} s "
        f"({r['interval_window_10min_instants']:,} instants)",
    ]

"""Benchmarks for ``apps.schedules.timerules`` (pure Python; wrapped by ``manage.py
bench_timerules``).

``bench_timerules()`` returns a dict of figures; ``format_results()`` turns it into lines for a
terminal.
"""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta

from apps.schedules import timerules

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


def _rules(distinct_rules: int, rng: random.Random) -> list[tuple[str, str]]:
    pairs = [(e, z) for e in _EXPRESSIONS for z in _ZONES]
    rng.shuffle(pairs)
    if distinct_rules > len(pairs):
        raise ValueError(f"distinct_rules must be at most {len(pairs)}")
    return pairs[:distinct_rules]


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

    # Uncached: one evaluation per call.
    afters = [base + timedelta(minutes=rng.randrange(0, 60 * 24 * 365)) for _ in range(997)]
    for expression, zone in rules:  # warm the compiled-rule and zone caches
        timerules.next_fire_times(expression, zone, base, 1)
    started = time.perf_counter()
    for i in range(uncached_calls):
        expression, zone = rules[i % len(rules)]
        timerules.next_fire_times(expression, zone, afters[i % len(afters)], 1)
    uncached_us = (time.perf_counter() - started) / uncached_calls * 1e6
    calls10 = max(1, uncached_calls // 5)
    started = time.perf_counter()
    for i in range(calls10):
        expression, zone = rules[i % len(rules)]
        timerules.next_fire_times(expression, zone, afters[i % len(afters)], 10)
    uncached_us_10 = (time.perf_counter() - started) / calls10 * 1e6

    # Memoised, same `after` for everybody (e.g. the materializer at the top of the hour).
    items_same = [
        (expression, zone, "skip", "first", base)
        for expression, zone in (rules[rng.randrange(len(rules))] for _ in range(schedules))
    ]
    cache = timerules.NextFireCache(maxsize=200_000)
    started = time.perf_counter()
    nexts = cache.next_after_many(items_same)
    same_s = time.perf_counter() - started
    same_stats = cache.stats()
    assert len(nexts) == schedules

    # Memoised, `after` spread over `distinct_afters` minute boundaries.
    spread = [base + timedelta(minutes=i) for i in range(distinct_afters)]
    items_spread = [
        (expression, zone, "skip", "first", spread[rng.randrange(distinct_afters)])
        for expression, zone in (rules[rng.randrange(len(rules))] for _ in range(schedules))
    ]
    cache = timerules.NextFireCache(maxsize=200_000)
    started = time.perf_counter()
    cache.next_after_many(items_spread)
    spread_s = time.perf_counter() - started
    spread_stats = cache.stats()

    # Memoised range path (materializer window of 10 minutes, at most 1000 per schedule).
    until = base + timedelta(minutes=10)
    cache = timerules.NextFireCache(maxsize=200_000)
    started = time.perf_counter()
    cache.fire_times_many(items_same, until, limit=1000)
    window_s = time.perf_counter() - started
    window_stats = cache.stats()

    return {
        "schedules": schedules,
        "distinct_rules": distinct_rules,
        "distinct_afters": distinct_afters,
        "uncached_calls": uncached_calls,
        "uncached_us_per_call": round(uncached_us, 1),
        "uncached_us_per_call_10": round(uncached_us_10, 1),
        "memoised_same_after_s": round(same_s, 3),
        "memoised_same_after_evaluations": same_stats.evaluations,
        "memoised_spread_after_s": round(spread_s, 3),
        "memoised_spread_after_evaluations": spread_stats.evaluations,
        "memoised_window_10min_s": round(window_s, 3),
        "memoised_window_10min_evaluations": window_stats.evaluations,
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
    ]

"""The memoised path for the materializer: schedules sharing a rule share its evaluation.

Part of ``apps.schedules.timerules`` (docs/timerules.md).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from apps.schedules.timerules.base import (
    _MAX_YEAR,
    _T,
    MAX_LIMIT,
    DstFold,
    DstGap,
    TimeRuleError,
    _check_count,
    _to_utc,
)
from apps.schedules.timerules.engine import _collect, _query


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    evaluations: int
    size: int
    maxsize: int


class NextFireCache:
    """Bounded LRU memo of rule evaluations keyed by ``(expression, zone, dst_gap, dst_fold,
    after)`` (``after`` normalised to UTC) and, for ranges, ``(…, until, limit)``.

    500,000 schedules sharing 50 (expression, zone) pairs and one ``after`` cost 50 evaluations.
    Thread-safe (``functools.lru_cache``); invalid input raises ``TimeRuleError`` and is not
    cached.
    """

    def __init__(self, maxsize: int = 100_000) -> None:
        if maxsize <= 0:
            raise ValueError("maxsize must be positive")
        self.maxsize = maxsize
        self._lock = threading.Lock()
        self._evaluations = 0
        self._next = functools.lru_cache(maxsize=maxsize)(self._compute_next)
        self._range = functools.lru_cache(maxsize=max(1, maxsize // 4))(self._compute_range)

    def _count(self) -> None:
        with self._lock:
            self._evaluations += 1

    # The memo keys: flat argument lists (a nested tuple would cost every lookup a rehash).
    def _compute_next(
        self, expression: str, time_zone: str, dst_gap: str, dst_fold: str, after: datetime
    ) -> datetime | None:
        self._count()
        query = _query(expression, time_zone, dst_gap, dst_fold)
        found = _collect(query, after, 1, None, None, False)
        return found[0] if found else None

    def _compute_range(
        self,
        expression: str,
        time_zone: str,
        dst_gap: str,
        dst_fold: str,
        after: datetime,
        until: datetime,
        limit: int,
    ) -> tuple[datetime, ...]:
        self._count()
        query = _query(expression, time_zone, dst_gap, dst_fold)
        limit = _check_count(limit, "limit", MAX_LIMIT)
        low = _to_utc(after, "after")
        high = _to_utc(until, "until")
        if high <= low:
            return ()
        try:
            last_year = high.astimezone(query.tz).year + 1
        except OverflowError:
            last_year = _MAX_YEAR
        return tuple(_collect(query, low, limit, last_year, high, True))

    def next_after(
        self,
        expression: str,
        time_zone: str,
        after: datetime,
        *,
        dst_gap: str = DstGap.SKIP,
        dst_fold: str = DstFold.FIRST,
    ) -> datetime | None:
        """Memoised ``next_fire_time`` (aware UTC or None)."""
        if after.tzinfo is not UTC:
            after = _to_utc(after, "after")
        return _lookup(self._next, expression, time_zone, dst_gap, dst_fold, after)

    def fire_times_between(
        self,
        expression: str,
        time_zone: str,
        after: datetime,
        until: datetime,
        *,
        dst_gap: str = DstGap.SKIP,
        dst_fold: str = DstFold.FIRST,
        limit: int = 1000,
    ) -> list[datetime]:
        """Memoised: all fire instants in ``(after, until]`` (aware UTC, ascending), at most
        ``limit``. Apply a schedule's ``start_at``/``end_at`` by narrowing ``after``/``until``
        before calling."""
        after = _to_utc(after, "after")
        until = _to_utc(until, "until")
        key = (expression, time_zone, dst_gap, dst_fold, after, until, limit)
        return list(_lookup(self._range, *key))

    def next_after_many(
        self, items: Iterable[tuple[str, str, str, str, datetime]]
    ) -> list[datetime | None]:
        """Batch ``next_after`` over ``(expression, time_zone, dst_gap, dst_fold, after)``."""
        compute = self._next
        out: list[datetime | None] = []
        append = out.append
        for expression, time_zone, dst_gap, dst_fold, after in items:
            if after.tzinfo is not UTC:
                after = _to_utc(after, "after")
            append(compute(expression, time_zone, dst_gap, dst_fold, after))
        return out

    def fire_times_many(
        self,
        items: Iterable[tuple[str, str, str, str, datetime]],
        until: datetime,
        *,
        limit: int = 1000,
    ) -> list[list[datetime]]:
        """Batch ``fire_times_between`` with one horizon ``until`` for all items."""
        until = _to_utc(until, "until")
        compute = self._range
        out: list[list[datetime]] = []
        for expression, time_zone, dst_gap, dst_fold, after in items:
            if after.tzinfo is not UTC:
                after = _to_utc(after, "after")
            out.append(list(compute(expression, time_zone, dst_gap, dst_fold, after, until, limit)))
        return out

    def stats(self) -> CacheStats:
        a, b = self._next.cache_info(), self._range.cache_info()
        return CacheStats(
            hits=a.hits + b.hits,
            misses=a.misses + b.misses,
            evaluations=self._evaluations,
            size=a.currsize + b.currsize,
            maxsize=self.maxsize,
        )

    def clear(self) -> None:
        self._next.cache_clear()
        self._range.cache_clear()
        with self._lock:
            self._evaluations = 0


def _lookup(memo: Callable[..., _T], *key: object) -> _T:
    """``memo(*key)``; an unhashable key means an expression or zone that is not a string."""
    try:
        return memo(*key)
    except TypeError:
        raise TimeRuleError("expression", "expression and time_zone must be strings.") from None


default_cache: Final = NextFireCache()
#: All fire instants in ``(after, until]`` (aware UTC, ascending), at most ``limit``: the
#: memoised ``NextFireCache.fire_times_between`` of ``default_cache``.
fire_times_between: Final = default_cache.fire_times_between

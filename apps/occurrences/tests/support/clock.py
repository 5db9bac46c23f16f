"""For tests whose subject is "within the same hour" (an hourly budget): wait out the end of
an hour instead of failing when the test happens to run across it (CI runs at any hour)."""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone


def clear_of_the_hour_end(needed_s: float) -> None:
    """Return once at least `needed_s` seconds remain before the next full hour (UTC): sleeps
    past the boundary when fewer remain, at most `needed_s` + 1 seconds."""
    now = timezone.now()
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    remaining = (next_hour - now).total_seconds()
    if remaining < needed_s:
        time.sleep(remaining + 1)

"""How long each handler's runs took in this pool process: envelope_run.py sizes a run by it.

In memory and per process on purpose: a run is sized by what this slot saw lately, needs no
query, and a process that has not seen a handler run often enough forms no run with it.
"""

from __future__ import annotations

import math
import threading
from collections import deque

from django.conf import settings

KEPT_RUNS = 100


class HandlerTimes:
    """The last `KEPT_RUNS` run times of each handler."""

    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def record(self, handler: str, seconds: float) -> None:
        with self._lock:
            self._times.setdefault(handler, deque(maxlen=KEPT_RUNS)).append(max(seconds, 0.0))

    def p95_s(self, handler: str) -> float | None:
        """The 95th percentile of the handler's kept run times; None until it ran
        `TICK_ENVELOPE_RUN_SAMPLES` times here."""
        with self._lock:
            times = sorted(self._times.get(handler, ()))
        if not times or len(times) < settings.TICK_ENVELOPE_RUN_SAMPLES:
            return None
        return times[min(len(times) - 1, math.ceil(0.95 * len(times)) - 1)]

    def any_within(self, seconds: float) -> bool:
        """Whether some handler's 95th percentile is known and at most `seconds`."""
        with self._lock:
            handlers = list(self._times)
        return any((p95 := self.p95_s(h)) is not None and p95 <= seconds for h in handlers)

    def clear(self) -> None:
        with self._lock:
            self._times.clear()


handler_times = HandlerTimes()

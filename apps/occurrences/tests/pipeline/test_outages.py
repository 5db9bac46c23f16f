"""The backoff of pipeline/outages.py: jittered within its ceiling, capped."""

from __future__ import annotations

from apps.occurrences.pipeline.outages import Backoff


def test_backoff_draws_from_the_upper_half_of_a_doubling_capped_ceiling():
    backoff = Backoff(base_s=0.25, cap_s=2.0)

    delays = [backoff.next_delay() for _ in range(5)]

    ceilings = [0.5, 1.0, 2.0, 2.0, 2.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))
    backoff.reset()
    assert 0.25 <= backoff.next_delay() <= 0.5

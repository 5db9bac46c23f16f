"""`manage.py bench_bulk` at tiny scale: a real `bulk` process pauses the schedules alone and
during a (stand-in) burst, the figures add up, and nothing is left behind."""

from __future__ import annotations

import json
import time
from dataclasses import fields
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from apps.bench import burst as burst_module
from apps.bench.burst import BurstReport
from apps.occurrences.models import BulkChange
from apps.schedules.models import Schedule
from apps.tenants.models import Tenant


def _fake_burst(**kwargs: Any) -> BurstReport:
    """Stands in for bench_burst (its own business): an instant 1 s ahead, delivered 1 s
    after it, a p99 of 0.25 s. What it sees of the bulk tenant is kept for the test."""
    instant = timezone.now() + timedelta(seconds=1)
    kwargs["on_started"](instant)
    time.sleep(max(0.0, instant.timestamp() + 1.0 - time.time()))
    kwargs["on_delivered"]()
    figures = {f.name: 0 for f in fields(BurstReport) if f.name not in {"cpu", "peak_rss_mb"}}
    return BurstReport(**{**figures, "schedules": kwargs["schedules"], "p99_s": 0.25})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("start", [[], ["--bulk-before", "0.5"]])
def test_a_tiny_real_run_pauses_every_schedule_and_cleans_up(monkeypatch, start):
    monkeypatch.setattr(burst_module, "bench_burst", _fake_burst)
    out = StringIO()

    call_command(
        "bench_bulk", "--schedules", "30", "--burst", "5", "--alone", "10", "--timeout", "60",
        *start, stdout=out,
    )  # fmt: skip

    report = json.loads(out.getvalue().splitlines()[-1])
    for phase, count in (("alone", 10), ("during", 30)):
        figures = report[phase]
        assert figures["schedules"] == figures["changed"] == count
        assert figures["already"] == figures["refused"] == 0
        assert figures["duration_s"] > 0 and figures["per_s"] > 0
        # A tiny run is one set-based transaction: its backend may stay below one clock tick.
        assert figures["pg_backend_cpu_ms_per_schedule"] >= 0
        assert figures["bulk_cpu_ms_per_schedule"] > 0
    assert report["strict_p99_s"] == 0.25 and report["burst"]["schedules"] == 5
    assert set(report["load_average"]) == {"start", "delivered", "end"}
    assert "holds" in out.getvalue()
    # Nothing left: the tenants, their schedules and the bulk jobs.
    assert not Tenant.objects.exists()
    assert not Schedule.objects.exists()
    assert not BulkChange.objects.exists()

"""`manage.py bench_api`: its figures, the database URL its server uses, and a tiny real run
against the gunicorn it starts (one endpoint, one client, one second), which leaves nothing
behind — also when the run fails."""

from __future__ import annotations

import time
import uuid
from dataclasses import fields
from datetime import timedelta
from typing import Any

import pytest
import urllib3
from django.utils import timezone

from apps.bench import api_load
from apps.bench.api_load import (
    NO_RESPONSE,
    Sample,
    bench_api,
    database_url,
    summarize,
    timeline,
    web_database_url,
)
from apps.bench.burst import BurstReport
from apps.schedules.models import Schedule
from apps.tenants.models import ApiKey, Tenant


def _sample(latency_ms: float, status: int = 200, sent: float = 0.0, op: str = "read") -> Sample:
    return Sample(op, sent, latency_ms / 1000, status)


def test_summary_counts_only_2xx_answers_in_rate_and_latency():
    samples = [_sample(ms) for ms in range(1, 101)]  # 1 … 100 ms
    # Errors are slow here: they must neither raise the latencies nor count as throughput.
    samples += [_sample(10_000, 500), _sample(5, 429), _sample(60_000, NO_RESPONSE)]

    stats = summarize(samples, seconds=2.0)

    assert stats.requests == 103
    assert stats.rps == 50.0  # 100 answers of 2xx in 2 s
    assert (stats.p50_ms, stats.p99_ms, stats.max_ms) == (51.0, 100.0, 100.0)
    assert stats.errors == 3
    assert stats.statuses == {"0": 1, "429": 1, "500": 1}


def test_summary_of_nothing_but_errors_has_no_latency():
    stats = summarize([_sample(3, 503), _sample(4, 503)], seconds=1.0)

    assert stats.rps == 0.0 and stats.errors == 2 and stats.statuses == {"503": 2}
    assert stats.p99_ms != stats.p99_ms  # NaN: no answer to measure


def test_timeline_buckets_by_second_of_sending_relative_to_the_instant():
    instant = 1_000.0
    samples = [
        _sample(5_000, sent=instant - 1.5),  # sent before, answered after the instant
        _sample(10, sent=instant - 0.2),
        _sample(20, sent=instant),
        _sample(40, sent=instant + 0.9),
        _sample(99, 409, sent=instant + 0.5),
    ]

    rows = timeline(samples, instant)

    assert [(r["t"], r["n"], r["errors"]) for r in rows] == [(-2, 1, 0), (-1, 1, 0), (0, 3, 1)]
    assert rows[0]["max_ms"] == 5000.0  # the wait is charged to the second it was sent in
    assert (rows[2]["p50_ms"], rows[2]["max_ms"]) == (40.0, 40.0)


def test_database_url_logs_in_as_another_role_without_the_password():
    db = {"NAME": "tick", "USER": "owner", "PASSWORD": "p@ss/word", "HOST": "db", "PORT": 5433}

    assert database_url(db) == "postgresql://owner:p%40ss%2Fword@db:5433/tick"
    assert database_url(db, user="tick_web") == "postgresql://tick_web@db:5433/tick"


def test_a_web_url_for_another_database_is_refused(monkeypatch, settings):
    monkeypatch.setenv("TICK_WEB_DATABASE_URL", "postgres://tick_web@127.0.0.1:5432/elsewhere")

    with pytest.raises(RuntimeError, match="elsewhere"):
        web_database_url()


def _refuses_connections(base_url: str) -> bool:
    try:
        urllib3.PoolManager(retries=False).request("GET", f"{base_url}/healthz", timeout=2.0)
    except urllib3.exceptions.HTTPError:
        return True
    return False


@pytest.fixture
def no_web_url(monkeypatch):
    # The test database is not the one a `make run` env file names.
    monkeypatch.delenv("TICK_WEB_DATABASE_URL", raising=False)


def _fake_burst(**kwargs: Any) -> BurstReport:
    """Stands in for bench_burst (its own tests' business): an instant 1 s ahead, delivered
    1 s after it; the change clients run from `burst_before_s` before until then."""
    instant = timezone.now() + timedelta(seconds=1)
    kwargs["on_started"](instant)
    time.sleep(max(0.0, instant.timestamp() + 1.0 - time.time()))
    kwargs["on_delivered"]()
    figures = {f.name: 0 for f in fields(BurstReport) if f.name not in {"cpu", "peak_rss_mb"}}
    return BurstReport(**{**figures, "schedules": kwargs["schedules"], "p99_s": 0.25})


@pytest.mark.django_db(transaction=True)
def test_a_tiny_real_run_measures_the_started_server_and_cleans_up(no_web_url, monkeypatch):
    monkeypatch.setattr(api_load, "bench_burst", _fake_burst)

    report = bench_api(
        schedules=6, clients=[1], seconds=1.0, endpoints=["read"], during_burst=7,
        burst_clients=2, burst_before_s=0.5,
    )  # fmt: skip

    read = report.endpoints["read"]["1"]
    assert read["errors"] == 0 and read["requests"] > 0
    assert read["rps"] > 0 and 0 < read["p50_ms"] <= read["p99_ms"] <= read["max_ms"]
    assert report.own_server and report.db_login.endswith("tick_web")
    cpu = report.cpu_ms_per_request["read"]["1"]
    assert cpu["web"] > 0 and cpu["bench"] > 0 and set(cpu) >= {"postgresql", "rabbitmq"}
    assert list(report.endpoints) == ["read"]
    # The change mix went through the real API without an error, before and during the burst.
    during = report.during_burst
    assert during is not None and during["burst"]["p99_s"] == 0.25
    for op in ("patch", "pause", "resume", "read"):
        assert during["baseline"][op]["requests"] > 0 and during["baseline"][op]["errors"] == 0
        assert during["ops"][op]["requests"] > 0 and during["ops"][op]["errors"] == 0
    seconds = [row["t"] for row in during["changes_by_second"]]
    assert seconds and -1 <= seconds[0] and seconds[-1] <= 1  # from 0.5 s before to 1 s after
    # Nothing left: the tenant with its key and schedules, and the server.
    assert not Tenant.objects.exists()
    assert not ApiKey.objects.exists()
    assert not Schedule.objects.exists()
    assert _refuses_connections(report.base_url)


@pytest.mark.django_db(transaction=True)
def test_a_failing_run_still_stops_its_server_and_deletes_its_tenant(no_web_url, monkeypatch):
    seen: dict[str, Any] = {}

    def fail(base_url: str, key: str, ids: Any, *args: Any) -> None:
        seen["base_url"], seen["schedules"] = base_url, Schedule.objects.count()
        raise RuntimeError("boom")

    monkeypatch.setattr(api_load, "_measure_endpoint", fail)

    with pytest.raises(RuntimeError, match="boom"):
        bench_api(schedules=3, clients=[1], seconds=1.0, endpoints=["list"])

    assert seen["schedules"] == 3  # it had set up before failing
    assert not Tenant.objects.exists() and not Schedule.objects.exists()
    assert _refuses_connections(seen["base_url"])


def test_unknown_endpoint_is_refused():
    with pytest.raises(ValueError, match="unknown endpoint"):
        api_load.endpoint_request("delete", [str(uuid.uuid4())], 0)

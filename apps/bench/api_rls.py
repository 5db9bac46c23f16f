"""API latency with and without row-level security, in one run (``manage.py bench_api_rls``;
docs/performance.md "API and row-level security").

Two in-process Django test clients send the same requests through the whole middleware and
DRF stack to the configured database: one with the RLS middleware (the web role, the tenant
setting, the policies), one with it removed (the connection's own role: the tables' owner,
which the policies exempt — what the API cost before). Rounds alternate which client goes
first, so drift (autovacuum, caches) falls on both alike. Two tenants with `schedules`
schedules each are created first (so the policies have another tenant's rows to filter out).

Everything runs in one transaction that is rolled back at the end (schedules are never
deleted, so a bench that committed would leave them behind): requests' own transactions are
savepoints, so no commit (fsync) is timed — the same for both modes. No network and no
gunicorn: the figures are the application's and the database's cost per request.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.test import Client, override_settings

from apps.schedules.models import Schedule
from apps.schedules.services import ScheduleSpec, schedule_create
from apps.tenants import rls
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create, tenant_create

RLS_MIDDLEWARE = "apps.tenants.middleware.TenantRLSMiddleware"
MODES = ("rls", "no_rls")
OPS = ("list", "read", "create")
LIST_URL = "/api/v1/schedules?page_size=50"
CREATE_URL = "/api/v1/schedules"


def _spec(n: int) -> ScheduleSpec:
    return ScheduleSpec(
        name=f"bench {n}", kind=Schedule.Kind.CRON, expression="0 * * * *", time_zone="UTC",
        handler="noop",
    )  # fmt: skip


def _tenant(label: str, schedules: int) -> tuple[Tenant, str]:
    tenant = tenant_create(slug=f"bench-rls-{label}-{uuid.uuid4().hex[:8]}", name="bench")
    Tenant.objects.filter(pk=tenant.pk).update(api_rate_per_min=10**9)
    for n in range(schedules):
        schedule_create(tenant=tenant, spec=_spec(n), actor="bench")
    _, raw = api_key_create(actor="bench", tenant=tenant, name="bench")
    return tenant, raw


def _client(raw_key: str, *, rls: bool) -> Client:
    host = next((h for h in settings.ALLOWED_HOSTS if h not in {"*", ""}), "localhost")
    client = Client(SERVER_NAME=host.lstrip("."), HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    middleware = [m for m in settings.MIDDLEWARE if rls or m != RLS_MIDDLEWARE]
    # A test client loads its middleware chain on its first request and keeps it.
    with override_settings(MIDDLEWARE=middleware):
        response = client.get("/api/v1/schedules?page_size=1", secure=True)
    if response.status_code != 200:
        raise RuntimeError(f"warm-up request answered {response.status_code}")
    return client


def _timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    response = call()
    elapsed = time.perf_counter() - start
    if response.status_code >= 300:
        raise RuntimeError(f"bench request answered {response.status_code}")
    return elapsed * 1000


def _sql_timed(sql: str, params: Any) -> float:
    start = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        cursor.fetchall()
    return (time.perf_counter() - start) * 1000


def _sql_samples(tenant: Tenant, rounds: int) -> dict[str, list[float]]:
    """The database's share: one round trip (`SELECT 1`), and a page of 50 schedules of the
    tenant as the owner and as the web role under the policy (settings already applied)."""
    page = Schedule.objects.filter(tenant=tenant).order_by("-created_at", "-id")[:51]
    sql, params = page.query.sql_with_params()
    samples: dict[str, list[float]] = {"round_trip": [], "owner": [], "policy": []}
    for _ in range(rounds):
        samples["round_trip"].append(_sql_timed("SELECT 1", []))
        samples["owner"].append(_sql_timed(sql, params))
        rls.request_begin(user_id=None)
        rls.tenant_enter(tenant.pk)
        samples["policy"].append(_sql_timed(sql, params))
        rls.request_end()
    return samples


def _p50_p95(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 3),
        "p95": round(statistics.quantiles(values, n=20)[18], 3),
    }


def bench_api_rls(*, requests: int, schedules: int) -> dict[str, Any]:
    """Per mode and operation: median and p95 latency in ms over `requests` requests; and the
    database's share measured alone (`sql_ms`)."""
    with transaction.atomic():
        results = _run(requests=requests, schedules=schedules)
        transaction.set_rollback(True)
    return results


def _run(*, requests: int, schedules: int) -> dict[str, Any]:
    tenant, raw = _tenant("a", schedules)
    _tenant("b", schedules)
    ids = [str(i) for i in Schedule.objects.filter(tenant=tenant).values_list("id", flat=True)]
    clients = {mode: _client(raw, rls=mode == "rls") for mode in MODES}
    samples: dict[str, dict[str, list[float]]] = {m: {op: [] for op in OPS} for m in MODES}
    body = {"name": "bench new", "kind": "cron", "expression": "0 * * * *",
            "time_zone": "UTC", "handler": "noop", "payload": {}}  # fmt: skip
    for n in range(requests):
        order = MODES if n % 2 == 0 else MODES[::-1]
        for mode in order:
            client, times = clients[mode], samples[mode]
            url = f"/api/v1/schedules/{ids[n % len(ids)]}"
            times["list"].append(_timed(partial(client.get, LIST_URL, secure=True)))
            times["read"].append(_timed(partial(client.get, url, secure=True)))
            times["create"].append(
                _timed(partial(client.post, CREATE_URL, body, "application/json", secure=True))
            )
    sql = _sql_samples(tenant, requests)
    return {
        "requests": requests,
        "schedules_per_tenant": schedules,
        "ms": {mode: {op: _p50_p95(v) for op, v in samples[mode].items()} for mode in MODES},
        "sql_ms": {name: _p50_p95(values) for name, values in sql.items()},
    }


def format_results(results: dict[str, Any]) -> list[str]:
    ms = results["ms"]
    lines = [
        f"{results['requests']} requests per operation and mode; "
        f"{results['schedules_per_tenant']} schedules in each of two tenants",
        f"{'operation':<10}{'no RLS p50':>12}{'RLS p50':>10}{'Δ p50':>9}"
        f"{'no RLS p95':>12}{'RLS p95':>10}",
    ]
    for op in OPS:
        off, on = ms["no_rls"][op], ms["rls"][op]
        lines.append(
            f"{op:<10}{off['p50']:>12.2f}{on['p50']:>10.2f}{on['p50'] - off['p50']:>+9.2f}"
            f"{off['p95']:>12.2f}{on['p95']:>10.2f}"
        )
    sql = results["sql_ms"]
    lines.append(
        f"database alone (p50): round trip {sql['round_trip']['p50']:.2f} ms; a page of 50 "
        f"schedules {sql['owner']['p50']:.2f} ms as the owner, "
        f"{sql['policy']['p50']:.2f} ms under the policy"
    )
    return lines

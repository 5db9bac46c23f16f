"""The schedule list's filters at scale (docs/performance.md "Label filters"): one tenant with
N schedules loaded by SQL (labels of every selectivity), then each filter's first and third
keyset page read through the API's own code (`schedules_filtered`, `keyset_page`), timed and
explained. Meant for a scratch database."""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from apps.core.pagination import keyset_page
from apps.schedules.models import Schedule
from apps.schedules.selectors import schedules_filtered
from apps.tenants.models import Tenant

PAGE = 50

# customer: 1 in 1000 (0.1 %); tier=gold 1 %; env=prod 50 %; rare: 20 schedules.
_LOAD = """
    INSERT INTO schedules_schedule (id, tenant_id, name, kind, expression, time_zone, dst_gap,
        dst_fold, precision, flexible_window_s, misfire_policy, max_lateness_s, catchup_limit,
        overlap_policy, handler, payload, labels, version, state, next_run_at, shard,
        created_at, updated_at)
    SELECT gen_random_uuid(), %(tenant)s, 'bench ' || n, %(cron)s, '0 3 * * *', 'UTC',
           %(gap)s, %(fold)s, %(precision)s, 0, %(fire_once)s, 60, 0, %(allow)s,
           CASE WHEN n %% 10 = 0 THEN 'webhook' ELSE 'noop' END, '{}'::jsonb,
           jsonb_build_object('customer', (n %% 1000)::text,
                              'env', CASE WHEN n %% 2 = 0 THEN 'prod' ELSE 'test' END,
                              'tier', CASE WHEN n %% 100 = 0 THEN 'gold' ELSE 'std' END)
           || CASE WHEN n %% (%(count)s / 20) = 7 THEN '{"rare": "yes"}'::jsonb
                   ELSE '{}'::jsonb END,
           1, CASE WHEN n %% 10 = 3 THEN %(paused)s ELSE %(active)s END, now() + interval '1 day',
           n %% %(shards)s, now() - n * interval '1 second', now()
    FROM generate_series(1, %(count)s) AS n
"""

FILTERS: dict[str, dict[str, Any]] = {
    "no filter": {},
    "state=paused (10 %)": {"state": Schedule.State.PAUSED},
    "handler=webhook (10 %)": {"handler": "webhook"},
    "label rare=yes (20 rows)": {"label": [("rare", "yes")]},
    "label customer=42 (0.1 %)": {"label": [("customer", "42")]},
    "label tier=gold (1 %)": {"label": [("tier", "gold")]},
    "label env=prod (50 %)": {"label": [("env", "prod")]},
    "label customer=42 & env=prod": {"label": [("customer", "42"), ("env", "prod")]},
    "label env=prod & state=active": {"label": [("env", "prod")], "state": Schedule.State.ACTIVE},
}


def load(count: int) -> Tenant:
    tenant = Tenant.objects.create(slug=f"bench-labels-{uuid.uuid4().hex[:8]}", name="bench")
    Tenant.objects.filter(pk=tenant.pk).update(max_active_schedules=count * 2)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_LOAD, {
            "tenant": tenant.id, "count": count, "shards": settings.TICK_SHARDS,
            "cron": Schedule.Kind.CRON, "gap": Schedule.DstGap.SKIP,
            "fold": Schedule.DstFold.FIRST, "precision": Schedule.Precision.STRICT,
            "fire_once": Schedule.MisfirePolicy.FIRE_ONCE,
            "allow": Schedule.OverlapPolicy.ALLOW, "paused": Schedule.State.PAUSED,
            "active": Schedule.State.ACTIVE,
        })  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE schedules_schedule")
    return tenant


def _plan(queryset: Any) -> str:
    text = queryset.explain(analyze=True, buffers=True)
    lines = text.splitlines()
    nodes = [line.strip().removeprefix("-> ").split("  (")[0] for line in lines
             if "->" in line or line is lines[0]]  # fmt: skip
    return " > ".join(node for node in nodes if node != "Limit")


def measure(tenant: Tenant, repeats: int) -> list[dict[str, Any]]:
    results = []
    for name, filters in FILTERS.items():
        queryset = schedules_filtered(tenant=tenant, **filters)
        first = keyset_page(queryset, field="created_at", cursor=None, size=PAGE)
        cursor = first.next_cursor
        if cursor is not None:  # the third page: two cursors on
            second = keyset_page(queryset, field="created_at", cursor=cursor, size=PAGE)
            cursor = second.next_cursor
        timings: dict[str, list[float]] = {"page1": [], "page3": []}
        for _ in range(repeats):
            for page, at in (("page1", None), ("page3", cursor)):
                started = time.perf_counter()
                keyset_page(queryset, field="created_at", cursor=at, size=PAGE)
                timings[page].append((time.perf_counter() - started) * 1000)
        ordered = queryset.order_by("-created_at", "-id")[: PAGE + 1]
        results.append({
            "filter": name, "rows": len(first.rows),
            "first_ms": round(statistics.median(timings["page1"]), 2),
            "third_ms": round(statistics.median(timings["page3"]), 2),
            "plan": _plan(ordered),
        })  # fmt: skip
    return results

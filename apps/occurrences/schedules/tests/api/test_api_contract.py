"""Tenancy trio on every id route and method, the error contract, idempotent create,
quotas, per-key rate limits and list filters."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.forms.models import model_to_dict
from rest_framework.test import APIClient

from apps.schedules.models import Schedule, ScheduleEvent, ScheduleVersion
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import IdempotencyKey, Membership
from apps.tenants.services import api_key_create

pytestmark = pytest.mark.django_db

CRON = {"name": "hourly", "kind": "cron", "expression": "0 * * * *", "handler": "record"}

ID_ROUTES = [
    ("get", ""), ("patch", ""), ("put", ""), ("delete", ""), ("post", ""), ("options", ""),
    ("head", ""), ("post", "/pause"), ("post", "/resume"), ("post", "/cancel"),
    ("get", "/pause"), ("delete", "/cancel"), ("get", "/preview"), ("post", "/preview"),
]  # fmt: skip


def _snapshot(schedule: Schedule) -> Any:
    return (
        model_to_dict(Schedule.objects.get(pk=schedule.pk)),
        ScheduleVersion.objects.filter(schedule=schedule).count(),
        ScheduleEvent.objects.filter(schedule=schedule).count(),
    )


@pytest.mark.parametrize("method, suffix", ID_ROUTES)
def test_outsider_gets_404_on_every_id_route_and_method_and_nothing_changes(
    api_a, api_b, tenant_a, method, suffix
):
    schedule = make_schedule(tenant_a)
    before = _snapshot(schedule)

    response = getattr(api_b, method)(
        f"/api/v1/schedules/{schedule.id}{suffix}", {"name": "mine now"}, format="json"
    )

    assert response.status_code == 404
    if method != "head":
        assert response.json()["error"]["code"] == "not_found"
    assert _snapshot(schedule) == before


def test_owner_gets_405_for_methods_a_route_does_not_allow(api_a, tenant_a):
    schedule = make_schedule(tenant_a)
    assert api_a.put(f"/api/v1/schedules/{schedule.id}", CRON, format="json").status_code == 405
    assert api_a.get(f"/api/v1/schedules/{schedule.id}/pause").status_code == 405


# --- the error contract ---------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _post_raw(client: Any, body: bytes | str, content_type: str = "application/json") -> Any:
    return client.generic("POST", "/api/v1/schedules", body, content_type=content_type)


@pytest.mark.parametrize(
    "body, status, code",
    [
        (b'{"name": ', 400, "malformed_json"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "malformed_json"),  # RecursionError, not 500
        (json.dumps({**CRON, "payload": _nested(40)}), 400, "malformed_json"),
        (b'{"name": NaN}', 400, "malformed_json"),
        (b'{"name": "a\\u0000b"}', 400, "malformed_json"),
        (b'{"name": "\\ud800"}', 400, "malformed_json"),
        (b"\xff\xfe", 400, "malformed_json"),
        (b"x" * (256 * 1024 + 1), 413, "request_too_large"),
    ],
    ids=["truncated", "deep", "deep-payload", "nan", "nul", "surrogate", "not-utf8", "huge"],
)
def test_bad_bodies_get_the_one_error_shape_and_write_nothing(api_a, body, status, code):
    response = _post_raw(api_a, body)

    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert (error["code"], error["fields"]) == (code, {})
    assert error["message"]
    assert Schedule.objects.count() == 0


def test_non_json_content_type_is_415(api_a):
    response = _post_raw(api_a, "name=x", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    "change, field",
    [({"name": 123}, "name"), ({"max_lateness_s": "60"}, "max_lateness_s"),
     ({"catchup_limit": True}, "catchup_limit"), ({"flexible_window_s": 1.5}, "flexible_window_s"),
     ({"handler": "rm -rf"}, "handler"), ({"kind": "daily"}, "kind"), ({"name": "x" * 201}, "name"),
     ({"payload": {"blob": "x" * (64 * 1024)}}, "payload"), ({"surprise": 1}, "surprise")],
)  # fmt: skip
def test_wrong_types_and_limits_are_field_errors(api_a, change, field):
    response = api_a.post("/api/v1/schedules", {**CRON, **change}, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid"
    assert list(response.json()["error"]["fields"]) == [field]
    assert Schedule.objects.count() == 0


def test_payload_just_under_64_kib_is_accepted(api_a):
    payload = {"blob": "x" * (64 * 1024 - 20)}
    response = api_a.post("/api/v1/schedules", {**CRON, "payload": payload}, format="json")
    assert response.status_code == 201, response.content[:300]


def test_unauthenticated_is_401_in_the_error_shape(client):
    response = client.get("/api/v1/schedules")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response["WWW-Authenticate"] == "Bearer"


# --- idempotent create ----------------------------------------------------------------------


def test_same_key_and_body_replays_the_first_response(api_a, tenant_a):
    first = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    # same JSON value, other key order: the same request
    reordered = dict(reversed(list(CRON.items())))
    second = api_a.post("/api/v1/schedules", reordered, format="json", HTTP_IDEMPOTENCY_KEY="k-1")

    assert (first.status_code, second.status_code) == (201, 201)
    assert second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Schedule.objects.filter(tenant=tenant_a).count() == 1


def test_same_key_with_another_body_is_409_and_creates_nothing(api_a):
    api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="k-2")

    response = api_a.post(
        "/api/v1/schedules", {**CRON, "name": "other"}, format="json", HTTP_IDEMPOTENCY_KEY="k-2"
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert Schedule.objects.count() == 1


def test_a_refused_request_does_not_spend_its_key(api_a):
    bad = api_a.post(
        "/api/v1/schedules", {**CRON, "expression": "61 * * * *"}, format="json",
        HTTP_IDEMPOTENCY_KEY="k-3",
    )  # fmt: skip
    good = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="k-3")

    assert (bad.status_code, good.status_code) == (400, 201)
    assert Schedule.objects.count() == 1


def test_idempotency_keys_are_per_tenant(api_a, api_b):
    a = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="shared")
    b = api_b.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="shared")

    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["id"] != b.json()["id"]
    assert IdempotencyKey.objects.count() == 2


def test_expired_key_is_forgotten(api_a, settings):
    api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="old")
    IdempotencyKey.objects.update(created_at="2000-01-01T00:00:00Z")

    again = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="old")

    assert again.status_code == 201 and not again.has_header("Idempotent-Replayed")
    assert Schedule.objects.count() == 2


def test_malformed_idempotency_key_is_a_field_error(api_a):
    response = api_a.post("/api/v1/schedules", CRON, format="json", HTTP_IDEMPOTENCY_KEY="x" * 300)
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["Idempotency-Key"]


# --- quotas and rate limits -----------------------------------------------------------------


def test_active_schedule_quota_is_a_clear_409_and_cancel_frees_a_slot(api_a, tenant_a):
    tenant_a.max_active_schedules = 1
    tenant_a.save(update_fields=["max_active_schedules"])
    first = api_a.post("/api/v1/schedules", CRON, format="json").json()

    refused = api_a.post("/api/v1/schedules", CRON, format="json")
    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "quota_exceeded"
    assert "quota is 1" in refused.json()["error"]["message"]

    api_a.post(f"/api/v1/schedules/{first['id']}/cancel")
    assert api_a.post("/api/v1/schedules", CRON, format="json").status_code == 201


def test_rule_firing_more_often_than_the_tenant_allows_is_refused(api_a, tenant_a):
    tenant_a.min_interval_s = 300
    tenant_a.save(update_fields=["min_interval_s"])

    too_often = api_a.post("/api/v1/schedules", {**CRON, "expression": "0,4 * * * *"},
                           format="json")  # fmt: skip
    assert too_often.status_code == 400
    assert too_often.json()["error"]["code"] == "rule_too_frequent"
    assert list(too_often.json()["error"]["fields"]) == ["expression"]
    # 23:59 -> 00:00 wraps across midnight: 60 s apart
    wraps = api_a.post("/api/v1/schedules", {**CRON, "expression": "0,59 0,23 * * *"},
                       format="json")  # fmt: skip
    assert wraps.status_code == 400
    ok = api_a.post("/api/v1/schedules", {**CRON, "expression": "*/5 * * * *"}, format="json")
    assert ok.status_code == 201
    patched = api_a.patch(
        f"/api/v1/schedules/{ok.json()['id']}", {"expression": "* * * * *"}, format="json"
    )
    assert patched.status_code == 400
    assert Schedule.objects.get().expression == "*/5 * * * *"


def test_the_tenants_rate_limit_is_429_with_retry_after_for_all_its_keys(api_a, api_b, tenant_a):
    tenant_a.api_rate_per_min = 3
    tenant_a.save(update_fields=["api_rate_per_min"])
    _, viewer = api_key_create(tenant=tenant_a, name="ro", actor="t", role=Membership.Role.VIEWER)
    second_key = APIClient()
    second_key.credentials(HTTP_AUTHORIZATION=f"Bearer {viewer}")

    codes = [api_a.get("/api/v1/schedules").status_code for _ in range(3)]
    codes.append(second_key.get("/api/v1/schedules").status_code)

    assert codes == [200, 200, 200, 429]  # a second key of the tenant shares the limit
    refused = api_a.get("/api/v1/schedules")
    assert refused.json()["error"]["code"] == "rate_limited"
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert api_b.get("/api/v1/schedules").status_code == 200  # other tenant's key unaffected


# --- list filters ---------------------------------------------------------------------------


def test_list_filters_by_state_kind_handler_and_name(api_a, tenant_a, tenant_b):
    nightly = make_schedule(tenant_a, name="Nightly backup")
    weekly = make_schedule(tenant_a, name="weekly BACKUP", handler="noop")
    report = make_schedule(tenant_a, name="report")
    Schedule.objects.filter(pk=report.pk).update(state="PAUSED")
    make_schedule(tenant_b, name="nightly backup of b")

    def ids(query: str) -> list[str]:
        response = api_a.get(f"/api/v1/schedules?{query}")
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids("q=backup") == [str(weekly.id), str(nightly.id)]
    assert ids("state=paused") == [str(report.id)]
    assert ids("state=ACTIVE&handler=noop") == [str(weekly.id)]
    assert ids("kind=one_shot") == []
    assert len(ids("kind=cron")) == 3


@pytest.mark.parametrize("query, field", [("state=sleeping", "state"), ("q=ab", "q"),
                                          ("kind=x", "kind")])  # fmt: skip
def test_bad_list_filters_are_field_errors(api_a, query, field):
    response = api_a.get(f"/api/v1/schedules?{query}")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_cursor_pages_keep_the_filter(api_a, tenant_a):
    made = [make_schedule(tenant_a, name=f"job {i}", handler="noop") for i in range(5)]
    make_schedule(tenant_a, name="other")

    seen: list[str] = []
    url: str | None = "/api/v1/schedules?handler=noop&page_size=2"
    while url:
        body = api_a.get(url).json()
        seen += [row["id"] for row in body["results"]]
        url = body["next"]
    assert seen == [str(s.id) for s in reversed(made)]


@pytest.mark.parametrize(
    "where, index",
    [("tenant_id = %s AND state = 'PAUSED'", "schedule_tenant_state_idx"),
     ("tenant_id = %s AND handler = 'noop'", "schedule_tenant_handler_idx")],
)  # fmt: skip
def test_state_and_handler_filters_page_through_their_own_index(tenant_a, where, index):
    # A realistic spread (mostly ACTIVE `record` schedules, a few PAUSED `noop` ones) so the
    # planner's choice between the tenant-leading indexes is decided by selectivity, not by
    # ties on an empty table.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO schedules_schedule
                (id, tenant_id, name, kind, expression, time_zone, dst_gap, dst_fold,
                 precision, flexible_window_s, misfire_policy, max_lateness_s, catchup_limit,
                 overlap_policy, handler, payload, version, state, shard, created_at,
                 updated_at)
            SELECT gen_random_uuid(), %s, 'filler', 'CRON', '0 * * * *', 'UTC', 'skip',
                   'first', 'STRICT', 0, 'FIRE_ONCE', 60, 0, 'ALLOW',
                   CASE WHEN g %% 50 = 0 THEN 'noop' ELSE 'record' END, '{}', 1,
                   CASE WHEN g %% 50 = 0 THEN 'PAUSED' ELSE 'ACTIVE' END, g %% 256,
                   now() - make_interval(secs => g), now()
            FROM generate_series(1, 3000) AS g
            """,
            [tenant_a.id],
        )
    assert index in _plan(
        f"SELECT * FROM schedules_schedule WHERE {where} "
        "ORDER BY created_at DESC, id DESC LIMIT 51",
        [tenant_a.id],
    )


def test_name_search_expression_matches_the_trigram_index(tenant_a):
    # Exactly what Django's icontains emits on PostgreSQL must be indexable.
    sql = str(Schedule.objects.filter(name__icontains="backup").only("id").query)
    assert "UPPER(" in sql and "LIKE UPPER(" in sql
    plan = _plan(
        "SELECT id FROM schedules_schedule WHERE UPPER(name::text) LIKE UPPER(%s)", ["%backup%"]
    )
    assert "schedule_name_trgm_idx" in plan, plan


def _plan(sql: str, params: list[Any]) -> str:
    with connection.cursor() as cursor:
        # Statistics left by earlier tests (committed rows, then TRUNCATE) would skew the
        # choice between two tenant-leading indexes: plan on fresh ones.
        cursor.execute("ANALYZE schedules_schedule")
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        return "\n".join(row[0] for row in cursor.fetchall())

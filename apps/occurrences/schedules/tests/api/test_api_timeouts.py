"""A schedule's run-time limit (`timeout_s`): optional, 1 to the tenant's maximum, part of the
definition (a change makes a new version), shown on every read."""

from __future__ import annotations

import pytest

from apps.schedules.models import Schedule, ScheduleVersion
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

CRON = {
    "name": "nightly export",
    "kind": "cron",
    "expression": "0 3 * * *",
    "time_zone": "UTC",
    "handler": "noop",
}


def _limit_tenant(tenant: Tenant, max_timeout_s: int) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(max_timeout_s=max_timeout_s)


def _timeout_error(response) -> str:
    assert response.status_code == 400, response.content
    return " ".join(response.json()["error"]["fields"]["timeout_s"])


def test_timeout_is_optional_and_read_back(api_a):
    without = api_a.post("/api/v1/schedules", CRON, format="json")
    with_limit = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": 45}, format="json")

    assert without.status_code == 201 and with_limit.status_code == 201, with_limit.content
    assert without.json()["timeout_s"] is None
    assert with_limit.json()["timeout_s"] == 45
    schedule_id = with_limit.json()["id"]
    assert api_a.get(f"/api/v1/schedules/{schedule_id}").json()["timeout_s"] == 45
    assert Schedule.objects.get(id=schedule_id).timeout_s == 45


@pytest.mark.parametrize("value", [0, -5, "30", 2.5, True])
def test_timeout_that_is_no_positive_integer_is_a_400(api_a, value):
    response = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": value}, format="json")

    assert _timeout_error(response)
    assert Schedule.objects.count() == 0


def test_timeout_above_the_tenants_maximum_is_a_400_naming_the_maximum(api_a, tenant_a):
    _limit_tenant(tenant_a, 120)

    refused = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": 121}, format="json")
    accepted = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": 120}, format="json")

    assert "120" in _timeout_error(refused)
    assert refused.json()["error"]["code"] == "invalid"
    assert accepted.status_code == 201, accepted.content
    assert Schedule.objects.count() == 1


def test_the_maximum_is_per_tenant(api_a, api_b, tenant_a):
    _limit_tenant(tenant_a, 60)

    response = api_b.post("/api/v1/schedules", {**CRON, "timeout_s": 600}, format="json")

    assert response.status_code == 201, response.content


def test_changing_the_timeout_makes_a_new_version_and_null_restores_the_default(api_a):
    schedule_id = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": 30}, format="json").json()[
        "id"
    ]

    changed = api_a.patch(f"/api/v1/schedules/{schedule_id}", {"timeout_s": 90}, format="json")
    cleared = api_a.patch(f"/api/v1/schedules/{schedule_id}", {"timeout_s": None}, format="json")

    assert changed.status_code == 200, changed.content
    assert changed.json()["schedule"]["version"] == 2
    assert changed.json()["schedule"]["timeout_s"] == 90
    assert cleared.json()["schedule"]["version"] == 3
    assert cleared.json()["schedule"]["timeout_s"] is None
    definitions = ScheduleVersion.objects.filter(schedule_id=schedule_id).order_by("version")
    assert [v.definition["timeout_s"] for v in definitions] == [30, 90, None]


def test_update_above_the_maximum_is_a_400_and_changes_nothing(api_a, tenant_a):
    schedule_id = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": 30}, format="json").json()[
        "id"
    ]
    _limit_tenant(tenant_a, 60)

    response = api_a.patch(f"/api/v1/schedules/{schedule_id}", {"timeout_s": 61}, format="json")

    assert "60" in _timeout_error(response)
    schedule = Schedule.objects.get(id=schedule_id)
    assert (schedule.version, schedule.timeout_s) == (1, 30)


def test_a_timeout_above_a_lowered_maximum_does_not_block_other_changes(api_a, tenant_a):
    # The worker caps it at the new maximum; refusing every edit of the schedule would not help.
    schedule_id = api_a.post("/api/v1/schedules", {**CRON, "timeout_s": 600}, format="json").json()[
        "id"
    ]
    _limit_tenant(tenant_a, 60)

    response = api_a.patch(f"/api/v1/schedules/{schedule_id}", {"payload": {"n": 2}}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["schedule"]["timeout_s"] == 600

"""The schedule form's optional run-time limit: validated like the API, editable, clearable."""

from __future__ import annotations

import pytest

from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

FORM = {
    "name": "export", "kind": "cron", "expression": "0 3 * * *", "time_zone": "UTC",
    "precision": "strict", "misfire_policy": "fire_once", "overlap_policy": "allow",
    "dst_gap": "skip", "dst_fold": "first", "handler": "noop", "payload": "",
}  # fmt: skip


def test_form_creates_a_schedule_with_a_timeout(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/schedules/new/", {**FORM, "timeout_s": "45"})

    assert response.status_code == 302
    assert Schedule.objects.get(tenant=tenant_a).timeout_s == 45


def test_form_refuses_a_timeout_above_the_tenants_maximum(client, alice, tenant_a):
    Tenant.objects.filter(pk=tenant_a.pk).update(max_timeout_s=60)
    client.force_login(alice)

    response = client.post("/schedules/new/", {**FORM, "timeout_s": "61"})

    assert response.status_code == 400
    assert "60" in " ".join(response.context["form"].errors["timeout_s"])
    assert Schedule.objects.count() == 0


def test_edit_form_shows_the_timeout_and_a_blank_field_clears_it(client, alice, tenant_a):
    schedule = make_schedule(
        tenant_a, name="export", expression="0 3 * * *", handler="noop", timeout_s=30
    )
    client.force_login(alice)

    page = client.get(f"/schedules/{schedule.id}/edit/")
    response = client.post(f"/schedules/{schedule.id}/edit/", {**FORM, "timeout_s": ""})

    assert 'name="timeout_s" value="30"' in page.content.decode()
    assert response.status_code == 200
    schedule.refresh_from_db()
    assert (schedule.version, schedule.timeout_s) == (2, None)

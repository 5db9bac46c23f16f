"""Pages that used to answer 500 for malformed input: a malformed path id is a 404, a bad
filter or cursor an inline message; the admin's occurrence browser and the tenant's webhook
ports (docs/decisions.md "No input yields a 5xx", "Webhook ports")."""

from __future__ import annotations

from typing import Any

import pytest
from django.forms.models import model_to_dict

from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(django_user_model: Any) -> Any:
    return django_user_model.objects.create_superuser("root", password="pw-root-123")


@pytest.mark.parametrize(
    "path",
    ["/schedules/not-a-uuid/", "/schedules/not-a-uuid/edit/", "/schedules/9999999999/",
     "/schedules/%E2%98%83/", "/occurrences/not-a-uuid/"],
)  # fmt: skip
def test_a_malformed_id_in_the_path_is_a_404(client, alice, path):
    client.force_login(alice)

    assert client.get(path).status_code == 404


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
def test_a_lifecycle_post_to_a_malformed_id_is_a_404(client, alice, action):
    client.force_login(alice)

    assert client.post(f"/schedules/not-a-uuid/{action}/").status_code == 404


@pytest.mark.parametrize("param", ["from", "to"])
def test_an_impossible_date_in_the_occurrence_filter_is_an_inline_message(client, alice, param):
    client.force_login(alice)

    response = client.get("/occurrences/", {param: "2026-02-30T00:00"})

    assert response.status_code == 200
    assert "Must be a date and time like" in response.content.decode()


def test_a_forged_page_link_on_schedules_is_an_inline_message(client, alice, tenant_a):
    make_schedule(tenant_a)
    client.force_login(alice)

    response = client.get("/schedules/", {"after": "2026-02-30T00:00:00+00:00|x"})

    assert response.status_code == 200
    assert "Invalid or expired page cursor" in response.content.decode()


def test_a_nul_in_a_filter_is_a_400_page(client, alice):
    client.force_login(alice)

    response = client.get("/schedules/?q=abc%00def")

    assert response.status_code == 400
    assert "NUL" in response.content.decode()


def test_the_web_form_names_a_refused_webhook_port_on_the_payload_field(client, alice):
    client.force_login(alice)
    form = {"name": "hook", "kind": "cron", "expression": "*/5 * * * *", "time_zone": "UTC",
            "handler": "webhook", "payload": '{"url": "https://example.com:6379/"}',
            "precision": "strict", "flexible_window_s": "0", "misfire_policy": "fire_once",
            "max_lateness_s": "60", "catchup_limit": "0", "overlap_policy": "allow",
            "dst_gap": "skip", "dst_fold": "first"}  # fmt: skip

    response = client.post("/schedules/new/", form)

    assert response.status_code == 400
    assert "url: port 6379 is not allowed" in str(response.context["form"].errors["payload"])
    assert Schedule.objects.count() == 0


@pytest.mark.parametrize(
    ("query", "says"),
    [("until=2026-02-30T00:00", "until: Must be a date and time"),
     ("before=2026-02-30T00:00", "before: Must be a date and time"),
     ("until=0001-01-01T00:00", "edge of the calendar")],
)  # fmt: skip
def test_the_admin_occurrence_browser_shows_a_bad_instant_inline(client, root, query, says):
    client.force_login(root)

    response = client.get(f"/admin/occurrences/browse/?{query}")

    assert response.status_code == 200
    assert says.lower() in response.content.decode().lower()  # the admin capitalises messages


def _tenant_form(tenant: Tenant, ports: str) -> dict[str, Any]:
    data = {k: v for k, v in model_to_dict(tenant).items() if v is not None and k != "id"}
    return {**data, "webhook_allowed_ports": ports}


def test_webhook_ports_are_edited_in_the_admin(client, root, tenant_a):
    client.force_login(root)
    url = f"/admin/tenants/tenant/{tenant_a.id}/change/"

    response = client.post(url, _tenant_form(tenant_a, "6379,8443"))

    assert response.status_code == 302, response.content.decode()[:2000]
    tenant_a.refresh_from_db()
    assert tenant_a.webhook_allowed_ports == [6379, 8443]


@pytest.mark.parametrize("ports", ["70000", "0", "80,x", "-1"])
def test_the_admin_refuses_a_port_outside_1_to_65535(client, root, tenant_a, ports):
    client.force_login(root)

    response = client.post(
        f"/admin/tenants/tenant/{tenant_a.id}/change/", _tenant_form(tenant_a, ports)
    )

    assert response.status_code == 200  # the form again, with the error
    assert response.context["adminform"].form.errors["webhook_allowed_ports"]
    tenant_a.refresh_from_db()
    assert tenant_a.webhook_allowed_ports == []


_FORM = {"name": "edge", "kind": "cron", "expression": "0 * * * *", "time_zone": "UTC",
         "handler": "record", "precision": "strict", "misfire_policy": "fire_once",
         "overlap_policy": "allow", "dst_gap": "skip", "dst_fold": "first"}  # fmt: skip


@pytest.mark.parametrize("path", ["/schedules/new/", "/schedules/preview/"])
@pytest.mark.parametrize(
    "field, value", [("start_at", "0001-01-01T00:00:00Z"), ("end_at", "9999-12-31T23:59:59Z")]
)
def test_a_year_outside_1970_to_9998_is_an_inline_message_on_its_field(
    client, alice, path, field, value
):
    client.force_login(alice)

    response = client.post(path, {**_FORM, field: value})

    assert response.status_code in (200, 400)
    assert "between the years 1970 and 9998" in response.content.decode()
    assert not Schedule.objects.exists()

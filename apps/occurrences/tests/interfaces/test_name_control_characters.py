"""Control characters are refused in every name and label people type: schedules (API and
web), alert channels, API keys (web and command) and tenants (command and admin); a 400 or
an inline message naming the field, nothing stored (docs/security.md "Names and labels")."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.occurrences.models import AlertChannel
from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.text import CONTROL_CHARACTERS_MESSAGE

pytestmark = pytest.mark.django_db

# A line break inside the name (a trimmed one at either end is only whitespace), a tab, a
# terminal escape, DEL, a C1 control (NEL), a line separator and a right-to-left override.
BAD_NAMES = ["nightly\r\nBcc: evil@example.test", "a\tb", "\x1b[31mred", "a\x7fb", "a\x85b",
             "a\u2028b", "invoice\u202efdp.exe"]  # fmt: skip
CRON = {"kind": "cron", "expression": "0 * * * *", "handler": "record"}


def _fields(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 400, response.content
    return dict(response.json()["error"]["fields"])


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_schedule_name_with_a_control_character_is_a_400_on_name(api_a, tenant_a, name):
    saved = make_schedule(tenant_a, name="kept")

    created = api_a.post("/api/v1/schedules", {**CRON, "name": name}, format="json")
    patched = api_a.patch(f"/api/v1/schedules/{saved.id}", {"name": name}, format="json")

    assert list(_fields(created)) == ["name"]
    assert _fields(patched) == {"name": [CONTROL_CHARACTERS_MESSAGE]}
    assert list(Schedule.objects.values_list("name", flat=True)) == ["kept"]


def test_a_printable_name_in_any_script_is_accepted(api_a):
    response = api_a.post("/api/v1/schedules", {**CRON, "name": "Bericht – 日報 ✓"}, format="json")

    assert response.status_code == 201, response.content


def test_the_web_form_shows_the_refusal_on_the_name(client, alice):
    client.force_login(alice)

    response = client.post(
        "/schedules/new/", {**CRON, "name": "a\x1bb", "time_zone": "UTC", "precision": "strict",
                            "misfire_policy": "fire_once", "overlap_policy": "allow",
                            "dst_gap": "skip", "dst_fold": "first"},
    )  # fmt: skip

    assert response.status_code == 400
    assert "Control characters" in response.content.decode()
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_alert_channel_name_with_a_control_character_is_a_400_on_name(api_a, name):
    body = {"name": name, "kind": "webhook", "target": "https://hooks.example.com/tick"}

    response = api_a.post("/api/v1/alert-channels", body, format="json")

    assert _fields(response) == {"name": [CONTROL_CHARACTERS_MESSAGE]}
    assert not AlertChannel.objects.exists()


def test_a_key_name_with_a_control_character_is_refused_on_the_keys_page(client, alice):
    client.force_login(alice)

    response = client.post("/keys/", {"name": "ci\x1b[2Jbot"}, follow=True)

    assert CONTROL_CHARACTERS_MESSAGE in response.content.decode()
    assert not ApiKey.objects.exists()


def test_the_commands_refuse_a_name_with_a_control_character(tenant_a):
    with pytest.raises(CommandError, match="Control characters"):
        call_command("api_key_create", tenant_a.slug, "--name", "ci\nbot", stdout=StringIO())
    with pytest.raises(CommandError, match="Control characters"):
        call_command("tenant_create", "gamma", "--name", "Gamma\u202e", stdout=StringIO())

    assert not ApiKey.objects.exists()
    assert not Tenant.objects.filter(slug="gamma").exists()


def test_the_admin_refuses_a_tenant_name_with_a_control_character(client, tenant_a, settings):
    from django.contrib.auth import get_user_model

    root = get_user_model().objects.create_superuser("root", password="pw-root-123")
    client.force_login(root)
    page = client.get(f"/admin/tenants/tenant/{tenant_a.id}/change/")
    form = {
        name: value for name, value in page.context["adminform"].form.initial.items()
        if value is not None
    }  # fmt: skip
    form["webhook_allowed_ports"] = ""

    response = client.post(
        f"/admin/tenants/tenant/{tenant_a.id}/change/", {**form, "name": "Alpha\r\nBeta"}
    )

    assert response.status_code == 200
    assert CONTROL_CHARACTERS_MESSAGE in response.content.decode()
    assert Tenant.objects.get(id=tenant_a.id).name == "Alpha"

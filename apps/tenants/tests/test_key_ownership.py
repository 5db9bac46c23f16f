"""API keys belong to someone (docs/security.md "API keys belong to someone"): the member who
made a key is recorded, creation and revocation are in the tenant's log from every surface
(web UI, admin, commands), a member's keys stop working when the member leaves (removed in
the UI, the API or the admin, or the account deleted) and their admin keys when they are
demoted; a tenant holds at most MAX_ACTIVE_API_KEYS active keys."""

from __future__ import annotations

import re
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from apps.tenants.errors import RefusedRequest
from apps.tenants.models import MAX_ACTIVE_API_KEYS, ApiKey, Membership, TenantEvent
from apps.tenants.services import api_key_create, membership_grant

pytestmark = pytest.mark.django_db


def _api(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _web_key(client: Client, name: str = "ci", role: str = "admin") -> str:
    """A key made on the /keys/ page by the signed-in member; its raw value."""
    page = client.post("/keys/", {"name": name, "role": role}).content.decode()
    raw = re.search(r'value="(tick_[^"]+)"', page)
    assert raw, page
    return raw.group(1)


def _events(kind: TenantEvent.Kind) -> list[tuple[str, dict[str, Any]]]:
    return [(e.actor, e.detail) for e in TenantEvent.objects.filter(kind=kind).order_by("id")]


@pytest.fixture
def dora(tenant_a: Any, alice: Any, django_user_model: Any) -> Any:
    """A second admin of A (alice stays, so dora may be removed or demoted)."""
    user = django_user_model.objects.create_user("dora", password="pw-dora-123")
    membership_grant(user=user, tenant=tenant_a, role=Membership.Role.ADMIN)
    return user


def test_a_key_made_in_the_web_ui_records_its_maker_and_is_logged(client, alice):
    client.force_login(alice)

    raw = _web_key(client, "deploy")

    key = ApiKey.objects.get()
    assert key.created_by == alice
    assert _events(TenantEvent.Kind.API_KEY_CREATED) == [
        ("user:alice", {"prefix": key.prefix, "name": "deploy", "role": "admin",
                        "owner": "alice", "expires_at": None}),
    ]  # fmt: skip
    assert _api(raw).get("/api/v1/schedules").status_code == 200


def test_a_revocation_in_the_web_ui_is_logged_once(client, alice):
    client.force_login(alice)
    _web_key(client)
    key = ApiKey.objects.get()

    client.post(f"/keys/{key.id}/revoke/")
    client.post(f"/keys/{key.id}/revoke/")

    assert _events(TenantEvent.Kind.API_KEY_REVOKED) == [
        ("user:alice", {"prefix": key.prefix, "name": "ci"})
    ]


def test_the_commands_log_creation_and_revocation_as_the_operator(tenant_a):
    out = StringIO()
    call_command("api_key_create", tenant_a.slug, "--name", "ops", stdout=out)
    key = ApiKey.objects.get()
    call_command("api_key_revoke", key.prefix, stdout=StringIO())

    assert key.created_by is None
    assert [actor for actor, _ in _events(TenantEvent.Kind.API_KEY_CREATED)] == ["operator"]
    assert _events(TenantEvent.Kind.API_KEY_REVOKED) == [
        ("operator", {"prefix": key.prefix, "name": "ops"})
    ]


def test_a_removed_admins_key_gets_401(client, alice, dora, tenant_a):
    dora_client = Client()
    dora_client.force_login(dora)
    dora_key = _web_key(dora_client, "dora's")
    assert _api(dora_key).get("/api/v1/members").status_code == 200
    client.force_login(alice)
    alice_key = _web_key(client, "alice's")

    dora_member = Membership.objects.get(user=dora)
    assert client.post(f"/members/{dora_member.id}/remove/").status_code == 302

    assert _api(dora_key).get("/api/v1/members").status_code == 401
    invited = _api(dora_key).post(
        "/api/v1/invitations", {"email": "mallory@example.test", "role": "admin"}, format="json"
    )
    assert invited.status_code == 401
    assert _api(alice_key).get("/api/v1/members").status_code == 200  # others' keys stay
    revoked = TenantEvent.objects.get(kind=TenantEvent.Kind.API_KEY_REVOKED)
    assert (revoked.actor, revoked.detail["reason"]) == ("user:alice", "member_removed")


def test_a_member_removed_through_the_api_loses_their_keys(dora, tenant_a):
    _, operator_key = api_key_create(tenant=tenant_a, name="ops", actor="operator")
    _, dora_key = api_key_create(tenant=tenant_a, name="d", actor="user:dora", created_by=dora)
    member = Membership.objects.get(user=dora)

    assert _api(operator_key).delete(f"/api/v1/members/{member.id}").status_code == 204

    assert _api(dora_key).get("/api/v1/schedules").status_code == 401
    assert _api(operator_key).get("/api/v1/schedules").status_code == 200


def test_a_demoted_admin_keeps_viewer_keys_but_loses_admin_keys(client, alice, dora, tenant_a):
    dora_client = Client()
    dora_client.force_login(dora)
    admin_key = _web_key(dora_client, "rw", role="admin")
    viewer_key = _web_key(dora_client, "ro", role="viewer")
    client.force_login(alice)

    client.post(f"/members/{Membership.objects.get(user=dora).id}/role/", {"role": "viewer"})

    assert _api(admin_key).get("/api/v1/members").status_code == 401
    assert _api(viewer_key).get("/api/v1/members").status_code == 200
    revoked = TenantEvent.objects.get(kind=TenantEvent.Kind.API_KEY_REVOKED)
    assert (revoked.detail["name"], revoked.detail["reason"]) == ("rw", "member_demoted")


def test_support_removing_or_demoting_a_member_in_the_admin_revokes_their_keys(
    admin_client, dora, tenant_a
):
    _, rw = api_key_create(tenant=tenant_a, name="rw", actor="t", created_by=dora)
    member = Membership.objects.get(user=dora)

    admin_client.post(
        f"/admin/tenants/membership/{member.id}/change/",
        {"user": dora.id, "tenant": tenant_a.id, "role": "viewer"},
    )
    assert _api(rw).get("/api/v1/schedules").status_code == 401

    _, ro = api_key_create(
        tenant=tenant_a, name="ro", actor="t", created_by=dora, role=Membership.Role.VIEWER
    )
    admin_client.post(f"/admin/tenants/membership/{member.id}/delete/", {"post": "yes"})
    assert not Membership.objects.filter(user=dora).exists()
    assert _api(ro).get("/api/v1/schedules").status_code == 401
    assert {e.actor for e in TenantEvent.objects.filter(kind=TenantEvent.Kind.API_KEY_REVOKED)} == {
        "support:admin"
    }


def test_deleting_the_account_revokes_its_keys(dora, tenant_a):
    _, raw = api_key_create(tenant=tenant_a, name="d", actor="t", created_by=dora)

    get_user_model().objects.filter(pk=dora.pk).delete()

    assert _api(raw).get("/api/v1/schedules").status_code == 401
    assert ApiKey.objects.get().revoked_at is not None


def test_a_tenant_holds_at_most_the_cap_of_active_keys(client, alice, tenant_a):
    for n in range(MAX_ACTIVE_API_KEYS - 1):
        api_key_create(tenant=tenant_a, name=f"k{n}", actor="t")
    expired, _ = api_key_create(tenant=tenant_a, name="last", actor="t")
    client.force_login(alice)

    refused = client.post("/keys/", {"name": "one more"}, follow=True).content.decode()
    with pytest.raises(CommandError, match="active API keys"):
        call_command("api_key_create", tenant_a.slug, stdout=StringIO())

    assert f"already has {MAX_ACTIVE_API_KEYS} active API keys" in refused
    assert ApiKey.objects.count() == MAX_ACTIVE_API_KEYS
    # An expired or revoked key no longer counts.
    ApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now())
    api_key_create(tenant=tenant_a, name="replacement", actor="t")
    with pytest.raises(RefusedRequest):
        api_key_create(tenant=tenant_a, name="and another", actor="t")


def test_demo_setup_replaces_its_previous_key(settings):
    call_command("demo_setup", stdout=StringIO())
    call_command("demo_setup", stdout=StringIO())

    keys = ApiKey.objects.filter(name="make run")
    assert keys.count() == 2
    assert keys.filter(revoked_at__isnull=True).count() == 1

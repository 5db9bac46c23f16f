"""Web UI of tenants: login, tenant switch, API keys, members — with the tenancy trio."""

from __future__ import annotations

import pytest

from apps.tenants.models import ApiKey, Membership
from apps.tenants.services import api_key_create, hash_api_key, membership_grant

pytestmark = pytest.mark.django_db


def test_pages_need_a_login(client):
    response = client.get("/schedules/")

    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_login_with_password_lands_on_the_dashboard(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "pw-alice-123"})

    assert response.status_code == 302
    assert response["Location"] == "/"
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize(
    "target", ["/login/", "/login/?next=/schedules/", "http://testserver/login/"]
)
def test_a_signed_in_person_sent_to_the_login_page_lands_on_the_dashboard(
    client, alice, method, target
):
    client.force_login(alice)

    response = getattr(client, method)(f"/login/?next={target}")

    assert response.status_code == 302
    assert response["Location"] == "/"


def test_a_signed_in_person_with_another_next_goes_there(client, alice):
    client.force_login(alice)

    response = client.get("/login/?next=/schedules/")

    assert response.status_code == 302
    assert response["Location"] == "/schedules/"


def test_csrf_is_enforced_on_posts(alice):
    from django.test import Client

    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)

    assert client.post("/keys/", {"name": "x"}).status_code == 403
    assert ApiKey.objects.count() == 0


def test_user_without_tenant_gets_a_helpful_page(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("dave", password="pw-dave-123"))

    response = client.get("/")

    assert response.status_code == 403
    assert b"not a member of any tenant" in response.content


def test_switcher_lists_only_the_users_tenants_and_switches(client, alice, tenant_a, tenant_b):
    client.force_login(alice)
    page = client.get("/members/").content.decode()
    assert "Alpha" in page and "Bravo" not in page

    # given alice also becomes a viewer of B
    membership_grant(user=alice, tenant=tenant_b, role=Membership.Role.VIEWER)

    response = client.post("/tenant/switch/", {"tenant": str(tenant_b.id), "next": "/members/"})

    assert response.status_code == 302
    assert response["Location"] == "/members/"
    after = client.get("/members/")
    assert after.context["request"].tick.tenant == tenant_b
    assert not after.context["request"].tick.is_admin
    assert [m.user.username for m in after.context["members"]] == ["alice"]


def test_switching_to_a_tenant_one_is_not_member_of_is_404(client, alice, tenant_b):
    client.force_login(alice)

    response = client.post("/tenant/switch/", {"tenant": str(tenant_b.id)})

    assert response.status_code == 404
    assert "tick_tenant_id" not in client.session


def test_admin_creates_a_key_shown_once_and_stored_hashed(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/keys/", {"name": "ci"})

    assert response.status_code == 200
    key = ApiKey.objects.get(tenant=tenant_a)
    raw = response.context["created_raw"]
    assert raw.startswith(key.prefix) and key.key_hash == hash_api_key(raw)
    assert raw in response.content.decode()
    again = client.get("/keys/").content.decode()
    assert raw not in again and key.prefix in again


def test_viewer_cannot_create_or_revoke_keys(client, bob, tenant_a):
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="prod")
    client.force_login(bob)

    page = client.get("/keys/").content.decode()
    assert key.prefix in page and "Revoke" not in page and "Create key" not in page
    assert client.post("/keys/", {"name": "x"}).status_code == 403
    assert client.post(f"/keys/{key.id}/revoke/").status_code == 403
    key.refresh_from_db()
    assert key.revoked_at is None
    assert ApiKey.objects.filter(tenant=tenant_a).count() == 1


def test_admin_revokes_a_key(client, alice, tenant_a):
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="prod")
    client.force_login(alice)

    response = client.post(f"/keys/{key.id}/revoke/")

    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_outsider_cannot_see_or_revoke_another_tenants_key(client, charlie, tenant_a):
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="prod")
    client.force_login(charlie)

    assert key.prefix not in client.get("/keys/").content.decode()
    assert client.post(f"/keys/{key.id}/revoke/").status_code == 404
    key.refresh_from_db()
    assert key.revoked_at is None


def test_members_page_lists_the_tenants_members_only(client, alice, bob, charlie):
    client.force_login(bob)

    response = client.get("/members/")

    names = [m.user.username for m in response.context["members"]]
    assert names == ["alice", "bob"]

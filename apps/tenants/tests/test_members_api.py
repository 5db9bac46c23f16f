"""/api/v1/members and /api/v1/invitations: tenancy (another tenant's id → 404 for every
method), the key's role (viewer → 403), idempotency, the last admin, the one error shape."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client
from rest_framework.test import APIClient

from apps.tenants.members import invitation_create
from apps.tenants.models import Invitation, Membership, TenantEvent
from apps.tenants.services import api_key_create
from apps.tenants.tests.mails import link_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer_api_a(tenant_a):
    _, raw = api_key_create(actor="test", tenant=tenant_a, name="ro", role=Membership.Role.VIEWER)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _open_invitation(tenant, email="x@example.com"):
    return invitation_create(
        tenant=tenant, email=email, role=Membership.Role.VIEWER, actor="t",
        site_url="http://testserver/",
    )  # fmt: skip


def test_list_members_of_the_keys_tenant_only(api_a, alice, bob, charlie):
    response = api_a.get("/api/v1/members")

    assert response.status_code == 200
    assert [(m["username"], m["role"]) for m in response.json()] == [
        ("alice", "admin"), ("bob", "viewer"),
    ]  # fmt: skip


def test_create_invitation_mails_a_link_that_creates_the_member(
    api_a, alice, tenant_a, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = api_a.post(
            "/api/v1/invitations", {"email": "new@example.com", "role": "ADMIN"}, format="json"
        )

    assert response.status_code == 201
    body = response.json()
    assert (body["email"], body["role"], body["state"]) == ("new@example.com", "admin", "pending")
    assert "token" not in str(body) and "token_hash" not in body
    assert mail.outbox[0].body.startswith('An admin of Alpha invites you to the tenant "Alpha"')
    link = link_in(mail.outbox[0].body, r"http://testserver(/invite/\S+/)")
    Client().post(link, {"password1": "Api-new-pw-31", "password2": "Api-new-pw-31"})
    assert Membership.objects.get(user__username="new@example.com").role == Membership.Role.ADMIN
    event = TenantEvent.objects.filter(kind=TenantEvent.Kind.MEMBER_INVITED).get()
    assert event.actor.startswith("api-key:tick_")


def test_create_invitation_is_idempotent_by_key(
    api_a, tenant_a, django_capture_on_commit_callbacks
):
    body = {"email": "idem@example.com", "role": "viewer"}
    with django_capture_on_commit_callbacks(execute=True):
        first = api_a.post("/api/v1/invitations", body, format="json", HTTP_IDEMPOTENCY_KEY="inv-1")
        again = api_a.post("/api/v1/invitations", body, format="json", HTTP_IDEMPOTENCY_KEY="inv-1")
        other = api_a.post(
            "/api/v1/invitations", {**body, "role": "admin"}, format="json",
            HTTP_IDEMPOTENCY_KEY="inv-1",
        )  # fmt: skip

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert Invitation.objects.count() == 1 and len(mail.outbox) == 1
    # without a key, the same body again is a conflict: the address has an open invitation
    dup = api_a.post("/api/v1/invitations", body, format="json")
    assert dup.status_code == 409 and dup.json()["error"]["code"] == "membership_conflict"


def test_invalid_invitation_bodies_name_every_field(api_a):
    response = api_a.post("/api/v1/invitations", {"email": 42, "role": "owner"}, format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and set(error["fields"]) == {"email", "role"}
    assert Invitation.objects.count() == 0


def test_resend_and_revoke(api_a, tenant_a, django_capture_on_commit_callbacks):
    invitation = _open_invitation(tenant_a)
    before = Invitation.objects.get().token_hash

    with django_capture_on_commit_callbacks(execute=True):
        resent = api_a.post(f"/api/v1/invitations/{invitation.id}/resend")
    revoked = api_a.post(f"/api/v1/invitations/{invitation.id}/revoke")
    closed = api_a.post(f"/api/v1/invitations/{invitation.id}/resend")

    assert resent.status_code == 200 and Invitation.objects.get().token_hash != before
    assert len(mail.outbox) == 1
    assert revoked.status_code == 200 and revoked.json()["state"] == "revoked"
    assert closed.status_code == 409 and closed.json()["error"]["code"] == "invitation_closed"


def test_resend_and_revoke_answer_post_only(api_a, tenant_a):
    invitation = _open_invitation(tenant_a)
    before = Invitation.objects.get()

    answers = [api_a.get(f"/api/v1/invitations/{invitation.id}/{action}").status_code
               for action in ("resend", "revoke")]  # fmt: skip

    assert answers == [405, 405]
    after = Invitation.objects.get()
    assert (after.token_hash, after.revoked_at) == (before.token_hash, None)
    assert not mail.outbox


def test_change_role_and_remove_with_the_last_admin_kept(api_a, alice, bob, tenant_a):
    admin = Membership.objects.get(user=alice)
    viewer = Membership.objects.get(user=bob)

    demote = api_a.patch(f"/api/v1/members/{admin.id}", {"role": "viewer"}, format="json")
    remove = api_a.delete(f"/api/v1/members/{admin.id}")
    promote = api_a.patch(f"/api/v1/members/{viewer.id}", {"role": "admin"}, format="json")
    then_demote = api_a.patch(f"/api/v1/members/{admin.id}", {"role": "viewer"}, format="json")
    then_remove = api_a.delete(f"/api/v1/members/{admin.id}")

    assert demote.status_code == 409 and demote.json()["error"]["code"] == "last_admin"
    assert demote.json()["error"]["fields"] == {"role": [demote.json()["error"]["message"]]}
    assert remove.status_code == 409 and remove.json()["error"]["code"] == "last_admin"
    assert promote.status_code == 200 and promote.json()["role"] == "admin"
    assert then_demote.status_code == 200 and then_remove.status_code == 204
    assert list(
        Membership.objects.filter(tenant=tenant_a).values_list("user__username", "role")
    ) == [("bob", "admin")]


def test_a_viewer_key_reads_and_changes_nothing(viewer_api_a, alice, bob, tenant_a):
    invitation = _open_invitation(tenant_a)
    member = Membership.objects.get(user=bob)

    reads = [
        viewer_api_a.get("/api/v1/members"),
        viewer_api_a.get("/api/v1/invitations"),
        viewer_api_a.get(f"/api/v1/invitations/{invitation.id}"),
        viewer_api_a.get(f"/api/v1/members/{member.id}"),
    ]
    writes = [
        viewer_api_a.post("/api/v1/invitations", {"email": "v@example.com"}, format="json"),
        viewer_api_a.post(f"/api/v1/invitations/{invitation.id}/resend"),
        viewer_api_a.post(f"/api/v1/invitations/{invitation.id}/revoke"),
        viewer_api_a.patch(f"/api/v1/members/{member.id}", {"role": "admin"}, format="json"),
        viewer_api_a.delete(f"/api/v1/members/{member.id}"),
    ]

    assert [r.status_code for r in reads] == [200] * 4
    assert (reads[2].json()["email"], reads[2].json()["state"]) == ("x@example.com", "pending")
    assert (reads[3].json()["username"], reads[3].json()["role"]) == ("bob", "viewer")
    assert [r.status_code for r in writes] == [403] * 5
    assert {r.json()["error"]["code"] for r in writes} == {"permission_denied"}
    assert Invitation.objects.count() == 1 and Invitation.objects.get().revoked_at is None
    assert Membership.objects.get(pk=member.pk).role == Membership.Role.VIEWER


def test_another_tenants_ids_are_404_for_every_method(api_b, viewer_api_a, alice, tenant_a):
    invitation = _open_invitation(tenant_a)
    member = Membership.objects.get(user=alice)
    calls = [
        ("get", f"/api/v1/members/{member.id}"),
        ("patch", f"/api/v1/members/{member.id}"),
        ("delete", f"/api/v1/members/{member.id}"),
        ("put", f"/api/v1/members/{member.id}"),
        ("get", f"/api/v1/invitations/{invitation.id}"),
        ("delete", f"/api/v1/invitations/{invitation.id}"),
        ("post", f"/api/v1/invitations/{invitation.id}/resend"),
        ("post", f"/api/v1/invitations/{invitation.id}/revoke"),
        ("get", f"/api/v1/invitations/{invitation.id}/revoke"),
    ]

    for method, path in calls:
        response = getattr(api_b, method)(path, {"role": "viewer"}, format="json")
        assert response.status_code == 404, (method, path, response.status_code)
        assert response.json()["error"]["code"] == "not_found"
    assert api_b.get("/api/v1/members").json() == []
    assert api_b.get("/api/v1/invitations").json() == []
    assert Invitation.objects.get().revoked_at is None
    assert Membership.objects.get(pk=member.pk).role == Membership.Role.ADMIN


def test_unknown_query_parameters_are_refused(api_a):
    response = api_a.get("/api/v1/members?role=admin")

    assert response.status_code == 400 and "role" in response.json()["error"]["fields"]


def test_the_tenant_door_comes_before_the_role(viewer_api_a, tenant_b):
    theirs = _open_invitation(tenant_b)

    response = viewer_api_a.post(f"/api/v1/invitations/{theirs.id}/revoke")

    assert response.status_code == 404  # never 403: B's ids do not exist for A's keys
    assert Invitation.objects.get().revoked_at is None


def test_an_address_too_long_for_a_username_is_refused(api_a):
    local = "a" * 140
    response = api_a.post("/api/v1/invitations", {"email": f"{local}@example.com"}, format="json")

    assert response.status_code == 400 and set(response.json()["error"]["fields"]) == {"email"}
    assert Invitation.objects.count() == 0


def test_an_api_invitation_of_a_look_alike_of_a_member_is_a_409(api_a, alice, bob):
    bob.email = "bob@example.com"
    bob.save(update_fields=["email"])

    response = api_a.post(
        "/api/v1/invitations",
        {"email": "ｂｏｂ@ｅxample.com\u200b", "role": "admin"},
        format="json",
    )

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "membership_conflict"
    assert not Invitation.objects.exists()

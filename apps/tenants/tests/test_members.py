"""Team management in the web UI: invite by e-mail, accept (new or existing account), roles,
removal, the last-admin rule, refused links, the activity log — with the tenancy trio."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.db import connection
from django.test import Client
from django.utils import timezone

from apps.tenants.errors import LastAdminRefused, MembershipConflict
from apps.tenants.members import invitation_create, membership_change_role, membership_remove
from apps.tenants.models import Invitation, Membership, TenantEvent
from apps.tenants.services import membership_grant
from apps.tenants.tests.mails import link_in

pytestmark = pytest.mark.django_db

LINK = r"http://testserver(/invite/[^/\s]+/)"


def _invite(client, capture, email="carol@example.com", role="viewer"):
    with capture(execute=True):
        response = client.post("/members/", {"email": email, "role": role})
    assert response.status_code == 302, response.content
    return link_in(mail.outbox[-1].body, LINK)


def _kinds(tenant):
    return list(
        TenantEvent.objects.filter(tenant=tenant).order_by("id").values_list("kind", flat=True)
    )


def test_invite_accept_and_sign_in_as_the_new_member_with_its_role(
    client, alice, tenant_a, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    link = _invite(client, django_capture_on_commit_callbacks, role="viewer")

    # the mail went to the invited address; the link is stored only as a hash
    assert mail.outbox[-1].to == ["carol@example.com"]
    assert mail.outbox[-1].body.startswith(
        'alice invites you to the tenant "Alpha" on Tick as viewer'
    )
    invitation = Invitation.objects.get(tenant=tenant_a)
    assert link.split("/")[2] not in invitation.token_hash

    # when the invited person opens it signed out and chooses a password
    guest = Client()
    page = guest.get(link)
    assert page.status_code == 200 and b"Create your account" in page.content
    response = guest.post(link, {"password1": "Carol-pw-9931", "password2": "Carol-pw-9931"})

    # then they are signed in, on the tenant, as a viewer
    assert response.status_code == 302 and response["Location"] == "/"
    dashboard = guest.get("/")
    assert dashboard.context["request"].tick.tenant == tenant_a
    assert dashboard.context["request"].tick.role == Membership.Role.VIEWER
    # and can sign in again later with username = e-mail
    fresh = Client()
    signed = fresh.post("/login/", {"username": "carol@example.com", "password": "Carol-pw-9931"})
    assert signed.status_code == 302
    assert fresh.post("/keys/", {"name": "x"}).status_code == 403  # a viewer
    assert _kinds(tenant_a) == [
        TenantEvent.Kind.MEMBER_INVITED,
        TenantEvent.Kind.INVITATION_ACCEPTED,
    ]


def test_an_admin_invitation_gives_the_admin_role(
    client, alice, tenant_a, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    link = _invite(
        client, django_capture_on_commit_callbacks, email="dan@example.com", role="admin"
    )
    guest = Client()
    guest.post(link, {"password1": "Dan-pw-77121", "password2": "Dan-pw-77121"})

    assert Membership.objects.get(tenant=tenant_a, user__username="dan@example.com").role == (
        Membership.Role.ADMIN
    )
    assert guest.post("/keys/", {"name": "from dan"}).status_code == 200


def test_existing_account_signed_in_as_that_user_joins_without_a_new_account(
    client, alice, charlie, tenant_a, django_capture_on_commit_callbacks
):
    charlie.email = "charlie@example.com"
    charlie.save(update_fields=["email"])
    client.force_login(alice)
    link = _invite(client, django_capture_on_commit_callbacks, email="Charlie@Example.com")

    # signed out: the page asks to log in (no second account for the address)
    guest = Client()
    assert b"Log in to accept" in guest.get(link).content
    assert (
        guest.post(link, {"password1": "x-Pw-123456", "password2": "x-Pw-123456"}).status_code
        == 200
    )
    assert get_user_model().objects.filter(email__iexact="charlie@example.com").count() == 1

    # logging in as charlie brings them back, and one click joins
    login = guest.post(
        f"/login/?next={link}", {"username": "charlie", "password": "pw-charlie-123", "next": link}
    )
    assert login["Location"] == link
    response = guest.post(link)
    assert response.status_code == 302
    assert Membership.objects.get(tenant=tenant_a, user=charlie).role == Membership.Role.VIEWER
    assert Membership.objects.filter(user=charlie).count() == 2  # still in bravo too


def test_another_signed_in_account_cannot_take_the_invitation(
    client, alice, bob, tenant_a, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    link = _invite(client, django_capture_on_commit_callbacks, email="erin@example.com")
    other = Client()
    other.force_login(bob)

    page = other.post(link)

    assert page.status_code == 200 and b"this invitation is for erin@example.com" in page.content
    assert Invitation.objects.get().accepted_at is None


def test_a_viewer_cannot_invite_resend_revoke_change_or_remove(client, alice, bob, tenant_a):
    invitation = invitation_create(
        tenant=tenant_a, email="x@example.com", role=Membership.Role.VIEWER, actor="t",
        site_url="http://testserver/",
    )  # fmt: skip
    admin = Membership.objects.get(user=alice)
    client.force_login(bob)

    assert client.post("/members/", {"email": "y@example.com", "role": "admin"}).status_code == 403
    assert client.post(f"/invitations/{invitation.id}/resend/").status_code == 403
    assert client.post(f"/invitations/{invitation.id}/revoke/").status_code == 403
    assert client.post(f"/members/{admin.id}/role/", {"role": "viewer"}).status_code == 403
    assert client.post(f"/members/{admin.id}/remove/").status_code == 403
    page = client.get("/members/").content.decode()
    assert "Send invitation" not in page and "Remove" not in page
    assert Invitation.objects.count() == 1 and Invitation.objects.get().revoked_at is None
    assert Membership.objects.get(pk=admin.pk).role == Membership.Role.ADMIN


def test_the_last_admin_can_be_neither_demoted_nor_removed(client, alice, bob, tenant_a):
    client.force_login(alice)
    me = Membership.objects.get(user=alice)

    demoted = client.post(f"/members/{me.id}/role/", {"role": "viewer"}, follow=True)
    removed = client.post(f"/members/{me.id}/remove/", follow=True)

    assert "last admin" in demoted.content.decode()
    assert "last admin" in removed.content.decode()
    assert Membership.objects.get(pk=me.pk).role == Membership.Role.ADMIN
    # the service refuses too, whatever the page shows
    with pytest.raises(LastAdminRefused):
        membership_change_role(membership=me, role=Membership.Role.VIEWER, actor="t")
    with pytest.raises(LastAdminRefused):
        membership_remove(membership=me, actor="t")
    # with a second admin, the first may step down
    bob_m = Membership.objects.get(user=bob)
    client.post(f"/members/{bob_m.id}/role/", {"role": "admin"})
    client.post(f"/members/{me.id}/role/", {"role": "viewer"})
    assert Membership.objects.get(pk=me.pk).role == Membership.Role.VIEWER
    assert _kinds(tenant_a) == [TenantEvent.Kind.MEMBER_ROLE_CHANGED] * 2


def test_removing_a_member_ends_their_access_to_the_tenant(client, alice, bob, tenant_a):
    client.force_login(alice)
    bob_m = Membership.objects.get(user=bob)

    assert client.post(f"/members/{bob_m.id}/remove/").status_code == 302

    viewer = Client()
    viewer.force_login(bob)
    assert viewer.get("/").status_code == 403  # "not a member of any tenant"
    event = TenantEvent.objects.get(tenant=tenant_a)
    assert (event.kind, event.actor, event.detail["member"]) == (
        TenantEvent.Kind.MEMBER_REMOVED, "user:alice", "bob",
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_two_admins_demoting_each_other_at_once_leave_one_admin(alice, bob, tenant_a):
    membership_grant(user=bob, tenant=tenant_a, role=Membership.Role.ADMIN)
    both = list(Membership.objects.filter(tenant=tenant_a))
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def demote(membership: Membership) -> None:
        try:
            barrier.wait()
            membership_change_role(membership=membership, role=Membership.Role.VIEWER, actor="t")
            outcomes.append("demoted")
        except LastAdminRefused:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=demote, args=(m,)) for m in both]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == ["demoted", "refused"]
    assert Membership.objects.filter(tenant=tenant_a, role=Membership.Role.ADMIN).count() == 1


def test_expired_used_revoked_replaced_and_forged_links_are_refused(
    client, alice, tenant_a, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    guest = Client()
    # used
    used = _invite(client, django_capture_on_commit_callbacks, email="u@example.com")
    guest.post(used, {"password1": "Used-pw-5521", "password2": "Used-pw-5521"})
    again = Client().post(used, {"password1": "Other-pw-5521", "password2": "Other-pw-5521"})
    assert again.status_code == 410 and b"already used" in again.content
    # expired
    expired = _invite(client, django_capture_on_commit_callbacks, email="e@example.com")
    Invitation.objects.filter(email="e@example.com").update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    page = Client().post(expired, {"password1": "Exp-pw-55210", "password2": "Exp-pw-55210"})
    assert page.status_code == 410 and b"expired" in page.content
    # revoked
    revoked = _invite(client, django_capture_on_commit_callbacks, email="r@example.com")
    client.post(f"/invitations/{Invitation.objects.get(email='r@example.com').id}/revoke/")
    assert Client().get(revoked).status_code == 410
    # replaced by a re-send: only the newest link works
    first = _invite(client, django_capture_on_commit_callbacks, email="s@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/invitations/{Invitation.objects.get(email='s@example.com').id}/resend/")
    second = link_in(mail.outbox[-1].body, LINK)
    assert first != second
    assert Client().get(first).status_code == 404
    assert Client().get(second).status_code == 200
    # forged
    assert Client().get("/invite/not-a-real-token-at-all/").status_code == 404

    assert (
        not get_user_model()
        .objects.filter(username__in=["e@example.com", "r@example.com"])
        .exists()
    )
    assert Membership.objects.filter(tenant=tenant_a).count() == 2  # alice + u@


def test_inviting_a_member_or_an_open_address_again_is_refused(
    client, alice, bob, tenant_a, django_capture_on_commit_callbacks
):
    bob.email = "bob@example.com"
    bob.save(update_fields=["email"])
    client.force_login(alice)
    _invite(client, django_capture_on_commit_callbacks, email="f@example.com")

    twice = client.post("/members/", {"email": "F@example.com", "role": "viewer"})
    member = client.post("/members/", {"email": "BOB@example.com", "role": "viewer"})

    assert "already has an open invitation" in twice.content.decode()
    assert "already a member" in member.content.decode()
    assert Invitation.objects.count() == 1


@pytest.mark.parametrize(
    "look_alike",
    ["bob@\uff45xample.com", "bob@example.com\u200b", "\u00adbob@example.com",
     "\ufeffBOB@EXAMPLE.COM", "ｂｏｂ@example.com"],
)  # fmt: skip
def test_a_look_alike_of_a_members_address_is_that_member(client, alice, bob, tenant_a, look_alike):
    bob.email = "bob@example.com"
    bob.save(update_fields=["email"])
    client.force_login(alice)

    response = client.post("/members/", {"email": look_alike, "role": "admin"})

    assert "already a member" in response.content.decode()
    assert not Invitation.objects.exists()


def test_an_invited_address_is_stored_as_it_is_compared(tenant_a):
    invitation = invitation_create(
        tenant=tenant_a, email="ops@\uff45xample.com\u200b", role=Membership.Role.VIEWER,
        actor="t", site_url="http://testserver/",
    )  # fmt: skip

    assert invitation.email == "ops@example.com"
    with pytest.raises(MembershipConflict, match="open invitation"):
        invitation_create(
            tenant=tenant_a, email="OPS@example.com", role=Membership.Role.VIEWER, actor="t",
            site_url="http://testserver/",
        )  # fmt: skip


def test_outsider_ids_are_404_on_every_team_route(client, charlie, alice, tenant_a):
    invitation = invitation_create(
        tenant=tenant_a, email="g@example.com", role=Membership.Role.VIEWER, actor="t",
        site_url="http://testserver/",
    )  # fmt: skip
    member = Membership.objects.get(user=alice)
    client.force_login(charlie)

    assert client.post(f"/invitations/{invitation.id}/resend/").status_code == 404
    assert client.post(f"/invitations/{invitation.id}/revoke/").status_code == 404
    assert client.post(f"/members/{member.id}/role/", {"role": "viewer"}).status_code == 404
    assert client.post(f"/members/{member.id}/remove/").status_code == 404
    assert client.post("/members/junk/remove/").status_code == 404
    assert Invitation.objects.get().revoked_at is None
    assert Membership.objects.filter(tenant=tenant_a).count() == 1


def test_activity_page_shows_who_did_what_when(
    client, alice, bob, tenant_a, tenant_b, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    _invite(client, django_capture_on_commit_callbacks, email="h@example.com", role="admin")
    bob_m = Membership.objects.get(user=bob)
    client.post(f"/members/{bob_m.id}/role/", {"role": "admin"})
    TenantEvent.objects.create(
        tenant=tenant_b, kind=TenantEvent.Kind.MEMBER_REMOVED, actor="user:zed", at=timezone.now()
    )

    page = client.get("/activity/").content.decode()

    assert page.index("Member role changed") < page.index("Member invited")  # newest first
    assert "user:alice" in page and "h@example.com" in page and "previous role: viewer" in page
    assert "user:zed" not in page  # another tenant's log
    viewer = Client()
    viewer.force_login(bob)
    assert viewer.get("/activity/").status_code == 200  # every member may read it


def test_support_sees_invitations_read_only_without_the_token_hash(admin_client, tenant_a):
    invitation = invitation_create(
        tenant=tenant_a, email="support-view@example.com", role=Membership.Role.VIEWER,
        actor="t", site_url="http://testserver/",
    )  # fmt: skip

    listing = admin_client.get("/admin/tenants/invitation/")
    detail = admin_client.get(f"/admin/tenants/invitation/{invitation.id}/change/")

    assert listing.status_code == 200 and "support-view@example.com" in listing.content.decode()
    assert detail.status_code == 200
    assert invitation.token_hash not in detail.content.decode()
    assert (
        admin_client.post(f"/admin/tenants/invitation/{invitation.id}/change/", {}).status_code
        == 403
    )

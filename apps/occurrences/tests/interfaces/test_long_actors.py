"""Every event log keeps the whole actor, however long the name behind it may be: a member
whose username has the 150 characters Django allows changes schedules, starts a bulk change,
creates a key, invites and signs out everywhere from the web pages; staff with such a name
pause from the admin; an invited address of 150 characters accepts; an alert address as long
as an address may be confirms. Each works, and each log names the actor in full
(docs/decisions.md "One bound for actor strings")."""

from __future__ import annotations

import pytest
from django.core import mail
from django.test import Client

from apps.occurrences.bulk_changes import bulk_work_all
from apps.occurrences.models import AlertChannel, BulkChange
from apps.occurrences.tests.support.rows import schedule
from apps.schedules.models import Schedule, ScheduleEvent
from apps.tenants.models import Invitation, Membership, TenantEvent
from apps.tenants.services import membership_grant
from apps.tenants.tests.mails import link_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]

# Django's username column holds 150 characters; this one uses them all.
LONGEST_USERNAME = "m" * 138 + "@example.com"
# An address within RFC 5321's limits (64-character local part, 63-character labels).
LONG_ADDRESS = "o" * 64 + "@" + "d" * 63 + "." + "e" * 63 + ".example.com"

FORM = {
    "name": "nightly report", "kind": "cron", "expression": "0 9 * * *", "time_zone": "UTC",
    "precision": "strict", "misfire_policy": "fire_once", "overlap_policy": "allow",
    "dst_gap": "skip", "dst_fold": "first", "handler": "record", "payload": "{}",
}  # fmt: skip


@pytest.fixture
def longest(tenant_a, django_user_model):
    user = django_user_model.objects.create_user(LONGEST_USERNAME, password="pw-long-123")
    membership_grant(user=user, tenant=tenant_a, role=Membership.Role.ADMIN)
    return user


def test_the_longest_username_edits_and_pauses_a_schedule_and_is_logged_whole(
    client, longest, tenant_a
):
    assert len(LONGEST_USERNAME) == 150
    sched = schedule(tenant_a, expression="0 9 * * *")
    client.force_login(longest)

    edited = client.post(f"/schedules/{sched.id}/edit/", {**FORM, "expression": "0 10 * * *"})
    paused = client.post(f"/schedules/{sched.id}/pause/")

    assert edited.status_code == 200 and edited.context["receipt"].action == "updated"
    assert paused.status_code == 200 and paused.context["receipt"].action == "paused"
    sched.refresh_from_db()
    assert (sched.version, sched.expression, sched.state) == (2, "0 10 * * *", "PAUSED")
    events = ScheduleEvent.objects.filter(schedule=sched).order_by("at", "id")
    assert [(e.kind, e.actor) for e in events][1:] == [
        ("updated", f"user:{LONGEST_USERNAME}"), ("paused", f"user:{LONGEST_USERNAME}"),
    ]  # fmt: skip


def test_the_longest_username_starts_a_bulk_change(client, longest, tenant_a):
    chosen = [schedule(tenant_a, name=f"s{i}") for i in range(2)]
    client.force_login(longest)

    form = {"action": "pause", "scope": "selected", "ids": [str(s.id) for s in chosen]}
    started = client.post("/bulk/", {**form, "start": "1"})
    bulk_work_all(owner="test")

    job = BulkChange.objects.get()
    assert started.status_code == 302 and started["Location"] == f"/bulk/{job.id}/"
    assert job.actor == f"user:{LONGEST_USERNAME}"
    assert set(Schedule.objects.values_list("state", flat=True)) == {Schedule.State.PAUSED}
    assert set(ScheduleEvent.objects.filter(kind="paused").values_list("actor", flat=True)) == {
        f"user:{LONGEST_USERNAME}"
    }


def test_the_longest_username_creates_a_key_invites_and_signs_out_everywhere(
    client, longest, tenant_a, django_capture_on_commit_callbacks
):
    client.force_login(longest)

    keyed = client.post("/keys/", {"name": "ci"})
    with django_capture_on_commit_callbacks(execute=True):
        invited = client.post("/members/", {"email": "carol@example.com", "role": "viewer"})
    signed_out = client.post("/account/sessions/revoke/")

    assert keyed.status_code == 200 and keyed.context["created_raw"]
    assert invited.status_code == 302 and mail.outbox[-1].to == ["carol@example.com"]
    assert signed_out.status_code == 302
    assert Invitation.objects.get().invited_by == f"user:{LONGEST_USERNAME}"
    logged = TenantEvent.objects.filter(tenant=tenant_a).order_by("id")
    assert [(e.kind, e.actor) for e in logged] == [
        (TenantEvent.Kind.API_KEY_CREATED, f"user:{LONGEST_USERNAME}"),
        (TenantEvent.Kind.MEMBER_INVITED, f"user:{LONGEST_USERNAME}"),
        (TenantEvent.Kind.SESSIONS_REVOKED, f"user:{LONGEST_USERNAME}"),
    ]


def test_staff_with_the_longest_username_pause_from_the_admin(client, tenant_a, django_user_model):
    staff = django_user_model.objects.create_superuser(LONGEST_USERNAME, password="pw-root-123")
    sched = schedule(tenant_a)
    client.force_login(staff)

    response = client.post(
        "/admin/schedules/schedule/", {"action": "pause", "_selected_action": [str(sched.id)]}
    )

    assert response.status_code == 302
    sched.refresh_from_db()
    assert sched.state == Schedule.State.PAUSED
    event = ScheduleEvent.objects.get(schedule=sched, kind="paused")
    assert event.actor == f"support:{LONGEST_USERNAME}"


def test_an_invited_address_of_150_characters_accepts_and_is_logged_whole(
    client, alice, tenant_a, django_capture_on_commit_callbacks
):
    client.force_login(alice)
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/members/", {"email": LONGEST_USERNAME, "role": "viewer"})
    link = link_in(mail.outbox[-1].body, r"http://testserver(/invite/[^/\s]+/)")

    guest = Client()
    accepted = guest.post(link, {"password1": "Long-pw-9931", "password2": "Long-pw-9931"})

    assert accepted.status_code == 302 and accepted["Location"] == "/"
    assert Membership.objects.filter(tenant=tenant_a, user__username=LONGEST_USERNAME).exists()
    event = TenantEvent.objects.get(kind=TenantEvent.Kind.INVITATION_ACCEPTED)
    assert event.actor == f"user:{LONGEST_USERNAME}"


def test_a_long_alert_address_confirms_and_is_logged_whole(
    api_a, tenant_a, settings, django_capture_on_commit_callbacks
):
    settings.TICK_PUBLIC_URL = "http://127.0.0.1:8000"
    assert len(LONG_ADDRESS) == 204
    body = {"name": "ops", "kind": "email", "target": LONG_ADDRESS}
    with django_capture_on_commit_callbacks(execute=True):
        created = api_a.post("/api/v1/alert-channels", body, format="json")
    assert created.status_code == 201, created.content
    link = link_in(mail.outbox[-1].body, r"http://127\.0\.0\.1:8000(/alerts/confirm/\S+/)")

    confirmed = Client().post(link)

    assert "Alerts confirmed" in confirmed.content.decode()
    assert AlertChannel.objects.get().confirmed_at is not None
    event = TenantEvent.objects.filter(kind=TenantEvent.Kind.ALERT_CHANNEL_CHANGED).latest("id")
    assert (event.detail["action"], event.actor) == ("confirmed", f"email:{LONG_ADDRESS}")

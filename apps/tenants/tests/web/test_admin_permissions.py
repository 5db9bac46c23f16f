"""Support staff in the Django admin (docs/security.md "Admin permissions" and "Event log"):
actions need the matching permission (a view-only user gets 403 and nothing changes), API-key
revocation is one-way and an expiry only shortens, and every support action is in an event
log with the staff user."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db.models import QuerySet
from django.test import Client
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.tests.support.rows import occurrence, schedule, state_of
from apps.schedules.models import Schedule, ScheduleEvent
from apps.tenants.models import ApiKey, Membership, Tenant, TenantEvent
from apps.tenants.services import api_key_create

SCHEDULES = "/admin/schedules/schedule/"
KEYS = "/admin/tenants/apikey/"

pytestmark = pytest.mark.django_db


def _staff(django_user_model: Any, username: str, *codenames: str) -> Client:
    user = django_user_model.objects.create_user(username, password="pw-staff-123", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    return _staff(django_user_model, "vera", "view_schedule", "view_apikey", "view_tenant",
                  "view_tenantevent", "view_dispatchoutbox")  # fmt: skip


@pytest.fixture
def support(django_user_model: Any) -> Client:
    return _staff(django_user_model, "sam", "view_schedule", "change_schedule", "view_apikey",
                  "change_apikey", "view_tenant", "change_tenant", "view_tenantevent",
                  "view_dispatchoutbox", "change_dispatchoutbox")  # fmt: skip


def _act(client: Client, url: str, action: str, *pks: Any) -> Any:
    return client.post(url, {"action": action, "_selected_action": [str(pk) for pk in pks],
                             "index": "0"})  # fmt: skip


def test_every_tick_admin_action_declares_a_permission() -> None:
    apps = {"tenants", "schedules", "occurrences"}
    unguarded = []
    for model, model_admin in admin.site._registry.items():
        if model._meta.app_label not in apps:
            continue
        for name in model_admin.actions or []:
            found = model_admin.get_action(name)
            assert found is not None, name
            if not getattr(found[0], "allowed_permissions", None):
                unguarded.append(f"{model.__name__}.{found[1]}")
    assert unguarded == []


@pytest.mark.parametrize("action", ["pause", "resume", "cancel"])
def test_view_only_staff_get_403_on_schedule_actions(viewer: Client, tenant_a: Tenant,
                                                     action: str) -> None:  # fmt: skip
    sched = schedule(tenant_a, name="nightly")
    if action == "resume":
        Schedule.objects.filter(pk=sched.pk).update(state=Schedule.State.PAUSED)
    before = Schedule.objects.get(pk=sched.pk).state

    response = _act(viewer, SCHEDULES, action, sched.pk)

    assert response.status_code == 403
    assert Schedule.objects.get(pk=sched.pk).state == before
    assert not ScheduleEvent.objects.filter(schedule=sched, actor__startswith="support:").exists()
    # the list itself stays readable, without the actions
    page = viewer.get(SCHEDULES)
    assert page.status_code == 200 and b'value="pause"' not in page.content


def test_staff_with_change_permission_run_schedule_actions_logged_as_them(
    support: Client, tenant_a: Tenant
) -> None:
    sched = schedule(tenant_a, name="nightly")

    assert _act(support, SCHEDULES, "pause", sched.pk).status_code == 302
    assert Schedule.objects.get(pk=sched.pk).state == Schedule.State.PAUSED
    assert _act(support, SCHEDULES, "resume", sched.pk).status_code == 302
    assert _act(support, SCHEDULES, "cancel", sched.pk).status_code == 302

    assert Schedule.objects.get(pk=sched.pk).state == Schedule.State.CANCELED
    events = list(ScheduleEvent.objects.filter(schedule=sched, actor="support:sam")
                  .order_by("at", "id").values_list("kind", flat=True))  # fmt: skip
    assert events == [ScheduleEvent.Kind.PAUSED, ScheduleEvent.Kind.RESUMED,
                      ScheduleEvent.Kind.CANCELED]  # fmt: skip


def _support_events() -> QuerySet[TenantEvent]:
    """The log without the setup's own `api_key_created` events."""
    return TenantEvent.objects.exclude(kind=TenantEvent.Kind.API_KEY_CREATED)


def test_view_only_staff_cannot_revoke_keys_or_replay(viewer: Client, tenant_a: Tenant) -> None:
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="ci")
    dead = occurrence(schedule(tenant_a), timezone.now() - timedelta(minutes=5),
                      state=Occurrence.State.DEAD)  # fmt: skip

    assert _act(viewer, KEYS, "revoke", key.pk).status_code == 403
    assert (
        viewer.post("/admin/occurrences/browse/replay/", {"ids": [str(dead.id)]}).status_code == 403
    )

    assert ApiKey.objects.get(pk=key.pk).revoked_at is None
    assert state_of(dead) == Occurrence.State.DEAD
    assert not _support_events().exists()


def test_a_support_replay_is_logged_in_the_tenants_event_log(
    support: Client, tenant_a: Tenant
) -> None:
    dead = occurrence(schedule(tenant_a), timezone.now() - timedelta(minutes=5),
                      state=Occurrence.State.DEAD)  # fmt: skip

    response = support.post("/admin/occurrences/browse/replay/", {"ids": [str(dead.id)]})

    assert response.status_code == 302
    assert state_of(dead) != Occurrence.State.DEAD
    event = TenantEvent.objects.get(tenant=tenant_a)
    assert event.kind == TenantEvent.Kind.OCCURRENCES_REPLAYED
    assert event.actor == "support:sam" and event.detail["occurrences"] == [str(dead.id)]


def test_revoke_action_is_logged_once_per_key(support: Client, tenant_a: Tenant) -> None:
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="ci")

    assert _act(support, KEYS, "revoke", key.pk).status_code == 302
    assert _act(support, KEYS, "revoke", key.pk).status_code == 302  # already revoked

    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    events = list(_support_events().filter(tenant=tenant_a))
    assert [(e.kind, e.actor, e.detail["prefix"]) for e in events] == [
        (TenantEvent.Kind.API_KEY_REVOKED, "support:sam", key.prefix)
    ]


def _key_form(key: ApiKey, expires_at: str, revoked_at: str = "") -> dict[str, str]:
    return {"expires_at_0": expires_at[:10], "expires_at_1": expires_at[11:19],
            "revoked_at_0": revoked_at[:10], "revoked_at_1": revoked_at[11:19]}  # fmt: skip


def test_a_revoked_key_cannot_be_unrevoked_in_the_form(support: Client, tenant_a: Tenant) -> None:
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="ci")
    revoked_at = timezone.now().replace(microsecond=0)
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=revoked_at)
    url = f"{KEYS}{key.pk}/change/"

    page = support.get(url).content.decode()
    response = support.post(url, _key_form(key, "", ""))

    assert 'name="revoked_at' not in page  # shown, not editable
    assert response.status_code == 302
    assert ApiKey.objects.get(pk=key.pk).revoked_at == revoked_at


def test_an_expiry_can_only_be_brought_forward(support: Client, tenant_a: Tenant) -> None:
    expires = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    key, _ = api_key_create(actor="test", tenant=tenant_a, name="ci", expires_at=expires)
    url = f"{KEYS}{key.pk}/change/"

    later = support.post(url, _key_form(key, (expires + timedelta(days=1)).isoformat()))
    cleared = support.post(url, _key_form(key, ""))

    assert later.status_code == 200
    assert "An expiry can only be brought forward" in later.content.decode()
    assert cleared.status_code == 200
    assert "can only be brought forward, not removed" in cleared.content.decode()
    assert ApiKey.objects.get(pk=key.pk).expires_at == expires
    assert not _support_events().exists()

    sooner = expires - timedelta(days=20)
    assert support.post(url, _key_form(key, sooner.isoformat())).status_code == 302
    assert ApiKey.objects.get(pk=key.pk).expires_at == sooner
    event = _support_events().get(tenant=tenant_a)
    assert (event.kind, event.actor) == (TenantEvent.Kind.API_KEY_EXPIRY_SHORTENED, "support:sam")
    assert event.detail["previous"] == expires.isoformat()


def test_quota_changes_are_logged_and_shown_on_the_tenant(support: Client, viewer: Client,
                                                          tenant_a: Tenant) -> None:  # fmt: skip
    url = f"/admin/tenants/tenant/{tenant_a.pk}/change/"
    form = {f: getattr(tenant_a, f) for f in (
        "slug", "name", "max_active_schedules", "trigger_rate_per_s", "max_running",
        "catchup_rate_per_s", "min_interval_s", "api_rate_per_min", "retry_budget_per_hour",
        "max_timeout_s", "max_labels_per_schedule", "pause_after_dead")}  # fmt: skip

    assert support.post(url, {**form, "max_running": 7}).status_code == 302
    assert viewer.post(url, {**form, "max_running": 9}).status_code == 403

    event = TenantEvent.objects.get(tenant=tenant_a)
    assert (event.kind, event.actor) == (TenantEvent.Kind.SETTINGS_CHANGED, "support:sam")
    assert event.detail == {"changes": {"max_running": [100, 7]}}
    page = viewer.get(url).content.decode()
    assert "Settings changed" in page and "support:sam" in page
    assert (
        "support:sam"
        in viewer.get(
            f"/admin/tenants/tenantevent/?tenant__id__exact={tenant_a.pk}"
        ).content.decode()
    )


def test_the_tenant_event_log_is_read_only_in_the_admin(django_user_model: Any,
                                                        tenant_a: Tenant) -> None:  # fmt: skip
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client = Client()
    client.force_login(root)
    event = TenantEvent.objects.create(tenant=tenant_a, kind=TenantEvent.Kind.SETTINGS_CHANGED,
                                       actor="support:sam", at=timezone.now())  # fmt: skip
    url = f"/admin/tenants/tenantevent/{event.pk}/"

    assert client.get("/admin/tenants/tenantevent/add/").status_code == 403
    assert client.post(f"{url}change/", {"actor": "someone"}).status_code == 403
    assert client.post(f"{url}delete/", {"post": "yes"}).status_code == 403
    assert TenantEvent.objects.get(pk=event.pk).actor == "support:sam"


def test_membership_changes_in_the_admin_are_logged(django_user_model: Any, alice: Any,
                                                    tenant_a: Tenant) -> None:  # fmt: skip
    support = _staff(django_user_model, "sam", "view_membership", "change_membership",
                     "delete_membership")  # fmt: skip
    membership = Membership.objects.get(user=alice, tenant=tenant_a)
    url = f"/admin/tenants/membership/{membership.pk}/"

    changed = support.post(f"{url}change/", {"user": alice.pk, "tenant": tenant_a.pk,
                                            "role": Membership.Role.VIEWER})  # fmt: skip
    removed = support.post(f"{url}delete/", {"post": "yes"})

    assert (changed.status_code, removed.status_code) == (302, 302)
    assert not Membership.objects.filter(pk=membership.pk).exists()
    log = [(e.kind, e.actor, e.detail) for e in TenantEvent.objects.filter(tenant=tenant_a)]
    assert log == [
        (TenantEvent.Kind.MEMBER_ROLE_CHANGED, "support:sam",
         {"user": "alice", "role": [Membership.Role.ADMIN, Membership.Role.VIEWER]}),
        (TenantEvent.Kind.MEMBER_REMOVED, "support:sam",
         {"user": "alice", "role": Membership.Role.VIEWER}),
    ]  # fmt: skip

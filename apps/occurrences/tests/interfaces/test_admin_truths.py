"""The admin says only what is so (docs/ui.md "Django admin"): the occurrence browser is not
"read-only" for staff who can replay and counts a small range exactly; a schedule's inlines
offer no "Add another" and its page one "Save", for the labels only; a paused schedule has no
next run; a tenant offers no Delete that always fails."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.schedule_changes import schedule_pause
from apps.occurrences.tests.support.rows import occurrence, schedule
from apps.schedules.models import Schedule, ScheduleEvent

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]


@pytest.fixture
def root(client, django_user_model):
    user = django_user_model.objects.create_superuser("root", password="pw-root-123")
    client.force_login(user)
    return user


def test_the_occurrence_browser_counts_a_small_range_and_says_it_can_replay(client, root, tenant_a):
    sched = schedule(tenant_a)
    now = timezone.now()
    for minutes in range(5):
        occurrence(sched, now - timedelta(minutes=minutes + 1), state=Occurrence.State.DEAD)

    page = client.get("/admin/occurrences/browse/").content.decode()

    count = re.search(r'<p id="row-count">(.*?)</p>', page, re.S)
    assert count is not None and count.group(1).endswith("· 5 rows")
    assert "planner estimate" not in page and "read-only" not in page
    assert "Replay selected DEAD occurrences" in page


def test_a_paused_schedules_admin_page_shows_no_next_run_nor_add(client, root, tenant_a):
    sched = schedule(tenant_a, name="hourly")
    schedule_pause(schedule=sched, actor="user:alice")
    next_at = sched.next_run_at
    assert next_at is not None

    page = client.get(f"/admin/schedules/schedule/{sched.id}/change/").content.decode()
    listed = client.get("/admin/schedules/schedule/").content.decode()

    field = re.search(r'class="form-row field-next_run">(.*?)</div>\s*</div>', page, re.S)
    assert field is not None and "none (paused)" in field.group(1)
    assert next_at.strftime("%Y-%m-%d %H:%M") not in field.group(1)
    assert "none (paused)" in listed
    # the admin's script draws "Add another" only below an inline's maximum
    assert re.findall(r'name="(\w+)-MAX_NUM_FORMS" value="(\d+)"', page) == [
        ("versions", "0"),
        ("events", "0"),
    ]
    assert 'name="_continue"' not in page and 'name="_addanother"' not in page


def test_the_admin_edits_labels_through_the_service_with_the_apis_rules(client, root, tenant_a):
    from apps.schedules.models import ScheduleEvent

    sched = schedule(tenant_a, name="hourly")
    url = f"/admin/schedules/schedule/{sched.id}/change/"

    inlines = {f"{name}-{part}": "0" for name in ("versions", "events")
               for part in ("TOTAL_FORMS", "INITIAL_FORMS")}  # fmt: skip
    refused = client.post(url, {**inlines, "labels": '{"Bad Key": "1"}'})
    saved = client.post(url, {**inlines, "labels": '{"customer": "42"}'})

    assert refused.status_code == 200 and "lower-case" in refused.content.decode()
    assert saved.status_code == 302
    sched.refresh_from_db()
    assert sched.labels == {"customer": "42"} and sched.version == 1
    event = ScheduleEvent.objects.filter(schedule=sched).order_by("-id")[0]
    assert event.actor == "support:root" and event.detail["labels"] == [{}, {"customer": "42"}]


def test_a_tenant_offers_no_delete(client, root, tenant_a):
    page = client.get(f"/admin/tenants/tenant/{tenant_a.id}/change/").content.decode()

    assert "deletelink" not in page
    assert client.get(f"/admin/tenants/tenant/{tenant_a.id}/delete/").status_code == 403


def test_the_tenant_page_counts_schedules_and_running_occurrences(client, root, tenant_a):
    # The counts need the higher apps: apps/occurrences/admin.py registers them over the
    # tenants app's own admin.
    sched = schedule(tenant_a)
    occurrence(sched, timezone.now() - timedelta(minutes=1), state=Occurrence.State.RUNNING)

    page = client.get(f"/admin/tenants/tenant/{tenant_a.pk}/change/").content.decode()

    assert "Active + paused schedules" in page
    assert f"1 / {tenant_a.max_active_schedules}" in page
    assert "Running occurrences (last 2 days)" in page
    assert f"1 / {tenant_a.max_running}" in page


def test_the_schedule_list_pauses_through_the_lifecycle_service(client, root, tenant_a):
    sched = schedule(tenant_a)

    client.post(
        "/admin/schedules/schedule/",
        {"action": "pause", "_selected_action": [str(sched.pk)]},
    )

    sched.refresh_from_db()
    assert sched.state == Schedule.State.PAUSED
    assert sched.events.filter(kind=ScheduleEvent.Kind.PAUSED).count() == 1

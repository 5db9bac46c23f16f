"""The schedule list's select-many action: a dry-run count first, then the bulk change and
its progress page with the receipt; viewers see no checkboxes and are refused."""

from __future__ import annotations

import pytest

from apps.occurrences.bulk_changes import bulk_work_all
from apps.occurrences.models import BulkChange
from apps.occurrences.tests.support.rows import schedule
from apps.schedules.models import Schedule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]


def test_selected_schedules_are_counted_then_paused_with_a_receipt(client, alice, tenant_a):
    chosen = [schedule(tenant_a, name=f"s{i}") for i in range(3)]
    Schedule.objects.filter(pk=chosen[0].pk).update(state=Schedule.State.CANCELED)
    client.force_login(alice)
    listed = client.get("/schedules/").content.decode()
    assert 'name="ids"' in listed and "Count first" in listed

    form = {"action": "pause", "scope": "selected", "ids": [str(s.id) for s in chosen]}
    confirm = client.post("/bulk/", form)
    page = confirm.content.decode()
    assert confirm.status_code == 200
    assert '<strong id="dry-change">2</strong>' in page
    assert '<strong id="dry-refuse">1</strong>' in page
    assert not BulkChange.objects.exists()

    started = client.post("/bulk/", {**form, "start": "1"})
    job = BulkChange.objects.get()
    assert started.status_code == 302 and started["Location"] == f"/bulk/{job.id}/"
    running = client.get(started["Location"]).content.decode()
    assert 'http-equiv="refresh"' in running

    bulk_work_all(owner="test")
    done = client.get(started["Location"]).content.decode()
    assert '<dd id="bulk-changed">2</dd>' in done and '<dd id="bulk-refused">1</dd>' in done
    assert 'http-equiv="refresh"' not in done and str(chosen[0].id) in done


def test_every_schedule_matching_the_filters(client, alice, tenant_a):
    for i in range(2):
        schedule(tenant_a, name=f"c42-{i}", labels={"customer": "42"})
    schedule(tenant_a, name="c7", labels={"customer": "7"})
    client.force_login(alice)

    form = {"action": "cancel", "scope": "filter", "label": ["customer=42", ""], "start": "1"}
    client.post("/bulk/", form)
    bulk_work_all(owner="test")

    assert set(Schedule.objects.filter(state=Schedule.State.CANCELED)
               .values_list("name", flat=True)) == {"c42-0", "c42-1"}  # fmt: skip


def test_a_viewer_sees_no_bulk_action_and_is_refused(client, bob, tenant_a):
    sched = schedule(tenant_a)
    client.force_login(bob)

    assert 'name="ids"' not in client.get("/schedules/").content.decode()
    response = client.post("/bulk/", {"action": "pause", "scope": "selected", "ids": [sched.id]})

    assert response.status_code == 403
    assert not BulkChange.objects.exists()


def test_another_tenants_bulk_change_is_a_404(client, alice, tenant_b):
    job = BulkChange.objects.create(tenant=tenant_b, verb="pause", actor="x", selection={})
    client.force_login(alice)

    assert client.get(f"/bulk/{job.id}/").status_code == 404

"""Bulk changes (POST /api/v1/schedules/bulk): dry run, one receipt per verb, the single verb's
events, idempotent repeat, viewer refusal, quota refusal, another tenant's ids a 404, and a
worker killed mid-bulk whose job is resumed with a receipt that adds up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from django.db import connection

from apps.occurrences.bulk_changes import bulk_step, bulk_work_all
from apps.occurrences.models import BulkChange, Occurrence
from apps.occurrences.tests.support.rows import schedule
from apps.schedules.models import Schedule, ScheduleEvent
from apps.tenants.models import ApiKey, Membership, Tenant

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("partitions_around_today")]

URL = "/api/v1/schedules/bulk"


def _tagged(tenant: Tenant, n: int, **labels: str) -> list[Schedule]:
    return [schedule(tenant, name=f"s{i}", labels=labels) for i in range(n)]


def _post(api: Any, body: dict[str, Any], **headers: str) -> Any:
    return api.post(URL, body, format="json", **headers)


def test_dry_run_counts_and_writes_nothing(api_a, tenant_a):
    sched = _tagged(tenant_a, 3, customer="42")
    _tagged(tenant_a, 2, customer="7")
    Schedule.objects.filter(pk=sched[0].pk).update(state=Schedule.State.PAUSED)
    Schedule.objects.filter(pk=sched[1].pk).update(state=Schedule.State.CANCELED)

    response = _post(api_a, {"action": "pause", "filter": {"label": ["customer=42"]},
                              "dry_run": True})  # fmt: skip

    assert response.status_code == 200, response.content
    assert response.json() == {"action": "pause", "dry_run": True, "matched": 3, "change": 1,
                               "already": 1, "refuse": 1}  # fmt: skip
    assert not BulkChange.objects.exists()


@pytest.mark.parametrize(
    ("action", "event"),
    [("pause", ScheduleEvent.Kind.PAUSED), ("cancel", ScheduleEvent.Kind.CANCELED)],
)
def test_a_bulk_change_gives_one_receipt_and_each_schedule_the_single_verbs_event(
    api_a, tenant_a, action, event
):
    chosen = _tagged(tenant_a, 5, customer="42")
    other = schedule(tenant_a, name="other", labels={"customer": "7"})
    Schedule.objects.filter(pk=chosen[0].pk).update(state=Schedule.State.CANCELED)

    started = _post(api_a, {"action": action, "filter": {"label": ["customer=42"]}})
    assert started.status_code == 202, started.content
    job = started.json()
    assert job["state"] == "RUNNING" and job["matched"] == 5

    while bulk_step(owner="test", batch=2):
        pass
    receipt = api_a.get(f"{URL}/{job['id']}").json()

    assert receipt["state"] == "DONE"
    assert receipt["changed"] + receipt["already"] + receipt["refused"] == 5 == receipt["done"]
    if action == "pause":
        assert (receipt["changed"], receipt["already"], receipt["refused"]) == (4, 0, 1)
        assert receipt["refusals"][0]["id"] == str(chosen[0].id)
        assert receipt["refusals"][0]["code"] == "state_conflict"
    else:
        assert (receipt["changed"], receipt["already"], receipt["refused"]) == (4, 1, 0)
    for sched in chosen[1:]:
        mine = ScheduleEvent.objects.filter(schedule=sched, kind=event)
        assert mine.get().actor.startswith("api-key:")
    other.refresh_from_db()
    assert other.state == Schedule.State.ACTIVE


def test_bulk_resume_and_run_now_by_ids(api_a, tenant_a):
    chosen = _tagged(tenant_a, 3)
    ids = [str(s.id) for s in chosen]
    _post(api_a, {"action": "pause", "ids": ids})
    bulk_work_all(owner="test")
    assert set(Schedule.objects.values_list("state", flat=True)) == {Schedule.State.PAUSED}

    _post(api_a, {"action": "resume", "ids": ids})
    _post(api_a, {"action": "run_now", "ids": ids[:2]})
    bulk_work_all(owner="test")

    assert set(Schedule.objects.values_list("state", flat=True)) == {Schedule.State.ACTIVE}
    resumed, ran = BulkChange.objects.order_by("created_at")[1:]
    assert (resumed.changed, ran.changed) == (3, 2)
    assert Occurrence.objects.filter(origin=Occurrence.Origin.MANUAL).count() == 2


def test_an_idempotency_key_answers_the_first_bulk_change(api_a, tenant_a):
    ids = [str(s.id) for s in _tagged(tenant_a, 2)]
    body = {"action": "pause", "ids": ids}

    first = _post(api_a, body, HTTP_IDEMPOTENCY_KEY="k1")
    again = _post(api_a, body, HTTP_IDEMPOTENCY_KEY="k1")
    other = _post(api_a, {**body, "action": "cancel"}, HTTP_IDEMPOTENCY_KEY="k1")

    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true"
    assert other.status_code == 409
    assert BulkChange.objects.count() == 1


def test_a_viewer_key_is_refused(api_a, tenant_a):
    ids = [str(s.id) for s in _tagged(tenant_a, 1)]
    ApiKey.objects.filter(tenant=tenant_a).update(role=Membership.Role.VIEWER)

    response = _post(api_a, {"action": "pause", "ids": ids})

    assert response.status_code == 403
    assert not BulkChange.objects.exists()


def test_another_tenants_id_is_a_404(api_a, tenant_a, tenant_b):
    mine = schedule(tenant_a)
    theirs = schedule(tenant_b)

    response = _post(api_a, {"action": "cancel", "ids": [str(mine.id), str(theirs.id)]})
    job = BulkChange.objects.create(tenant=tenant_b, verb="pause", actor="x", selection={})

    assert response.status_code == 404
    assert api_a.get(f"{URL}/{job.id}").status_code == 404
    theirs.refresh_from_db()
    assert theirs.state == Schedule.State.ACTIVE


def test_a_resume_over_a_lowered_quota_is_refused(api_a, tenant_a):
    ids = [str(s.id) for s in _tagged(tenant_a, 3)]
    Schedule.objects.update(state=Schedule.State.PAUSED)
    Tenant.objects.filter(pk=tenant_a.pk).update(max_active_schedules=2)

    response = _post(api_a, {"action": "resume", "ids": ids})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "quota_exceeded"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "pause"}, "non_field_errors"),
        ({"action": "pause", "ids": [], "filter": {}}, "ids"),
        ({"action": "explode", "filter": {}}, "action"),
        ({"action": "pause", "filter": {"label": ["nokey"]}}, "filter.label"),
        ({"action": "pause", "filter": {"colour": "red"}}, "filter.colour"),
        ({"action": "pause", "filter": {}, "dry_run": "yes"}, "dry_run"),
    ],
)
def test_bad_bodies_are_400s_naming_the_field(api_a, body, field):
    response = _post(api_a, body)

    assert response.status_code == 400, response.content
    assert field in response.json()["error"]["fields"], response.json()


def _worker(database: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DATABASE_URL": database, "TICK_BULK_BATCH": "5",
           "TICK_BULK_LEASE_S": "2"}  # fmt: skip
    return subprocess.Popen(  # noqa: S603
        [sys.executable, "manage.py", "bulk", "--idle-sleep", "0.2"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_bulk_is_resumed_and_the_receipt_adds_up(api_a, tenant_a):
    chosen = _tagged(tenant_a, 60, customer="42")
    job_id = _post(api_a, {"action": "pause", "filter": {"label": ["customer=42"]}}).json()["id"]
    settings_dict = connection.settings_dict
    database = (
        f"postgres://{settings_dict['USER']}@{settings_dict['HOST']}:{settings_dict['PORT']}/"
        f"{settings_dict['NAME']}"
    )

    first = _worker(database)
    deadline = time.monotonic() + 60
    while BulkChange.objects.get(id=job_id).changed < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    midway = BulkChange.objects.get(id=job_id)
    assert 10 <= midway.changed < 60 and midway.state == BulkChange.State.RUNNING

    second = _worker(database)
    try:
        while (
            BulkChange.objects.get(id=job_id).state != BulkChange.State.DONE
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
    finally:
        second.terminate()
        second.wait()

    job = BulkChange.objects.get(id=job_id)
    assert job.state == BulkChange.State.DONE
    assert (job.changed, job.already, job.refused) == (60, 0, 0)
    assert Schedule.objects.filter(state=Schedule.State.PAUSED).count() == len(chosen)
    # Each schedule paused exactly once: one event each, none twice.
    assert ScheduleEvent.objects.filter(kind=ScheduleEvent.Kind.PAUSED).count() == 60

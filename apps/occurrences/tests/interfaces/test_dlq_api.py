"""The DLQ through the API: list DEAD, inspect attempts, replay one or many, cancel; tenant 404s."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.occurrences.models import DispatchOutbox, Lane
from apps.occurrences.tests.support.rows import dead_occurrence, occurrence, schedule, state_of

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]


def test_dead_list_shows_only_the_tenants_dead_occurrences(api_a, tenant_a, tenant_b):
    dead = dead_occurrence(tenant_a)
    occurrence(schedule(tenant_a), timezone.now(), state="SUCCEEDED")
    dead_occurrence(tenant_b)

    response = api_a.get("/api/v1/occurrences/dead")

    assert response.status_code == 200
    assert [o["id"] for o in response.json()["results"]] == [str(dead.id)]
    by_filter = api_a.get("/api/v1/occurrences", {"state": "DEAD"}).json()["results"]
    assert [o["id"] for o in by_filter] == [str(dead.id)]


def test_dead_occurrence_detail_shows_every_attempt_with_its_error(api_a, tenant_a):
    dead = dead_occurrence(tenant_a, error="webhook answered HTTP 404: nope")

    body = api_a.get(f"/api/v1/occurrences/{dead.id}").json()

    assert body["state"] == "DEAD"
    assert [(a["attempt_no"], a["outcome"], a["error_class"], a["error_message"])
            for a in body["attempts"]] == [
        (1, "FAILED", "PermanentError", "webhook answered HTTP 404: nope")
    ]  # fmt: skip


def test_replay_one_keeps_the_id_and_queues_a_retry(api_a, tenant_a):
    dead = dead_occurrence(tenant_a)

    response = api_a.post(f"/api/v1/occurrences/{dead.id}/replay")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["id"], body["state"], body["attempt_base"]) == (str(dead.id), "RETRY_WAIT", 1)
    row = DispatchOutbox.objects.get(occurrence_id=dead.id)
    assert (row.lane, row.scheduled_for) == (Lane.RETRY, dead.scheduled_for)


def test_replay_of_a_non_dead_occurrence_is_409_and_changes_nothing(api_a, tenant_a):
    done = occurrence(schedule(tenant_a), timezone.now(), state="SUCCEEDED")

    response = api_a.post(f"/api/v1/occurrences/{done.id}/replay")

    assert response.status_code == 409
    assert response.json() == {
        "error": {
            "code": "not_dead",
            "message": "Only DEAD occurrences can be replayed; this one is SUCCEEDED.",
            "fields": {},
        }
    }
    assert state_of(done) == "SUCCEEDED" and not DispatchOutbox.objects.exists()


def test_outsider_replaying_or_canceling_gets_404_and_nothing_changes(api_b, tenant_a):
    dead = dead_occurrence(tenant_a)
    pending = occurrence(schedule(tenant_a), timezone.now())

    assert api_b.post(f"/api/v1/occurrences/{dead.id}/replay").status_code == 404
    assert api_b.post(f"/api/v1/occurrences/{pending.id}/cancel").status_code == 404
    bulk = api_b.post("/api/v1/occurrences/replay", {"ids": [str(dead.id)]}, format="json")

    assert bulk.status_code == 200
    assert bulk.json() == {"replayed": [], "not_dead": {}, "not_found": [str(dead.id)]}
    assert (state_of(dead), state_of(pending)) == ("DEAD", "ENQUEUED")
    assert not DispatchOutbox.objects.exists()


def test_bulk_replay_reports_each_id(api_a, tenant_a, tenant_b):
    dead = [dead_occurrence(tenant_a, minutes_ago=m) for m in (1, 2, 3)]
    done = occurrence(schedule(tenant_a), timezone.now(), state="SUCCEEDED")
    foreign = dead_occurrence(tenant_b)
    ids = [str(o.id) for o in [*dead, done, foreign]]

    response = api_a.post("/api/v1/occurrences/replay", {"ids": ids}, format="json")

    assert response.status_code == 200
    assert response.json() == {
        "replayed": [str(o.id) for o in dead],
        "not_dead": {str(done.id): "SUCCEEDED"},
        "not_found": [str(foreign.id)],
    }
    assert [state_of(o) for o in dead] == ["RETRY_WAIT"] * 3
    assert DispatchOutbox.objects.filter(lane=Lane.RETRY).count() == 3
    assert state_of(foreign) == "DEAD"


@pytest.mark.parametrize(
    ("body", "field"), [({}, "ids"), ({"ids": []}, "ids"), ({"ids": ["not-a-uuid"]}, "ids.0")]
)
def test_bulk_replay_validates_its_body(api_a, body, field):
    response = api_a.post("/api/v1/occurrences/replay", body, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_cancel_pending_is_final_and_cancel_finished_is_409(api_a, tenant_a):
    pending = occurrence(schedule(tenant_a), timezone.now())

    assert api_a.post(f"/api/v1/occurrences/{pending.id}/cancel").json() == {"state": "CANCELED"}
    again = api_a.post(f"/api/v1/occurrences/{pending.id}/cancel")

    assert again.status_code == 409
    assert again.json()["error"] == {
        "code": "already_finished",
        "message": "The occurrence already finished (CANCELED).",
        "fields": {},
    }


def test_cancel_running_asks_the_handler_to_stop(api_a, tenant_a):
    running = occurrence(schedule(tenant_a), timezone.now(), state="RUNNING")

    response = api_a.post(f"/api/v1/occurrences/{running.id}/cancel")

    assert response.status_code == 202
    assert response.json() == {"state": "RUNNING", "cancel_requested": True}
    running.refresh_from_db()
    assert running.cancel_requested_at is not None

"""Occurrence lists read only their documented query parameters, take enum filters in any
letter case (API and web pages), and write every instant in UTC with `Z` (docs/api.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.selectors import parse_occurrence_filter
from apps.occurrences.tests.support.instants import instants, not_in_z
from apps.occurrences.tests.support.rows import attempt_started, dead_occurrence, occurrence
from apps.occurrences.tests.support.rows import schedule as make_schedule

pytestmark = pytest.mark.django_db

LISTS = ("/api/v1/occurrences", "/api/v1/occurrences/dead")


def test_schedule_id_is_a_400_naming_it_not_an_unfiltered_list(api_a, tenant_a):
    mine = make_schedule(tenant_a)
    occurrence(make_schedule(tenant_a), timezone.now() - timedelta(minutes=1))

    for path in LISTS:
        response = api_a.get(path, {"schedule_id": str(mine.id)})

        assert response.status_code == 400
        error = response.json()["error"]
        assert error["code"] == "invalid"
        assert list(error["fields"]) == ["schedule_id"]
        assert "schedule" in error["fields"]["schedule_id"][0]


def test_every_unknown_parameter_is_named_with_the_bad_known_ones(api_a):
    response = api_a.get("/api/v1/occurrences", {"lane": "strict", "limit": 5, "state": "zzz"})

    assert response.status_code == 400
    assert sorted(response.json()["error"]["fields"]) == ["lane", "limit", "state"]


def test_documented_parameters_are_accepted(api_a, tenant_a):
    sched = make_schedule(tenant_a)
    occurrence(sched, timezone.now() - timedelta(minutes=1), state=Occurrence.State.SUCCEEDED)

    response = api_a.get(
        "/api/v1/occurrences",
        {"schedule": str(sched.id), "state": "SUCCEEDED", "from": "2000-01-01T00:00:00Z",
         "to": "2100-01-01T00:00:00Z", "cursor": "", "page_size": 10},
    )  # fmt: skip

    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == 1


@pytest.mark.parametrize("state", ["succeeded", "Succeeded", "SUCCEEDED"])
def test_the_state_filter_takes_any_case(api_a, tenant_a, state):
    sched = make_schedule(tenant_a)
    now = timezone.now()
    done = occurrence(sched, now - timedelta(minutes=2), state=Occurrence.State.SUCCEEDED)
    occurrence(sched, now - timedelta(minutes=1), state=Occurrence.State.ENQUEUED)
    dead_occurrence(tenant_a)

    response = api_a.get("/api/v1/occurrences", {"state": state})

    assert response.status_code == 200, response.content
    assert [o["id"] for o in response.json()["results"]] == [str(done.id)]


def test_the_dead_list_takes_its_state_in_any_case(api_a, tenant_a):
    dead = dead_occurrence(tenant_a)

    response = api_a.get("/api/v1/occurrences/dead", {"state": "dead"})

    assert response.status_code == 200, response.content
    assert [o["id"] for o in response.json()["results"]] == [str(dead.id)]


def test_the_parser_names_the_state_through_the_enum():
    assert parse_occurrence_filter({"state": "retry_wait"}).state is Occurrence.State.RETRY_WAIT


def test_the_web_list_filters_by_a_lower_case_state(client, alice, tenant_a):
    sched = make_schedule(tenant_a)
    now = timezone.now()
    done = occurrence(sched, now - timedelta(minutes=2), state=Occurrence.State.SUCCEEDED)
    occurrence(sched, now - timedelta(minutes=1), state=Occurrence.State.ENQUEUED)
    client.force_login(alice)

    for state in ("succeeded", "SUCCEEDED"):
        response = client.get("/occurrences/", {"state": state})

        assert response.status_code == 200
        assert response.context["errors"] == []
        assert [row["occ"].id for row in response.context["occurrences"]] == [done.id]


def test_timestamps_of_an_occurrence_end_in_z(api_a, tenant_a):
    sched = make_schedule(tenant_a)
    started = timezone.now().replace(microsecond=123456)
    occ = occurrence(sched, started - timedelta(minutes=1), state=Occurrence.State.SUCCEEDED)
    Occurrence.objects.filter(id=occ.id).update(enqueued_at=started, finished_at=started)
    attempt_started(occ, started)

    listed = api_a.get("/api/v1/occurrences").json()
    detail = api_a.get(f"/api/v1/occurrences/{occ.id}").json()

    assert detail["enqueued_at"] == started.isoformat().replace("+00:00", "Z")
    assert detail["attempts"][0]["started_at"].endswith(".123456Z")
    for body in (listed, detail):
        assert len(list(instants(body))) >= 5
        assert not_in_z(body) == []

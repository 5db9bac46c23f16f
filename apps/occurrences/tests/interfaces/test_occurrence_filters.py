"""The one parser of occurrence list filters (apps/occurrences/selectors.py) and how the API
(400, the error shape) and the web pages (a message, nothing listed) report bad ones."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.occurrences.models import Occurrence
from apps.occurrences.selectors import (
    OccurrenceFilter,
    OccurrenceFilterError,
    parse_occurrence_filter,
)
from apps.occurrences.tests.support.rows import dead_occurrence, occurrence, schedule

SCHEDULE = uuid.UUID("12345678-1234-5678-1234-567812345678")


def test_parse_reads_every_filter():
    params = {"schedule": f" {SCHEDULE} ", "state": "DEAD", "from": "2026-03-08T09:30:00+01:00",
              "to": "2026-03-09T00:00:00Z"}  # fmt: skip

    assert parse_occurrence_filter(params) == OccurrenceFilter(
        schedule_id=SCHEDULE,
        state=Occurrence.State.DEAD,
        since=datetime(2026, 3, 8, 8, 30, tzinfo=UTC),
        until=datetime(2026, 3, 9, tzinfo=UTC),
    )
    assert parse_occurrence_filter({"state": "", "from": ""}) == OccurrenceFilter()


def test_parse_takes_a_naive_instant_as_utc_only_when_asked():
    with pytest.raises(OccurrenceFilterError) as err:
        parse_occurrence_filter({"from": "2026-03-08T09:30"})
    assert list(err.value.errors) == ["from"]

    parsed = parse_occurrence_filter({"from": "2026-03-08T09:30"}, naive_as_utc=True)
    assert parsed.since == datetime(2026, 3, 8, 9, 30, tzinfo=UTC)


def test_parse_names_every_bad_filter_at_once():
    with pytest.raises(OccurrenceFilterError) as err:
        parse_occurrence_filter(
            {"schedule": "nope", "state": "deceased", "from": "2026-02-30T00:00:00Z", "to": "soon"}
        )

    assert err.value.errors == {
        "schedule": "Must be a schedule id (UUID).",
        "state": f"Must be one of {', '.join(Occurrence.State.values)}.",
        "from": "Must be a date and time like 2026-03-08T09:30:00Z.",
        "to": "Must be a date and time like 2026-03-08T09:30:00Z.",
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query, field",
    [("from=2026-02-30T00:00:00Z", "from"), ("to=2026-03-08T09:30", "to"),
     ("state=deceased", "state"), ("schedule=x", "schedule")],
)  # fmt: skip
def test_api_answers_400_naming_the_bad_filter(api_a, query, field):
    for path in ("/api/v1/occurrences", "/api/v1/occurrences/dead"):
        response = api_a.get(f"{path}?{query}")

        assert response.status_code == 400
        assert response.json()["error"]["code"] == "invalid"
        assert list(response.json()["error"]["fields"]) == [field]


@pytest.mark.django_db
def test_dead_list_with_another_state_filter_lists_nothing(api_a, tenant_a):
    dead = dead_occurrence(tenant_a)

    assert api_a.get("/api/v1/occurrences/dead?state=SUCCEEDED").json()["results"] == []
    assert [
        o["id"] for o in api_a.get("/api/v1/occurrences/dead?state=DEAD").json()["results"]
    ] == [str(dead.id)]


@pytest.mark.django_db
def test_web_list_shows_the_message_for_an_impossible_date(client, alice, tenant_a):
    occurrence(schedule(tenant_a), timezone.now() - timedelta(minutes=3), state="SUCCEEDED")
    client.force_login(alice)

    response = client.get("/occurrences/", {"from": "2026-02-30T00:00", "state": "DEAD"})

    assert response.status_code == 200
    assert response.context["occurrences"] == []
    assert response.context["errors"] == [
        "From: Must be a date and time like 2026-03-08T09:30 (UTC)."
    ]
    assert response.context["from_value"] == "2026-02-30T00:00"


@pytest.mark.django_db
def test_dlq_page_with_a_forged_cursor_says_so(client, alice, tenant_a):
    dead_occurrence(tenant_a)
    client.force_login(alice)

    response = client.get("/dlq/", {"after": "bm90IGEgY3Vyc29y"})

    assert response.status_code == 200
    assert response.context["occurrences"] == []
    assert response.context["errors"] == [
        "Invalid or expired page cursor; start again from the first page."
    ]

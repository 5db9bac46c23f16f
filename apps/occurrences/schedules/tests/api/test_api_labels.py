"""Schedule labels: validated per field, counted against the tenant's quota, set on create and
update without a new version, filtered by `?label=key=value` (several = AND) together with the
other filters, on keyset pages."""

from __future__ import annotations

import pytest

from apps.schedules.models import Schedule, ScheduleEvent
from apps.schedules.tests.factories import make_schedule
from apps.tenants.models import Tenant

pytestmark = pytest.mark.django_db

CRON = {
    "name": "report",
    "kind": "cron",
    "expression": "0 3 * * *",
    "time_zone": "UTC",
    "handler": "noop",
}


def _fields(response) -> dict[str, list[str]]:
    assert response.status_code == 400, response.content
    fields: dict[str, list[str]] = response.json()["error"]["fields"]
    return fields


def test_labels_are_set_on_create_and_read_back(api_a):
    created = api_a.post(
        "/api/v1/schedules", {**CRON, "labels": {"customer": "42", "env": "prod"}}, format="json"
    )

    assert created.status_code == 201, created.content
    assert created.json()["labels"] == {"customer": "42", "env": "prod"}
    again = api_a.get(f"/api/v1/schedules/{created.json()['id']}").json()
    assert again["labels"] == {"customer": "42", "env": "prod"}
    assert api_a.post("/api/v1/schedules", CRON, format="json").json()["labels"] == {}


@pytest.mark.parametrize(
    ("labels", "field"),
    [
        ({"Customer": "42"}, "labels.Customer"),
        ({"-x": "1"}, "labels.-x"),
        ({"k" * 64: "1"}, "labels." + "k" * 64),
        ({"customer": ""}, "labels.customer"),
        ({"customer": "x" * 101}, "labels.customer"),
        ({"customer": "a\nb"}, "labels.customer"),
        ({"customer": 42}, "labels.customer"),
        (["customer=42"], "labels"),
    ],
)
def test_a_bad_label_is_a_400_naming_it(api_a, labels, field):
    response = api_a.post("/api/v1/schedules", {**CRON, "labels": labels}, format="json")

    assert field in _fields(response), response.json()
    assert Schedule.objects.count() == 0


def test_more_labels_than_the_tenant_allows_is_a_400_naming_the_quota(api_a, tenant_a):
    Tenant.objects.filter(pk=tenant_a.pk).update(max_labels_per_schedule=2)
    labels = {"a": "1", "b": "2", "c": "3"}

    refused = api_a.post("/api/v1/schedules", {**CRON, "labels": labels}, format="json")
    accepted = api_a.post(
        "/api/v1/schedules", {**CRON, "labels": {"a": "1", "b": "2"}}, format="json"
    )

    assert "at most 2" in " ".join(_fields(refused)["labels"])
    assert accepted.status_code == 201


def test_a_label_change_makes_no_version_and_is_logged(api_a, tenant_a):
    schedule = make_schedule(tenant_a, labels={"customer": "42"})

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}", {"labels": {"customer": "43"}}, format="json"
    )

    assert response.status_code == 200, response.content
    body = response.json()["schedule"]
    assert body["labels"] == {"customer": "43"} and body["version"] == 1
    event = ScheduleEvent.objects.filter(schedule=schedule).order_by("-id")[0]
    assert event.kind == ScheduleEvent.Kind.UPDATED
    assert event.detail["labels"] == [{"customer": "42"}, {"customer": "43"}]


def test_labels_ride_along_a_definition_change(api_a, tenant_a):
    schedule = make_schedule(tenant_a, labels={"customer": "42"})

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}",
        {"expression": "0 4 * * *", "labels": {"customer": "42", "tier": "gold"}},
        format="json",
    )

    body = response.json()["schedule"]
    assert body["version"] == 2 and body["labels"] == {"customer": "42", "tier": "gold"}
    # A PATCH without labels keeps them.
    kept = api_a.patch(f"/api/v1/schedules/{schedule.id}", {"name": "renamed"}, format="json")
    assert kept.json()["schedule"]["labels"] == {"customer": "42", "tier": "gold"}


def test_label_filters_are_anded_and_combine_with_other_filters(api_a, tenant_a, tenant_b):
    both = make_schedule(tenant_a, name="both", labels={"customer": "42", "env": "prod"})
    make_schedule(tenant_a, name="one", labels={"customer": "42", "env": "test"})
    make_schedule(tenant_a, name="other", labels={"customer": "7", "env": "prod"})
    make_schedule(tenant_b, name="theirs", labels={"customer": "42", "env": "prod"})
    paused = make_schedule(tenant_a, name="paused", labels={"customer": "42", "env": "prod"})
    Schedule.objects.filter(pk=paused.pk).update(state=Schedule.State.PAUSED)

    def names(query: str) -> set[str]:
        response = api_a.get(f"/api/v1/schedules?{query}")
        assert response.status_code == 200, response.content
        return {row["name"] for row in response.json()["results"]}

    assert names("label=customer=42") == {"both", "one", "paused"}
    assert names("label=customer=42&label=env=prod") == {"both", "paused"}
    assert names("label=customer=42&label=env=prod&state=active") == {both.name}
    assert names("label=customer=42&q=bot") == {"both"}
    assert names("label=customer=999") == set()


def test_a_value_may_hold_an_equals_sign(api_a, tenant_a):
    make_schedule(tenant_a, name="eq", labels={"query": "a=b"})

    response = api_a.get("/api/v1/schedules?label=query=a=b")

    assert [row["name"] for row in response.json()["results"]] == ["eq"]


@pytest.mark.parametrize("text", ["customer", "Customer=42", "customer="])
def test_a_bad_label_filter_is_a_400(api_a, text):
    assert "label" in _fields(api_a.get(f"/api/v1/schedules?label={text}"))


def test_label_filtered_pages_follow_the_cursor(api_a, tenant_a):
    for n in range(5):
        make_schedule(tenant_a, name=f"s{n}", labels={"group": "g"})
    make_schedule(tenant_a, name="outside", labels={"group": "h"})

    seen, url = [], "/api/v1/schedules?label=group=g&page_size=2"
    while url:
        body = api_a.get(url).json()
        seen += [row["name"] for row in body["results"]]
        url = body["next"]

    assert sorted(seen) == [f"s{n}" for n in range(5)] and len(seen) == 5

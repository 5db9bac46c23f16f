"""Labels on the web pages: the form sets them (one key=value per line, the API's rules),
the list and detail show them, and the list filters by them with the other filters."""

from __future__ import annotations

import pytest

from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

FORM = {
    "name": "export", "kind": "cron", "expression": "0 3 * * *", "time_zone": "UTC",
    "precision": "strict", "misfire_policy": "fire_once", "overlap_policy": "allow",
    "dst_gap": "skip", "dst_fold": "first", "handler": "noop", "payload": "",
}  # fmt: skip


def test_form_sets_labels_one_per_line(client, alice, tenant_a):
    client.force_login(alice)

    response = client.post("/schedules/new/", {**FORM, "labels": "customer=42\n\nenv = prod\n"})

    assert response.status_code == 302
    assert Schedule.objects.get(tenant=tenant_a).labels == {"customer": "42", "env": "prod"}


@pytest.mark.parametrize(
    ("text", "words"), [("customer", "key=value"), ("Customer=42", "lower-case"),
                        ("a=1\na=2", "twice")],
)  # fmt: skip
def test_form_refuses_bad_labels_on_the_field(client, alice, text, words):
    client.force_login(alice)

    response = client.post("/schedules/new/", {**FORM, "labels": text})

    assert response.status_code == 400
    assert words in " ".join(response.context["form"].errors["labels"])
    assert Schedule.objects.count() == 0


def test_edit_form_shows_and_changes_labels(client, alice, tenant_a):
    schedule = make_schedule(tenant_a, labels={"customer": "42", "env": "prod"})
    client.force_login(alice)

    page = client.get(f"/schedules/{schedule.id}/edit/")
    assert "customer=42\nenv=prod" in page.content.decode()

    client.post(f"/schedules/{schedule.id}/edit/", {
        **FORM, "name": schedule.name, "expression": schedule.expression, "handler": "record",
        "labels": "customer=43",
    })  # fmt: skip
    schedule.refresh_from_db()
    assert schedule.labels == {"customer": "43"} and schedule.version == 1


def test_list_and_detail_show_labels_and_the_list_filters_by_them(client, bob, tenant_a):
    tagged = make_schedule(tenant_a, name="tagged", labels={"customer": "42", "env": "prod"})
    make_schedule(tenant_a, name="untagged")
    make_schedule(tenant_a, name="test env", labels={"customer": "42", "env": "test"})
    client.force_login(bob)

    listed = client.get("/schedules/?label=customer%3D42&label=env%3Dprod&label=")
    names = [s.name for s in listed.context["schedules"]]
    assert names == ["tagged"]
    assert "customer=42" in listed.content.decode()
    assert 'value="env=prod"' in listed.content.decode()

    detail = client.get(f"/schedules/{tagged.id}/").content.decode()
    assert "?label=customer%3D42" in detail


def test_a_bad_label_filter_is_a_message_not_an_error(client, bob):
    client.force_login(bob)

    response = client.get("/schedules/?label=nokey")

    assert response.status_code == 200
    assert "key=value" in response.content.decode()

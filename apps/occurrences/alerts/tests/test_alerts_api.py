"""Alerts through the API: channels and rules (create, read, change, delete), the field
errors of the domain's validation as 400s, another tenant's ids as 404s, the test alert and
the history with each alert's delivery state."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.occurrences.alerts.dispatch import group_pending
from apps.occurrences.alerts.tests.support import channel, rule
from apps.occurrences.models import Alert, AlertChannel, AlertDelivery, AlertEvent, AlertRule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/tick"


def _fields(response) -> dict[str, list[str]]:
    assert response.status_code == 400, response.content
    fields: dict[str, list[str]] = response.json()["error"]["fields"]
    return fields


def test_channel_crud(api_a, tenant_a):
    created = api_a.post(
        "/api/v1/alert-channels",
        {"name": "on-call", "kind": "webhook", "target": HOOK},
        format="json",
    )
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["name"], body["kind"], body["target"], body["enabled"]) == (
        "on-call", "webhook", HOOK, True,
    )  # fmt: skip
    url = f"/api/v1/alert-channels/{body['id']}"

    assert [c["id"] for c in api_a.get("/api/v1/alert-channels").json()] == [body["id"]]
    assert api_a.get(url).json()["target"] == HOOK

    patched = api_a.patch(url, {"enabled": False, "name": "pager"}, format="json")
    assert patched.status_code == 200, patched.content
    saved = AlertChannel.objects.get(id=body["id"])
    assert (saved.name, saved.enabled, saved.target) == ("pager", False, HOOK)

    assert api_a.delete(url).status_code == 204
    assert not AlertChannel.objects.filter(id=body["id"]).exists()
    assert api_a.get(url).status_code == 404


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"name": "ops", "kind": "email", "target": "not-an-address"}, "target", "e-mail"),
        ({"name": "ops", "kind": "webhook", "target": "http://10.0.0.5/hook"}, "target", ""),
        ({"name": "ops", "kind": "webhook", "target": "http://127.0.0.1:9/x"}, "target", ""),
        ({"name": "ops", "kind": "sms", "target": "+331234"}, "kind", ""),
        ({"name": "", "kind": "email", "target": "ops@example.com"}, "name", ""),
        ({"name": "ops", "kind": "email", "target": "ops@example.com", "tenant": "x"},
         "tenant", "server"),
        ({"name": "ops", "kind": "email", "target": "ops@example.com", "colour": 1},
         "colour", "Unknown"),
    ],
)  # fmt: skip
def test_channel_create_refuses_bad_input_by_field(api_a, tenant_a, body, field, fragment):
    fields = _fields(api_a.post("/api/v1/alert-channels", body, format="json"))

    assert field in fields
    assert fragment in " ".join(fields[field])
    assert not AlertChannel.objects.exists()


def test_channel_patch_validates_the_whole_channel(api_a, tenant_a):
    ch = channel(tenant_a, "ops@example.com")

    fields = _fields(
        api_a.patch(f"/api/v1/alert-channels/{ch.id}", {"kind": "webhook"}, format="json")
    )

    assert "target" in fields  # an e-mail address is no webhook URL
    ch.refresh_from_db()
    assert ch.kind == AlertChannel.Kind.EMAIL


def test_rule_crud(api_a, tenant_a):
    ch = channel(tenant_a, "ops@example.com")
    job = make_schedule(tenant_a, name="nightly")

    created = api_a.post("/api/v1/alert-rules", {
        "channel_id": str(ch.id), "event": "start_lag", "schedule_id": str(job.id),
        "threshold_s": 30, "window_minutes": 3,
    }, format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["event"], body["schedule_id"], body["threshold_s"], body["window_minutes"]) == (
        "start_lag", str(job.id), 30, 3,
    )  # fmt: skip
    url = f"/api/v1/alert-rules/{body['id']}"
    assert [r["id"] for r in api_a.get("/api/v1/alert-rules").json()] == [body["id"]]

    # Another event: the lag fields must go with it.
    refused = _fields(api_a.patch(url, {"event": "occurrence_dead"}, format="json"))
    assert set(refused) == {"threshold_s", "window_minutes"}
    cleared = {"threshold_s": None, "window_minutes": None, "schedule_id": None}
    patched = api_a.patch(url, {"event": "occurrence_dead", **cleared}, format="json")
    assert patched.status_code == 200, patched.content
    saved = AlertRule.objects.get(id=body["id"])
    assert (saved.event, saved.schedule_id, saved.threshold_s) == ("occurrence_dead", None, None)

    assert api_a.delete(url).status_code == 204
    assert api_a.get(url).status_code == 404


def test_rule_create_refuses_bad_input_by_field(api_a, tenant_a, tenant_b):
    ch = channel(tenant_a, "ops@example.com")
    theirs = channel(tenant_b, "them@example.com")

    lag_on_dead = _fields(api_a.post("/api/v1/alert-rules", {
        "channel_id": str(ch.id), "event": "occurrence_dead", "threshold_s": 10,
    }, format="json"))  # fmt: skip
    unknown_event = _fields(api_a.post("/api/v1/alert-rules", {
        "channel_id": str(ch.id), "event": "disk_full",
    }, format="json"))  # fmt: skip
    test_event = _fields(api_a.post("/api/v1/alert-rules", {
        "channel_id": str(ch.id), "event": "test",
    }, format="json"))  # fmt: skip
    foreign = _fields(api_a.post("/api/v1/alert-rules", {
        "channel_id": str(theirs.id), "event": "occurrence_dead",
        "schedule_id": str(uuid.uuid4()),
    }, format="json"))  # fmt: skip
    out_of_range = _fields(api_a.post("/api/v1/alert-rules", {
        "channel_id": str(ch.id), "event": "enqueue_lag", "threshold_s": 0,
        "window_minutes": "5",
    }, format="json"))  # fmt: skip

    assert "lag rules" in lag_on_dead["threshold_s"][0]
    assert "event" in unknown_event
    assert "event" in test_event  # a test alert is the button's, not a rule's
    assert set(foreign) == {"channel_id", "schedule_id"}
    assert set(out_of_range) == {"threshold_s", "window_minutes"}
    assert not AlertRule.objects.exists()


def test_another_tenants_channel_and_rule_are_not_found(api_a, tenant_b):
    theirs = channel(tenant_b, "them@example.com")
    their_rule = rule(theirs)

    for method, url in [
        ("get", f"/api/v1/alert-channels/{theirs.id}"),
        ("patch", f"/api/v1/alert-channels/{theirs.id}"),
        ("delete", f"/api/v1/alert-channels/{theirs.id}"),
        ("post", f"/api/v1/alert-channels/{theirs.id}/test"),
        ("get", f"/api/v1/alert-rules/{their_rule.id}"),
        ("patch", f"/api/v1/alert-rules/{their_rule.id}"),
        ("delete", f"/api/v1/alert-rules/{their_rule.id}"),
        ("put", f"/api/v1/alert-rules/{their_rule.id}"),  # a refused method: 404 first
        ("options", f"/api/v1/alert-channels/{theirs.id}"),
        ("get", f"/api/v1/alert-channels/{theirs.id}/test"),
    ]:
        response = getattr(api_a, method)(url, {"enabled": False}, format="json")
        assert response.status_code == 404, (method, url)
        assert response.json()["error"]["code"] == "not_found"
    theirs.refresh_from_db()
    assert theirs.enabled and AlertRule.objects.filter(id=their_rule.id, enabled=True).exists()
    assert not Alert.objects.exists()
    assert api_a.get("/api/v1/alert-channels").json() == []
    assert api_a.get("/api/v1/alert-rules").json() == []


def test_unknown_query_parameters_are_refused(api_a, tenant_a):
    assert "channel_id" in _fields(api_a.get("/api/v1/alerts", {"channel_id": "x"}))
    assert "q" in _fields(api_a.get("/api/v1/alert-channels", {"q": "ops"}))
    assert "event" in _fields(api_a.get("/api/v1/alerts", {"event": "disk_full"}))


def test_create_with_an_idempotency_key_creates_once(api_a, tenant_a):
    body = {"name": "ops", "kind": "email", "target": "ops@example.com"}
    headers = {"HTTP_IDEMPOTENCY_KEY": "create-ops-1"}

    first = api_a.post("/api/v1/alert-channels", body, format="json", **headers)
    again = api_a.post("/api/v1/alert-channels", body, format="json", **headers)
    other = api_a.post(
        "/api/v1/alert-channels", {**body, "name": "other"}, format="json", **headers
    )

    assert (first.status_code, again.status_code, other.status_code) == (201, 201, 409)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert AlertChannel.objects.count() == 1


def test_test_alert_is_grouped_into_a_delivery_and_listed_with_its_state(api_a, tenant_a):
    ch = channel(tenant_a, "ops@example.com")

    sent = api_a.post(f"/api/v1/alert-channels/{ch.id}/test")

    assert sent.status_code == 202, sent.content
    alert = Alert.objects.get(id=sent.json()["alert_id"])
    assert (alert.event, alert.channel_id, alert.delivery_id) == (AlertEvent.TEST, ch.id, None)
    pending = api_a.get("/api/v1/alerts").json()["results"]
    assert [(a["id"], a["event"], a["delivery_state"], a["delivery_id"]) for a in pending] == [
        (str(alert.id), "test", "pending", None)
    ]
    assert pending[0]["channel"] == {"id": str(ch.id), "name": ch.name, "kind": "email"}

    # The reaper's grouping makes it a message once the coalescing wait is over.
    later = timezone.now() + timedelta(seconds=11)
    assert group_pending(now=later, coalesce_s=10, interval_s=3600) == (1, 1)
    delivery = AlertDelivery.objects.get()
    AlertDelivery.objects.filter(id=delivery.id).update(
        state=AlertDelivery.State.SENT, sent_at=timezone.now()
    )
    listed = api_a.get("/api/v1/alerts").json()["results"][0]
    assert (listed["delivery_id"], listed["delivery_state"]) == (str(delivery.id), "sent")
    assert listed["sent_at"].endswith("Z")


def test_history_is_newest_first_in_cursor_pages_and_filtered(api_a, api_b, tenant_a, tenant_b):
    mail, hook = channel(tenant_a, "ops@example.com"), channel(tenant_a, "dev@example.com")
    now = timezone.now()
    for i in range(5):
        Alert.objects.create(
            id=uuid.uuid4(), tenant=tenant_a, channel=mail if i % 2 else hook,
            event=AlertEvent.OCCURRENCE_DEAD, subject=f"DEAD: job {i}",
            fired_at=now - timedelta(minutes=i),
        )  # fmt: skip
    channel(tenant_b, "them@example.com")

    first = api_a.get("/api/v1/alerts", {"page_size": 3}).json()
    second = api_a.get(first["next"]).json()
    by_channel = api_a.get("/api/v1/alerts", {"channel": str(mail.id)}).json()["results"]

    subjects = [a["subject"] for a in first["results"] + second["results"]]
    assert subjects == [f"DEAD: job {i}" for i in range(5)]
    assert second["next"] is None
    assert [a["subject"] for a in by_channel] == ["DEAD: job 1", "DEAD: job 3"]
    assert api_b.get("/api/v1/alerts").json()["results"] == []
    assert len(api_a.get("/api/v1/alerts", {"event": "OCCURRENCE_DEAD"}).json()["results"]) == 5
    assert api_a.get("/api/v1/alerts", {"event": "test"}).json()["results"] == []

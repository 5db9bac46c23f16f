"""Input that used to answer 500 answers 400 in the one error shape, naming the field; and
the webhook's URL, port and headers are judged at create, update and preview
(docs/decisions.md "No input yields a 5xx", "Webhook ports", "Webhook headers")."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from apps.schedules.models import Schedule
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

WEBHOOK = {"name": "hook", "kind": "cron", "expression": "*/5 * * * *", "handler": "webhook"}


def _error(response: Any) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "fields"}, body
    return dict(body["error"])


@pytest.mark.parametrize("param", ["from", "to"])
def test_an_impossible_date_in_the_occurrence_filter_is_a_400_on_its_field(api_a, param):
    response = api_a.get("/api/v1/occurrences", {param: "2026-02-30T00:00:00Z"})

    assert response.status_code == 400
    error = _error(response)
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [param]


@pytest.mark.parametrize("path", ["/api/v1/schedules", "/api/v1/occurrences"])
@pytest.mark.parametrize(
    "cursor",
    [base64.urlsafe_b64encode(b">2026-02-30T00:00:00+00:00|x").decode(),
     base64.urlsafe_b64encode(b">0001-01-01T00:00:00+01:00|" + b"0" * 32).decode(),
     base64.urlsafe_b64encode(b"\xff\xfe").decode(), "%%%", "A" * 5000],
)  # fmt: skip
def test_a_forged_cursor_is_a_400_on_cursor(api_a, tenant_a, path, cursor):
    make_schedule(tenant_a)

    response = api_a.get(path, {"cursor": cursor})

    assert response.status_code == 400
    assert list(_error(response)["fields"]) == ["cursor"]


@pytest.mark.parametrize("page_size", ["null", "0", "201", "-1", "1.5", "9" * 5000, "²"])
def test_a_bad_page_size_is_a_400_not_a_silent_default(api_a, page_size):
    response = api_a.get("/api/v1/schedules", {"page_size": page_size})

    assert response.status_code == 400
    assert list(_error(response)["fields"]) == ["page_size"]


def test_a_nul_in_a_query_parameter_is_a_400_naming_it(api_a):
    response = api_a.get("/api/v1/schedules?q=abc%00def")

    assert response.status_code == 400
    assert list(_error(response)["fields"]) == ["q"]


@pytest.mark.parametrize("ids", [[False], [True], [0], [12345]])
def test_bulk_replay_takes_ids_only_as_uuid_strings(api_a, ids):
    response = api_a.post("/api/v1/occurrences/replay", {"ids": ids}, format="json")

    assert response.status_code == 400
    assert list(_error(response)["fields"]) == ["ids.0"]


@pytest.mark.parametrize("url", ["http://[::1/", "http://[abc]/", "https://[v1.x]/hook"])
@pytest.mark.parametrize("route", ["/api/v1/schedules", "/api/v1/schedules/preview"])
def test_a_malformed_webhook_url_is_a_400_on_payload_url(api_a, route, url):
    response = api_a.post(route, {**WEBHOOK, "payload": {"url": url}}, format="json")

    assert response.status_code == 400
    error = _error(response)
    assert list(error["fields"]) == ["payload.url"]
    assert "malformed" in error["fields"]["payload.url"][0] or "IPv6" in str(error)
    assert Schedule.objects.count() == 0


@pytest.mark.parametrize("route", ["/api/v1/schedules", "/api/v1/schedules/preview"])
def test_a_port_other_than_80_and_443_is_refused_until_the_tenant_allows_it(api_a, tenant_a, route):
    body = {**WEBHOOK, "payload": {"url": "https://example.com:6379/"}}

    refused = api_a.post(route, body, format="json")
    tenant_a.webhook_allowed_ports = [6379]
    tenant_a.save(update_fields=["webhook_allowed_ports"])
    accepted = api_a.post(route, body, format="json")

    assert refused.status_code == 400
    assert "port 6379 is not allowed" in _error(refused)["fields"]["payload.url"][0]
    assert accepted.status_code in (200, 201), accepted.content


def test_one_tenants_ports_do_not_open_another_tenants_webhooks(api_a, api_b, tenant_a):
    tenant_a.webhook_allowed_ports = [8443]
    tenant_a.save(update_fields=["webhook_allowed_ports"])
    body = {**WEBHOOK, "payload": {"url": "https://example.com:8443/"}}

    assert api_a.post("/api/v1/schedules", body, format="json").status_code == 201
    assert api_b.post("/api/v1/schedules", body, format="json").status_code == 400


@pytest.mark.parametrize(
    ("headers", "says"),
    [({"Host": "internal"}, "reserved"), ({"Transfer-Encoding": "chunked"}, "reserved"),
     ({"X A": "1"}, "not a valid header name"), ({"X-A": "a\r\nB: c"}, "control character"),
     ({"X-A": "☃"}, "Latin-1")],
)  # fmt: skip
@pytest.mark.parametrize("route", ["/api/v1/schedules", "/api/v1/schedules/preview"])
def test_bad_webhook_headers_are_a_400_on_payload_headers(api_a, route, headers, says):
    body = {**WEBHOOK, "payload": {"url": "https://example.com/", "headers": headers}}

    response = api_a.post(route, body, format="json")

    assert response.status_code == 400
    error = _error(response)
    assert list(error["fields"]) == ["payload.headers"]
    assert says in error["fields"]["payload.headers"][0]


def test_an_update_to_bad_headers_is_refused_and_changes_nothing(api_a):
    created = api_a.post(
        "/api/v1/schedules", {**WEBHOOK, "payload": {"url": "https://example.com/"}}, format="json"
    ).json()
    bad = {"payload": {"url": "https://example.com/", "headers": {"Connection": "close"}}}

    response = api_a.patch(f"/api/v1/schedules/{created['id']}", bad, format="json")

    assert response.status_code == 400
    assert list(_error(response)["fields"]) == ["payload.headers"]
    schedule = Schedule.objects.get(id=created["id"])
    assert (schedule.version, schedule.payload) == (1, {"url": "https://example.com/"})


# --- instants at the edges of the calendar ---------------------------------------------------

EDGE_INSTANTS = ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "9999-01-01T00:00:00Z",
                 "9999-12-31T23:59:59-23:59"]  # fmt: skip


@pytest.mark.parametrize("field", ["start_at", "end_at"])
@pytest.mark.parametrize("instant", EDGE_INSTANTS)
def test_a_bound_outside_1970_to_9998_is_a_400_on_its_field(api_a, field, instant):
    body = {"name": "edge", "kind": "cron", "expression": "0 * * * *", "handler": "record"}

    created = api_a.post("/api/v1/schedules", {**body, field: instant}, format="json")
    previewed = api_a.post("/api/v1/schedules/preview", {**body, field: instant}, format="json")

    for response in (created, previewed):
        assert response.status_code == 400, response.content
        assert list(_error(response)["fields"]) == [field]
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("run_at", ["0001-01-01T00:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59"])
def test_a_one_shot_outside_1970_to_9998_is_a_400_on_run_at(api_a, run_at):
    body = {"name": "edge", "kind": "one_shot", "run_at": run_at, "time_zone": "Asia/Tokyo",
            "handler": "record", "max_lateness_s": 604800}  # fmt: skip

    response = api_a.post("/api/v1/schedules", body, format="json")

    assert response.status_code == 400, response.content
    assert list(_error(response)["fields"]) == ["run_at"]


def test_a_patch_to_year_one_is_a_400_and_changes_nothing(api_a, tenant_a):
    schedule = make_schedule(tenant_a)

    response = api_a.patch(
        f"/api/v1/schedules/{schedule.id}", {"start_at": "0001-01-01T00:00:00Z"}, format="json"
    )

    assert response.status_code == 400, response.content
    assert list(_error(response)["fields"]) == ["start_at"]
    assert Schedule.objects.get(pk=schedule.pk).start_at is None

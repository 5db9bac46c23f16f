"""Keyset pages (apps/core/pagination.py): tokens round-trip, forged ones are bad input
(400 in the API, a message on the page), and the API's `previous` links walk back."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

import pytest

from apps.core.pagination import InvalidCursor, Position, decode_cursor, encode_cursor
from apps.schedules.tests.factories import make_schedule

pytestmark = pytest.mark.django_db

ROW = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _token(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("backward", [False, True])
def test_cursor_round_trips(backward):
    position = Position(datetime(2026, 3, 8, 9, 30, 0, 123456, tzinfo=UTC), ROW, backward)

    assert decode_cursor(encode_cursor(position)) == position


@pytest.mark.parametrize(
    "token",
    ["", "!!!", "2026-03-08T09:30:00+00:00|" + str(ROW),  # the old web format, unencoded
     _token(f">2026-02-30T00:00:00+00:00|{ROW}"),  # well-formed, impossible date
     _token(f">2026-03-08T09:30:00|{ROW}"),  # naive
     _token(f">9999-12-31T23:59:59-23:59|{ROW}"),  # beyond the calendar in UTC
     _token(f"?2026-03-08T09:30:00+00:00|{ROW}"), _token(">2026-03-08T09:30:00+00:00|x"),
     base64.urlsafe_b64encode(b"\xff\xfe\xfd").decode()],
)  # fmt: skip
def test_forged_cursors_are_invalid(token):
    with pytest.raises(InvalidCursor):
        decode_cursor(token)


@pytest.mark.parametrize("path", ["/api/v1/schedules", "/api/v1/occurrences"])
def test_api_answers_400_for_a_forged_cursor(api_a, path):
    response = api_a.get(path, {"cursor": _token(f">2026-02-30T00:00:00+00:00|{ROW}")})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert list(response.json()["error"]["fields"]) == ["cursor"]


def test_api_previous_links_walk_back_through_the_same_pages(api_a, tenant_a):
    made = [make_schedule(tenant_a, name=f"job {i}") for i in range(5)]
    newest_first = [str(s.id) for s in reversed(made)]

    pages: list[list[str]] = []
    url: str | None = "/api/v1/schedules?page_size=2"
    while url:
        body = api_a.get(url).json()
        pages.append([row["id"] for row in body["results"]])
        url = body["next"]
    back: list[list[str]] = []
    url = body["previous"]
    while url:
        body = api_a.get(url).json()
        back.append([row["id"] for row in body["results"]])
        url = body["previous"]

    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:]]
    assert back == [newest_first[2:4], newest_first[0:2]]


def test_web_page_with_a_forged_cursor_says_so(client, alice, tenant_a):
    make_schedule(tenant_a)
    client.force_login(alice)

    response = client.get("/schedules/", {"after": "not-a-cursor"})

    assert response.status_code == 200
    assert list(response.context["schedules"]) == []
    assert response.context["errors"] == [
        "Invalid or expired page cursor; start again from the first page."
    ]
    assert response.context["paged"] is True

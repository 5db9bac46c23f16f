"""The schedule list as the API answers it, and the queries one answer makes (tests that a
list page is read in a fixed number of queries whatever its length)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext


def schedule_list_queries(api: Any) -> int:
    """The queries one GET of the schedule list makes, after a first GET (a key's first use
    writes once)."""
    api.get("/api/v1/schedules")
    with CaptureQueriesContext(connection) as captured:
        assert api.get("/api/v1/schedules").status_code == 200
    return len(captured)


def schedule_list_rows(api: Any) -> dict[str, dict[str, Any]]:
    """The schedule list's rows by id, from one GET that must answer 200."""
    response = api.get("/api/v1/schedules")
    assert response.status_code == 200, response.content
    return {row["id"]: row for row in response.json()["results"]}

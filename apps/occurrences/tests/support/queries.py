"""Query counts of API answers, for tests that a list page is read in a fixed number of
queries whatever its length."""

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

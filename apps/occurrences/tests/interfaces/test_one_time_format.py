"""One timestamp format on every page (docs/ui.md "Timestamps"): every route of the tenant
web UI and the admin, walked from the resolver (a new page is covered without editing this
file), is rendered with data of every kind — schedules with events and a backfill,
occurrences with attempts, alerts, signing secrets, keys, invitations, sessions — and its
visible text may hold no date and time other than `2026-12-03 23:45:00 UTC` (or with
milliseconds): no zone-less time, no `+00:00`, no `Dec. 3, 2026, 11:52 p.m.`."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import get_resolver
from django.utils import timezone

from apps.occurrences.alerts.configure import send_test_alert
from apps.occurrences.alerts.tests.support import channel, rule
from apps.occurrences.manual_runs import BackfillOnly, schedule_backfill, schedule_run_now
from apps.occurrences.models import AlertEvent, Occurrence
from apps.occurrences.schedule_changes import schedule_pause
from apps.occurrences.tests.interfaces.test_no_server_errors import _admin_object_ids, _routes
from apps.occurrences.tests.support.rows import attempt_started, dead_occurrence, schedule
from apps.tenants.members import invitation_create
from apps.tenants.models import Membership
from apps.tenants.services import api_key_create
from apps.tenants.signing import signing_secret_rotate

pytestmark = [pytest.mark.django_db, pytest.mark.clock_edge]

# Anything that reads as a date with a time of day, with whatever follows it.
_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2}| ?UTC)?"
)
_ONE_FORMAT = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})? UTC")
_OTHER_FORMATS = re.compile(
    r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]*\.? \d{1,2}, \d{4}"
    r"|\b\d{1,2}:\d{2} ?[ap]\.?m\.?(?!\w)|\+00:00"
)
# Not shown as text: scripts, styles, form values, JSON payloads a tenant wrote; literal
# machine text (`<code>`: the API's own RFC 3339 in the webhook guide's examples). Not an
# instant of Tick's: a field's hint (the syntax it accepts, "2026-03-08T09:30") and a
# schedule's wall time in its own zone (`data-local-time`, the "Local" column of its fires).
_HIDDEN = re.compile(
    r"<(script|style|textarea|pre|code)\b.*?</\1>"
    r'|<(span|td)\b[^>]*(?:class="hint"|data-local-time)[^>]*>.*?</\2>',
    re.S | re.I,
)
# Third-party admin pages whose rows describe themselves (`__str__`) with Python's reprs.
_NOT_OURS = ("admin/axes/", "admin/django_celery_results/")


def visible_text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", _HIDDEN.sub(" ", page)))


def timestamps_not_in_the_one_format(page: str) -> list[str]:
    text = visible_text(page)
    found = [m.group(0) for m in _DATE_TIME.finditer(text)]
    bad = [t for t in found if not _ONE_FORMAT.fullmatch(t)]
    return bad + [m.group(0) for m in _OTHER_FORMATS.finditer(text)]


def test_the_guard_sees_the_formats_it_refuses() -> None:
    page = (
        "<td>2026-12-03 23:45:00 UTC</td><td>2026-12-03 23:45:00.120 UTC</td>"
        '<input value="2026-12-03 23:45"><span class="hint">2026-03-08T09:30</span>'
        "<td data-local-time>2026-12-03 18:45 EST</td><td>2026-12-03 23:45</td>"
        "<td>next_run_at: 2026-12-03T23:45:00+00:00</td><td>Dec. 3, 2026, 11:52 p.m.</td>"
    )
    assert timestamps_not_in_the_one_format(page) == [
        "2026-12-03 23:45", "2026-12-03T23:45:00+00:00", "+00:00", "Dec. 3, 2026", "11:52 p.m.",
    ]  # fmt: skip


@pytest.fixture
def world(tenant_a: Any, alice: Any, django_user_model: Any) -> dict[str, Any]:
    """Rows of every kind a page shows, written by the real services."""
    now = timezone.now()
    sched = schedule(tenant_a, name="minutely", expression="* * * * *")
    top = now.replace(second=0, microsecond=0)
    schedule_backfill(schedule=sched, actor="user:alice", start=top - timedelta(minutes=10),
                      end=top, only=BackfillOnly.MISSED)  # fmt: skip
    schedule_run_now(schedule=sched, actor="user:alice", request_id="r-1")
    occ = Occurrence.objects.filter(schedule=sched).order_by("scheduled_for").first()
    assert occ is not None
    attempt_started(occ, now)
    dead = dead_occurrence(tenant_a)
    paused = schedule(tenant_a, name="paused one")
    schedule_pause(schedule=paused, actor="user:alice")
    ch = channel(tenant_a, "ops@example.com")
    rule(ch, AlertEvent.START_LAG, threshold_s=30, window_minutes=3)
    send_test_alert(channel=ch, actor="user:alice")
    signing_secret_rotate(tenant=tenant_a, actor="user:alice")
    signing_secret_rotate(tenant=tenant_a, actor="user:alice", previous_expires_in_s=3600)
    key, _ = api_key_create(
        tenant=tenant_a, name="ci", actor="user:alice", expires_at=now + timedelta(days=30)
    )
    invitation_create(tenant=tenant_a, email="bob@example.com", role=Membership.Role.VIEWER,
                      actor="user:alice", site_url="http://testserver")  # fmt: skip
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    values = {
        "schedule_id": str(sched.id), "occurrence_id": str(dead.id), "key_id": str(key.id),
        "id": str(alice.id),
        "content_type_id": str(ContentType.objects.get_for_model(type(sched)).id),
    }  # fmt: skip
    return {"values": values, "alice": alice, "root": root, "occurrence": occ}


_PARAM = re.compile(r"<(?:\w+:)?(\w+)>")


def _pages(values: dict[str, str], area: str) -> list[str]:
    """One path per GET-able route of `area` (web or admin), its ids those of real rows."""
    paths = []
    for route, name in _routes(get_resolver().url_patterns):
        kind = (
            "admin" if route.startswith("admin/") else "api" if route.startswith("api/") else "web"
        )
        if kind != area or name in ("logout", "favicon") or "(?P<" in route:
            continue
        if route.startswith(_NOT_OURS):
            continue
        ids = {**values, "object_id": (_admin_object_ids(route) or [""])[0]}
        names = _PARAM.findall(route)
        if any(not ids.get(n) for n in names):
            continue
        path = route
        for param in names:
            path = re.sub(rf"<(?:\w+:)?{param}>", ids[param], path)
        paths.append("/" + path)
    return paths


def _offenders(client: Client, paths: list[str]) -> list[str]:
    found = []
    for path in paths:
        response = client.get(path)
        if response.status_code != 200 or "html" not in response.get("Content-Type", ""):
            continue
        bad = timestamps_not_in_the_one_format(response.content.decode())
        if bad:
            found.append(f"{path}: {sorted(set(bad))[:5]}")
    return found


def test_every_tenant_page_writes_instants_in_the_one_format(world: dict[str, Any]) -> None:
    client = Client(HTTP_USER_AGENT="Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0 Safari/537.36")
    signed_in = client.post("/login/", {"username": "alice", "password": "pw-alice-123"})
    assert signed_in.status_code == 302
    paths = _pages(world["values"], "web")
    occ = world["occurrence"]
    paths.append(f"/occurrences/{occ.id}/")
    assert {"/activity/", "/alerts/", "/signing/", "/account/", "/members/", "/keys/"} <= set(paths)

    offenders = _offenders(client, paths)
    assert offenders == [], "\n".join(offenders)


def test_every_admin_page_writes_instants_in_the_one_format(world: dict[str, Any]) -> None:
    client = Client()
    client.force_login(world["root"])
    paths = _pages(world["values"], "admin")
    assert len(paths) > 30 and "/admin/occurrences/browse/" in paths

    offenders = _offenders(client, paths)
    assert offenders == [], "\n".join(offenders)


def test_event_details_read_as_words_not_reprs(world: dict[str, Any]) -> None:
    client = Client()
    client.force_login(world["alice"])
    page = client.get(f"/schedules/{world['values']['schedule_id']}/").content.decode()

    events = visible_text(page.split('id="events"', 1)[1])
    assert "+00:00" not in events and "={" not in events and "False" not in events
    assert re.search(r"backfill\b.*start: \d{4}-\d\d-\d\d \d\d:\d\d:00 UTC", events, re.I | re.S)

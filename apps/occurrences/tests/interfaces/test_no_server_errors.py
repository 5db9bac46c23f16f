"""No input yields a 5xx (docs/decisions.md "No input yields a 5xx"): every URL pattern of
the web UI, the admin and the API, walked from the resolver (so a new route is covered
without editing this file), requested with its path parameters filled by valid ids of real
objects and by malformed values, and with malformed query strings. A deterministic table,
not random examples: the same requests every run, all of them in a few seconds.

The tenant web UI is requested as a tenant admin (GET, and POST with junk form data); the
admin as a superuser (GET only: its POSTs delete and change rows, and its forms are Django's
own); the API with a tenant's key (GET; its bodies are fuzzed by schemathesis,
apps/occurrences/schedules/tests/api/test_api_schema_fuzz.py).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib.contenttypes.models import ContentType
from django.db import transaction
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils import timezone
from django_celery_results.models import GroupResult, TaskResult

from apps.occurrences.models import DispatchOutbox, Lane, ShardLease, WorkerPresence
from apps.occurrences.tests.support.rows import dead_occurrence, occurrence, schedule
from apps.tenants.services import api_key_create

pytestmark = pytest.mark.django_db

# Path parameters that are no id of anything: not a UUID, integers past any column,
# unicode, a non-UTF-8 percent-encoding, NUL, overlong, blank, empty.
MALFORMED_PATH_VALUES = [
    "not-a-uuid", "9" * 40, "-1", "%E2%98%83%C3%A9", "%FF%FE", "%00", "x" * 600, "%20", "",
]  # fmt: skip

# Every filter name the routes read (and some they do not), and the bad values each takes:
# impossible dates, forged cursors, huge, negative and overlong values, non-UTF-8
# percent-encodings, unicode, instants at the edges of the calendar.
_NAMES = ["from", "to", "until", "before", "after", "cursor", "state", "kind", "q", "handler",
          "schedule", "tenant", "hours", "page_size", "count", "p", "o", "next"]  # fmt: skip
_BAD_VALUES = [
    "2026-02-30T00:00", "2026-02-30T00:00:00%2B00:00|x", "PjIwMjYtMDItMzBUMDA6MDA6MDArMDA6MDB8eA",
    "9" * 40, "-1", "x" * 5000, "9" * 5000, "%FF%FE", "%E2%98%83%C2%B2", "0001-01-01T00:00",
    "9999-12-31T23:59:59-23:59", "%25%25%25",
]  # fmt: skip

# Each bad value once for every name, spread over as many strings as there are values.
MALFORMED_QUERIES = [
    "&".join(
        f"{name}={_BAD_VALUES[(index + shift) % len(_BAD_VALUES)]}"
        for index, name in enumerate(_NAMES)
    )
    for shift in range(len(_BAD_VALUES))
]
# NUL (refused whole by tickweb/middleware.py, so kept out of the strings above); repeated,
# empty, unknown and nameless parameters; the admin's own (ordering, page, popup, lookups on
# its list filters).
ODD_QUERIES = [
    "q=ab%00cd&state=%00&%00=1",
    "state=A&state=B&state=&p=1&p=2&o=1&o=99&page_size=0&page_size=-1&after=x&after=",
    "zzz=1&o=999&p=99999999999999999999&e=1&all=&_popup=1&_to_field=id&_changelist_filters=%FF",
    "%FF=1&=3&&&q&%E2%98%83=%E2%98%83",
    "tenant__id__exact=not-a-uuid&id__exact=%FF&state__exact=zz&lane__exact=%FF"
    "&created_at__gte=2026-02-30&scheduled_for__lt=x&seen_at__gte=9999-99",
]

# POST bodies for the tenant web UI: junk in every field its forms and actions read.
JUNK_FORM = {
    "name": "\x00", "kind": "zz", "expression": "\x00", "run_at": "2026-02-30T00:00",
    "time_zone": "Mars/Olympus", "handler": "\x00", "payload": "{", "timeout_s": "9" * 40,
    "flexible_window_s": "-1", "max_lateness_s": "x", "catchup_limit": "9" * 40,
    "start_at": "2026-02-30", "end_at": "\x00", "precision": "\x00", "misfire_policy": "",
    "overlap_policy": "☃", "dst_gap": "\x00", "dst_fold": "x", "ids": ["not-a-uuid", "9" * 40],
    "tenant": "not-a-uuid", "role": "\x00", "username": "\x00", "email": "\x00@x",
    "password": "\x00", "next": "//evil.example/",
}  # fmt: skip
# Valid forms but for the edges of the calendar (years 1 and 9999, where offset arithmetic
# leaves the datetime range) and control characters in the names: each must reach the
# definition's checks and be refused there, not crash on the way.
_VALID_FORM = {
    "kind": "cron", "expression": "0 * * * *", "time_zone": "Pacific/Kiritimati",
    "handler": "record", "precision": "strict", "misfire_policy": "fire_once",
    "overlap_policy": "allow", "dst_gap": "skip", "dst_fold": "first", "role": "viewer",
}  # fmt: skip
_ONE_SHOT = {**_VALID_FORM, "kind": "one_shot", "expression": ""}
EDGE_FORMS = [
    {**_VALID_FORM, "name": "a\r\nBcc: x@example.test", "start_at": "0001-01-01T00:00:00Z"},
    {**_VALID_FORM, "name": "\x1b[2J\u202e", "end_at": "9999-12-31T23:59:59Z"},
    {**_ONE_SHOT, "name": "\t", "run_at": "0001-01-01T00:00"},
    {**_ONE_SHOT, "name": "\x85", "run_at": "9999-12-31T23:59"},
]  # fmt: skip

_CONVERTER = re.compile(r"<(?:(?P<kind>\w+):)?(?P<name>\w+)>")
_GROUP = re.compile(r"\(\?P<(?P<name>\w+)>(?P<body>[^)]*)\)")


def _routes(
    patterns: list[URLPattern | URLResolver], prefix: str = ""
) -> Iterator[tuple[str, str | None]]:
    """(route as one string, name) for every URL pattern, nested includes flattened."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, prefix + str(pattern.pattern))
        else:
            yield prefix + str(pattern.pattern), pattern.name


def _fill(route: str, values: dict[str, list[str]]) -> list[str]:
    """Concrete paths for `route`: each parameter takes each of its candidate values (one at
    a time; the other parameters keep their first, valid candidate)."""
    route = route.replace("^", "").replace("$", "")
    params: list[tuple[str, str]] = [
        (m.group(0), m.group("name")) for m in _CONVERTER.finditer(route)
    ]
    for m in _GROUP.finditer(route):
        body = m.group("body")
        if re.fullmatch(r"[\w|]+", body):  # an alternation of literals (admin app labels)
            values = {**values, m.group("name"): body.split("|") + MALFORMED_PATH_VALUES[:2]}
        params.append((m.group(0), m.group("name")))
    if not params:
        return ["/" + route]
    paths = []
    for index, (_, name) in enumerate(params):
        for candidate in values.get(name, []) + MALFORMED_PATH_VALUES + [str(uuid.uuid4())]:
            path = route
            for other_index, (token, other) in enumerate(params):
                chosen = candidate if other_index == index else values.get(other, ["x"])[0]
                path = path.replace(token, chosen, 1)
            paths.append("/" + path)
    return sorted(set(paths))


@pytest.fixture
def world(tenant_a: Any, alice: Any, django_user_model: Any) -> dict[str, Any]:
    """Real rows of every kind a route names, so valid ids reach the views' happy paths."""
    tenant_a.api_rate_per_min = 1_000_000
    tenant_a.save(update_fields=["api_rate_per_min"])
    sched = schedule(tenant_a, handler="noop")
    occ = occurrence(sched, timezone.now())
    dead = dead_occurrence(tenant_a)
    key, raw = api_key_create(actor="test", tenant=tenant_a, name="fuzz")
    root = django_user_model.objects.create_superuser("root", password="pw-root-123")
    DispatchOutbox.objects.create(
        occurrence_id=occ.id, scheduled_for=occ.scheduled_for, schedule_id=sched.id,
        schedule_version=1, tenant_id=tenant_a.id, shard=sched.shard, lane=Lane.STRICT,
        available_at=occ.scheduled_for, created_at=timezone.now(),
    )  # fmt: skip
    ShardLease.objects.get_or_create(role=ShardLease.Role.RELAY, shard=0)
    WorkerPresence.objects.create(hostname="w1", slots=4, seen_at=timezone.now())
    TaskResult.objects.create(task_id="t1", date_done=timezone.now() - timedelta(minutes=1))
    GroupResult.objects.create(group_id="g1")
    values: dict[str, list[str]] = {
        "schedule_id": [str(sched.id)],
        "occurrence_id": [str(occ.id), str(dead.id)],
        "key_id": [str(key.id)],
        "id": [str(alice.id)],
        "content_type_id": [str(ContentType.objects.get_for_model(type(sched)).id)],
        "url": ["nothing/here/", "auth/user/%00/change/"],
    }
    return {"values": values, "alice": alice, "root": root, "api_key": raw}


def _admin_object_ids(route: str) -> list[str]:
    """The pk of a real row of the model an admin route edits (`admin/<app>/<model>/…`)."""
    match = re.match(r"admin/(\w+)/(\w+)/<path:object_id>", route)
    if match is None:
        return []
    try:
        model = apps.get_model(match.group(1), match.group(2))
    except LookupError:
        return []
    row = model._default_manager.order_by("pk").first()
    return [str(row.pk)] if row is not None else []


def _server_errors(client: Client, method: str, paths: list[str], **extra: Any) -> list[str]:
    failures = []
    for path in paths:
        # A savepoint per request: a database error in one (a 500 to report) must not abort
        # the test's transaction and turn every later request into a 500 too.
        with transaction.atomic():
            if method == "get":
                responses = [client.get(path, **extra)]
            else:
                responses = [client.post(path, form, **extra) for form in (JUNK_FORM, *EDGE_FORMS)]
            codes = [response.status_code for response in responses]
            if max(codes) >= 500:
                transaction.set_rollback(True)
        if max(codes) >= 500:
            failures.append(f"{method.upper()} {path[:200]} -> {codes}")
    return failures


def _requests(world: dict[str, Any], area: str) -> tuple[list[str], list[str]]:
    """(paths with filled parameters, the same with each malformed query string) of `area`:
    admin, api or web."""
    paths: list[str] = []
    queried: list[str] = []
    for route, name in _routes(get_resolver().url_patterns):
        kind = (
            "admin" if route.startswith("admin/") else "api" if route.startswith("api/") else "web"
        )
        if kind != area or name == "logout":
            continue  # logging out would end the session the rest of the run needs
        values = {**world["values"], "object_id": _admin_object_ids(route) or ["1"]}
        filled = _fill(route, values)
        paths.extend(filled)
        # Malformed query strings on the first (valid) concrete path of each route; an
        # admin object page reads only the admin's own parameters.
        object_page = kind == "admin" and "<" in route
        queries = ODD_QUERIES if object_page else MALFORMED_QUERIES + ODD_QUERIES
        queried.extend(f"{filled[0]}?{query}" for query in queries)
    return paths, queried


def test_no_web_ui_request_yields_a_server_error(world: dict[str, Any]) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(world["alice"])
    paths, queried = _requests(world, "web")
    assert len(paths) > 50  # the walk found the routes

    failures = _server_errors(client, "get", paths + queried)
    failures += _server_errors(client, "post", paths)

    assert not failures, "\n".join(failures)


def test_no_admin_request_yields_a_server_error(world: dict[str, Any]) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(world["root"])
    paths, queried = _requests(world, "admin")
    assert len(paths) > 200

    failures = _server_errors(client, "get", paths + queried)

    assert not failures, "\n".join(failures)


def test_no_api_get_yields_a_server_error(world: dict[str, Any]) -> None:
    client = Client(raise_request_exception=False)
    paths, queried = _requests(world, "api")

    failures = _server_errors(
        client, "get", paths + queried, HTTP_AUTHORIZATION=f"Bearer {world['api_key']}"
    )

    assert not failures, "\n".join(failures)

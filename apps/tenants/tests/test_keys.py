"""API keys: shown once, stored hashed, revocable, optional expiry, last-used time."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone
from rest_framework.test import APIClient

from apps.tenants.models import ApiKey, IdempotencyKey
from apps.tenants.services import api_key_create, hash_api_key

pytestmark = pytest.mark.django_db


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _last_line(out: StringIO) -> str:
    return out.getvalue().strip().splitlines()[-1]


def test_key_is_stored_hashed_with_a_visible_prefix_and_records_last_use(tenant_a):
    key, raw = api_key_create(actor="test", tenant=tenant_a, name="ci")

    assert raw.startswith("tick_") and len(raw) > 40
    assert key.key_hash == hash_api_key(raw) and raw not in key.key_hash
    assert key.prefix == raw[:13]
    assert _client(raw).get("/api/v1/schedules").status_code == 200
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_tenant_create_prints_a_working_key_as_the_last_line():
    out = StringIO()
    call_command("tenant_create", "gamma", "--api-key", stdout=out)

    assert _client(_last_line(out)).get("/api/v1/schedules").status_code == 200


def test_revoked_key_is_401_immediately(tenant_a):
    out = StringIO()
    call_command("api_key_create", tenant_a.slug, stdout=out)
    raw = _last_line(out)
    client = _client(raw)
    assert client.get("/api/v1/schedules").status_code == 200

    call_command("api_key_revoke", raw[:13], stdout=StringIO())

    response = client.get("/api/v1/schedules")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    assert ApiKey.objects.get(prefix=raw[:13]).revoked_at is not None
    with pytest.raises(CommandError):
        call_command("api_key_revoke", raw[:13], stdout=StringIO())


def test_expired_key_is_401(tenant_a):
    out = StringIO()
    call_command("api_key_create", tenant_a.slug, "--expires-in-days", "1", stdout=out)
    raw = _last_line(out)
    assert _client(raw).get("/api/v1/schedules").status_code == 200

    ApiKey.objects.filter(prefix=raw[:13]).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert _client(raw).get("/api/v1/schedules").status_code == 401


def test_idempotency_purge_deletes_only_expired_rows(tenant_a, settings):
    now = timezone.now()
    old = now - timedelta(seconds=settings.TICK_IDEMPOTENCY_TTL_S + 1)
    IdempotencyKey.objects.create(tenant=tenant_a, key="old", request_hash="h", created_at=old)
    IdempotencyKey.objects.create(tenant=tenant_a, key="new", request_hash="h", created_at=now)

    call_command("idempotency_purge", stdout=StringIO())

    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == ["new"]


def test_check_deploy_is_clean_under_production_settings():
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "DJANGO_DEBUG": "0",
        "SECRET_KEY": "p" * 20 + "-production-like-secret-key-with-enough-entropy-9f8e7d6c",
        "ALLOWED_HOSTS": "tick.example.com",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "security." not in output, output


def test_a_viewer_key_reads_every_route_and_changes_nothing(tenant_a):
    from rest_framework.test import APIClient

    from apps.schedules.models import Schedule
    from apps.schedules.tests.factories import make_schedule
    from apps.tenants.models import Membership
    from apps.tenants.services import api_key_create

    sched = make_schedule(tenant_a)
    _, raw = api_key_create(
        actor="test", tenant=tenant_a, name="dashboards", role=Membership.Role.VIEWER
    )
    viewer = APIClient()
    viewer.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

    assert viewer.get("/api/v1/schedules").status_code == 200
    assert viewer.get(f"/api/v1/schedules/{sched.id}").status_code == 200
    body = {"name": "x", "kind": "cron", "expression": "0 * * * *", "time_zone": "UTC",
            "handler": "noop"}  # fmt: skip
    changes = [
        viewer.post("/api/v1/schedules", body, format="json"),
        viewer.post(f"/api/v1/schedules/{sched.id}/pause"),
        viewer.patch(f"/api/v1/schedules/{sched.id}", {"name": "y"}, format="json"),
        viewer.post(f"/api/v1/schedules/{sched.id}/run"),
        viewer.post("/api/v1/signing-secrets/rotate"),
        viewer.post("/api/v1/alert-channels", {"name": "a", "kind": "email",
                                                "target": "a@example.com"}, format="json"),
    ]  # fmt: skip
    assert [r.status_code for r in changes] == [403] * len(changes)
    assert changes[0].json()["error"]["code"] == "permission_denied"
    sched.refresh_from_db()
    assert sched.state == Schedule.State.ACTIVE and sched.name != "y"
    assert Schedule.objects.filter(tenant=tenant_a).count() == 1

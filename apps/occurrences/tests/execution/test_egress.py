"""One total deadline for every outbound HTTP call (egress.py): a receiver that trickles its
answer, a DNS lookup that hangs, and a canceled run all end the call on time."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from django.utils import timezone

from apps.occurrences.execution import ssrf
from apps.occurrences.execution.egress import (
    EgressDeadlineExceeded,
    egress_deadline_s,
    webhook_post,
)
from apps.occurrences.execution.handlers import HandlerContext
from apps.occurrences.execution.webhook import webhook_send
from apps.occurrences.tests.support.slow_loris import slow_loris
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def tenant(settings: Any) -> Tenant:
    settings.TICK_WEBHOOK_ALLOWLIST = ["127.0.0.1/32"]
    return tenant_create(slug="egress", name="Egress")


def _post(tenant: Tenant, port: int, **kwargs: Any) -> int:
    return webhook_post(
        url=f"http://127.0.0.1:{port}/hook", body=b"{}", headers={}, tenant_id=tenant.id,
        message_id=str(uuid.uuid4()), extra_ports=frozenset({port}), **kwargs,
    )  # fmt: skip


def test_a_trickling_receiver_is_cut_off_at_the_total_deadline(tenant, settings):
    settings.TICK_EGRESS_DEADLINE_S = 1.5
    settings.TICK_WEBHOOK_READ_TIMEOUT_S = 30  # each byte comes well within the read timeout
    with slow_loris(drip_s=0.2) as loris:
        started = time.monotonic()
        with pytest.raises(EgressDeadlineExceeded, match="total deadline of 1.5 s"):
            _post(tenant, loris.port)
        took = time.monotonic() - started
        assert loris.closed.wait(5), "the connection was left open"
    assert 1.4 <= took < 2.5


def test_the_webhook_handler_stops_at_its_run_time_limit_and_on_cancel(tenant, settings):
    settings.TICK_EGRESS_DEADLINE_S = 30
    with slow_loris(drip_s=0.2) as loris:
        tenant.webhook_allowed_ports = [loris.port]
        tenant.save(update_fields=["webhook_allowed_ports"])
        ctx = HandlerContext(
            occurrence_id=uuid.uuid4(), schedule_id=uuid.uuid4(), schedule_version=1,
            tenant_id=tenant.id, scheduled_for=timezone.now(), attempt_no=1,
            payload={"url": f"http://127.0.0.1:{loris.port}/"}, timeout_s=1,
        )  # fmt: skip
        started = time.monotonic()
        with pytest.raises(EgressDeadlineExceeded, match="total deadline of 1 s"):
            webhook_send(ctx=ctx)
        assert time.monotonic() - started < 2.0

        cancel = threading.Event()
        threading.Timer(0.5, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(EgressDeadlineExceeded, match="asked to stop"):
            _post(tenant, loris.port, cancel=cancel)
        assert time.monotonic() - started < 1.6


def test_a_hanging_dns_lookup_ends_at_the_deadline(tenant, settings, monkeypatch):
    settings.TICK_EGRESS_DEADLINE_S = 1
    release = threading.Event()

    def hangs(host: str, port: int) -> list[Any]:
        release.wait(10)
        return []

    monkeypatch.setattr(ssrf, "_resolve", hangs)
    started = time.monotonic()
    try:
        with pytest.raises(EgressDeadlineExceeded):
            _post(tenant, 8080)
        assert time.monotonic() - started < 1.8
    finally:
        release.set()


def test_the_deadline_never_exceeds_the_callers_run_limit(settings):
    settings.TICK_EGRESS_DEADLINE_S = 40
    assert egress_deadline_s() == 40
    assert egress_deadline_s(5) == 5
    assert egress_deadline_s(600) == 40
